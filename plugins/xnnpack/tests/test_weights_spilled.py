"""A lowering never holds its serialized weights in memory (issue 27): each weight XNNPACK's preprocess
serializes, and each one the emitter serializes for the CPU (an embedding), waits in a temporary file until
the .pte (or .ptd) is written. Python's own allocations (tracemalloc) hold serialized bytes; torch's tensors
are not in them, so the peak of those allocations during one lowering is what the serialized weights cost."""

from __future__ import annotations

import tracemalloc

import pytest
import torch

import edgeplug

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class EmbedThenLinears(torch.nn.Module):
    """An embedding (left on the CPU by XNNPACK) and eight linears (delegated): 4 MiB each, 36 MiB of weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(1024, 1024)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(1024, 1024, bias=False) for _ in range(8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for lin in self.linears:
            x = torch.relu(lin(x))
        return x


@pytest.fixture(scope="module")
def model():
    m, args = EmbedThenLinears().eval(), (torch.arange(8).reshape(1, 8),)
    # a first lowering imports and caches what every later one reuses: not the weights' cost
    edgeplug.lower(m, args, "xnnpack", dry_run=True)
    return m, args


def _weight_bytes(m: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def _lower_traced(m, args, **options):
    tracemalloc.start()
    try:
        result = edgeplug.lower(m, args, "xnnpack", **options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def test_serialized_weights_wait_on_disk_not_in_memory(model, tmp_path):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    m, args = model
    weights = _weight_bytes(m)
    result, peak = _lower_traced(m, args)
    # held in memory, the serialized weights alone would be 1x (36 MiB); what is left is one weight (4 MiB)
    # at a time, serialized twice by the preprocess (its hash, then its named data), and the graphs
    assert peak < 0.5 * weights, f"{peak / 2**20:.1f} MiB of Python allocations for {weights / 2**20:.0f} MiB of weights"
    pte = result.save(tmp_path / "m.pte")
    assert [p.name for p in tmp_path.iterdir()] == ["m.pte"]
    assert weights <= pte.stat().st_size < 1.1 * weights
    assert result.report.output_bytes == pte.stat().st_size
    # the weights read back from the temporary files are the model's: the runtime computes the same
    out = _load_for_executorch(str(pte)).forward(list(args))[0]
    assert torch.allclose(out, m(*args), atol=1e-4)


def test_the_temporary_files_go_when_the_result_does(model, tmp_path, monkeypatch):
    import gc

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    m, args = model
    result = edgeplug.lower(m, args, "xnnpack")
    spilled = sorted(p.name for p in tmp_path.glob("edgeplug-weight-*"))
    assert len(spilled) == 9, spilled  # eight linears and the embedding
    result.save(tmp_path / "m.pte")
    assert sorted(tmp_path.glob("edgeplug-weight-*")) == sorted(tmp_path / n for n in spilled)  # saving keeps them
    del result
    gc.collect()
    assert not list(tmp_path.glob("edgeplug-weight-*"))
