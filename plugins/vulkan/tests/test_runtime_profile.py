"""ExecuTorch's own profiler on a vulkan program: a ``build.sh --profile`` runner records each shader
dispatch of the delegate, with the op it belongs to, into an ETDump (bench/vulkan_profile.py reads it).

Skips, saying why, where no profile build is in the cache (CI); the plain runner's refusal runs wherever a
plain runner is built.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug.plugin import RuntimeNotFound

from edgeplug_vulkan_delegate.runtime import RunnerError, RunnerSession, _build_of, cache_dir, device_runtime

pytestmark = pytest.mark.usefixtures("real_vulkan_runtime_env")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def program():
    return edgeplug.lower(Block().eval(), (X,), backend="vulkan")


def _profile_build():
    found = sorted(cache_dir().glob("*-profile/bin/edgeplug-vulkan-runner"))
    if not found:
        pytest.skip(f"no build.sh --profile runner under {cache_dir()} (tools/vulkan-runtime/build.sh SRC --profile)")
    return _build_of(found[-1])


def test_every_dispatch_is_timed_with_its_op(program, tmp_path):
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    with RunnerSession(program.buffer, build=_profile_build()) as s:
        assert s.profiling
        for _ in range(3):
            out, _ = s.run([X])
        size = s.etdump(tmp_path / "run.etdump")
    assert size == (tmp_path / "run.etdump").stat().st_size > 0
    assert out[-1].shape == (4, 32) and torch.isfinite(out[-1]).all()
    runs = [b for b in deserialize_from_etdump_flatcc((tmp_path / "run.etdump").read_bytes()).run_data if b.name == "Execute"]
    assert len(runs) == 3
    ops = []
    for ev in runs[-1].events:
        text = ev.profile_event.delegate_debug_id_str if ev.profile_event else None
        if text and '"dispatch_id"' in text:
            info = json.loads(text)
            assert ev.profile_event.end_time > ev.profile_event.start_time, info
            ops.append((info.get("operator") or {}).get("name"))
    assert {"aten.linear.default", "aten.relu.default", "aten.mul.Tensor"} <= set(ops), ops
    assert None in ops  # the staging copies in and out are dispatches too, with no op


def test_a_plain_runner_says_it_cannot_profile(program, tmp_path):
    try:
        runtime = device_runtime()
    except RuntimeNotFound as exc:
        pytest.skip(str(exc))
    with RunnerSession(program.buffer, build=runtime.build) as s:
        assert not s.profiling
        with pytest.raises(RunnerError, match="build.sh --profile"):
            s.etdump(tmp_path / "x.etdump")
        assert not (tmp_path / "x.etdump").exists()
