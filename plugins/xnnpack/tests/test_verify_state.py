"""Verification of a program that keeps state (issue 47): a model whose call changes a buffer (a KV cache)
while the exported program never writes it fails verification, naming the buffer; one whose program writes
its cache passes. Before, the example call agreed, the decode steps never ran (the program "keeps no state")
and --verify passed."""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _Cache(torch.nn.Module):
    """Reads its cache, then writes this call's value into it; ``hidden`` writes only outside export."""

    def __init__(self, hidden: bool) -> None:
        super().__init__()
        self.hidden = hidden
        self.register_buffer("cache", torch.zeros(1, 8, 4))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        out = h + self.cache.sum(1, keepdim=True)
        if not (self.hidden and torch.compiler.is_exporting()):
            self.cache.index_copy_(1, pos, h)
        return out


def _inputs() -> tuple:
    return torch.randn(1, 1, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0])


@pytest.mark.parametrize("hidden", [True, False], ids=["write-not-exported", "write-exported"])
def test_a_cache_the_program_never_writes_fails_verification(hidden):
    torch.manual_seed(0)
    result = edgeplug.lower(_Cache(hidden).eval(), _inputs(), "xnnpack", verify=True)
    v = result.report.verification
    stale = [o for o in v.outputs if o.name == "buffer 'cache' (changed by the model's call)"]
    if not hidden:  # the program writes its cache: prefill and decode steps agree with eager
        assert v.passed and not stale, v.failures()
        return
    assert not v.passed and len(stale) == 1
    (line,) = [f for f in v.failures() if "'cache'" in f]
    assert "never writes it" in line and "torch.export did not capture the write" in line
    with pytest.raises(edgeplug.VerificationError):
        result.save("unused.pte")


def test_the_cli_exits_3_and_writes_nothing(cli, tmp_path):
    model = tmp_path / "m.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(s):\n"
        "        super().__init__(); s.register_buffer('cache', torch.zeros(1, 8, 4)); s.lin = torch.nn.Linear(4, 4)\n"
        "    def forward(s, x, pos):\n"
        "        h = s.lin(x); out = h + s.cache.sum(1, keepdim=True)\n"
        "        if not torch.compiler.is_exporting():\n"
        "            s.cache[:, pos] = h\n"
        "        return out\n"
        "def build():\n"
        "    return M().eval(), (torch.randn(1, 1, 4), torch.tensor([0]))\n"
    )
    code, _, stderr = cli("lower", f"{model}:build", "-b", "xnnpack", "--verify", "-q", "-o", tmp_path / "m.pte")
    assert code == 3
    assert "buffer 'cache'" in stderr and "never writes it" in stderr
    assert not (tmp_path / "m.pte").exists()
