"""The eager reference: what the model computes on copies of itself and its inputs.

``EagerModel`` runs the model (or an ExportedProgram's module) so that the caller's
model, buffers and inputs are never changed; a call gives a ``Reference`` (outputs,
inputs and buffers after the call). ``lower`` takes one before exporting, ``quantize``
one of the float model, and verification compares a lowered program with it.
"""

from __future__ import annotations

import copy
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from edgeplug._errors import LoweringError
from edgeplug._failures import first_line
from edgeplug._inputs import ExampleInputs


@dataclass
class Reference:
    """What eager computed, on copies: outputs, and the inputs and buffers after the call."""

    outputs: list[torch.Tensor]
    #: the inputs after the call, flattened in the program's input order (a model may change its inputs in place)
    inputs_after: list[Any] = field(default_factory=list)
    #: buffer name -> value after the call
    buffers_after: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the eager model the outputs came from, to run further calls from its first state (decode steps)
    model: Optional["EagerModel"] = field(default=None, repr=False)
    #: the inputs after the call as the caller structured them (``inputs_after`` is flattened from this)
    inputs_tree: Optional[ExampleInputs] = field(default=None, repr=False)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class EagerModel:
    """The model as verification runs it eagerly, on copies the caller does not hold.

    Parameters are shared with the caller's model (calls run under ``no_grad`` and
    only read them); every buffer is a detached copy, since a call may write it (KV
    caches, counters), and a buffer that is a non-leaf tensor with a grad history
    (a cache written under grad mode) copies where ``copy.deepcopy`` refuses.
    ``reset()`` puts the buffers back to their first values, so a sequence of
    calls (prefill, then decode steps) can be replayed.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.initial = {name: b.detach().clone() for name, b in module.named_buffers()}

    @classmethod
    def of_module(cls, model: torch.nn.Module) -> "EagerModel":
        # deepcopy's memo maps each parameter to itself and each buffer to its copy: anything else
        # holding a buffer (a cache object beside the module) gets the same copy
        memo: dict[int, Any] = {id(p): p for p in model.parameters()}
        for b in model.buffers():
            memo.setdefault(id(b), b.detach().clone())
        return cls(copy.deepcopy(model, memo))

    @classmethod
    def of_program(cls, ep: ExportedProgram) -> "EagerModel":
        return cls(_reference_module(ep))

    def reset(self) -> None:
        with torch.no_grad():
            for name, b in self.module.named_buffers():
                if name in self.initial:
                    b.copy_(self.initial[name])

    def __call__(self, given: ExampleInputs) -> Reference:
        """Run one call on a copy of ``given``; buffers keep what the call wrote."""
        args, kwargs = copy.deepcopy((given.args, given.kwargs))
        with torch.no_grad():
            out = self.module(*args, **kwargs)
        return Reference(
            outputs=[t.detach() for t in _tensors(out)],
            inputs_after=pytree.tree_leaves((args, kwargs)),
            buffers_after={k: v.detach().clone() for k, v in self.module.named_buffers()},
            model=self,
            inputs_tree=ExampleInputs(args, kwargs),
        )


def _reference_module(ep: ExportedProgram) -> torch.nn.Module:
    """``ep.module()`` with its buffers copied (the call may write them) and its parameters shared
    with ``ep`` (the call only reads them): eager needs no second copy of the weights."""
    module = ep.module()
    copies: dict[int, torch.Tensor] = {}  # one copy per tensor: buffers that alias stay aliased
    for name, buf in list(module.named_buffers(remove_duplicate=False)):
        owner, _, leaf = name.rpartition(".")
        new = copies.setdefault(id(buf), buf.detach().clone())
        module.get_submodule(owner)._buffers[leaf] = new
    return module


def raised_in_user_code(exc: BaseException) -> Optional[Any]:
    """The innermost traceback frame of ``exc`` outside torch and edgeplug (the model's code), or None."""
    skip = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.abspath(__file__)))
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename) if not frame.filename.startswith("<") else None
        if path is not None and not path.startswith(skip):
            return frame
    return None


def eager_model(source: torch.nn.Module | ExportedProgram) -> EagerModel:
    """``source`` as ``lower`` runs it eagerly, on copies; a model that cannot be copied is a ``LoweringError``."""
    if isinstance(source, ExportedProgram):
        return EagerModel.of_program(source)
    try:
        return EagerModel.of_module(source)
    except Exception as exc:
        raise LoweringError(
            f"cannot copy the model's buffers for its eager run ({type(exc).__name__}: {exc}); edgeplug runs "
            "the model on copies so that your model is left as it was. Make the model deep-copyable (copy.deepcopy)"
        ) from exc


def run_eager(eager: EagerModel, inputs: ExampleInputs) -> Reference:
    """One eager call on ``inputs``: what verification compares with; a call that raises is a ``LoweringError`` saying where."""
    try:
        return eager(inputs)
    except Exception as exc:
        cause = first_line(exc)
        why = "edgeplug runs it once before lowering: its outputs are what --verify compares with"
        frame = raised_in_user_code(exc)
        if frame is not None:  # the model's own code raised: say where
            raise LoweringError(
                f"running the model eagerly on its example inputs failed in {frame.name}, "
                f"{frame.filename}:{frame.lineno}: {cause}. The model raised there: fix it, or give it the "
                f"inputs it takes ({why})"
            ) from exc
        raise LoweringError(
            f"running the model eagerly on its example inputs failed: {cause}. Check that the example "
            f"inputs are the ones the model (or program) takes ({why})"
        ) from exc

