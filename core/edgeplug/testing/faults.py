"""Test plugins that inject faults, to show that a backend's checks catch them.

``CorruptWeight`` is what the conformance suite's
``test_verification_fails_on_a_corrupted_weight`` registers: a verification
that cannot fail is a defect. Register it for one test with the
``edgeplug_register`` fixture.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

import edgeplug

__all__ = ["CorruptWeight"]


class CorruptWeight:
    """A plugin adding an export-stage pass to each of ``backends`` that corrupts the weight of the ``mlp``
    example's first linear layer (the state-dict entry ending in ``weight_suffix``).

    ``how`` is ``"nan"`` (one element becomes NaN), ``"scale"`` (the weight times 1.01, replaced by a new
    tensor) or ``"inplace"`` (the same scaling written into the caller's tensor, as a careless pass would).
    """

    def __init__(self, backends: tuple[str, ...], how: str, weight_suffix: str = "fc1.weight") -> None:
        if how not in ("nan", "scale", "inplace"):
            raise ValueError(f"CorruptWeight(how={how!r}): how is 'nan', 'scale' or 'inplace'")
        self.backends, self.how, self.weight_suffix = tuple(backends), how, weight_suffix

    def corrupt(self, ep: Any) -> Any:
        keys = [k for k in ep.state_dict if k.endswith(self.weight_suffix)]
        if not keys:
            raise KeyError(f"CorruptWeight: no weight ending in {self.weight_suffix!r} in {sorted(ep.state_dict)}")
        key = keys[0]
        w = ep.state_dict[key].detach().clone()
        if self.how == "nan":
            w[0, 0] = float("nan")
        else:
            w = w * 1.01
        if self.how == "inplace":
            ep.state_dict[key].data.copy_(w)
        else:
            ep.state_dict[key] = torch.nn.Parameter(w, requires_grad=False)
        return ep

    @edgeplug.hookimpl
    def edgeplug_passes(self) -> Iterator[Any]:
        for backend in self.backends:
            yield edgeplug.PassSpec(backend=backend, stage="export", name=f"corrupt-{self.how}", fn=self.corrupt)
