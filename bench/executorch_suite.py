"""ExecuTorch's backend test suite (operators), through edgeplug's lowering and through stock's flow, side by side.

    python bench/executorch_suite.py --backend xnnpack [--ops adaptive_maxpool2d,lstm,...] [--json out.json]

The same as ``python -m edgeplug.testing.executorch_suite`` (the command any plugin author runs, every option
of it taken here), with this benchmark's representative set of operator files as the default ``--ops``
(``--ops ''`` for every file). Each test runs once per flow, in one process, the flows alternating test by test;
it prints the Markdown table docs/benchmarks.md keeps and, per test, where the flows differ.

``--stock-patterns-cached`` (vulkan and webgpu, whose stock partitioner is ExecuTorch's ``VulkanPartitioner``): the
whole run inside ``pattern_graphs_traced_once``, the fix edgeplug's lowering applies to itself, so stock's flow
traces ExecuTorch's Vulkan pattern graphs once per process instead of twice per case (8 to 13 s each here;
docs/benchmarks.md). It changes stock's time, not what stock lowers or delegates: the graphs are the same. The
seconds of such a run are no comparison of the two flows (they share the traced graphs); bench/vulkan_lowering_time.py
is.
"""

from __future__ import annotations

import sys

#: a representative set: the operators issues 45 and 49 name, and common ones of each kind (lstm is left out for
#: time: its 11 tests take about 30 minutes for both flows on a loaded 2-core machine; pass --ops lstm for it)
DEFAULT_OPS = (
    "adaptive_maxpool1d,adaptive_maxpool2d,adaptive_maxpool3d,embedding_bag,median,round,"
    "linear,conv2d,add,upsample_bilinear2d,index_put,masked_fill"
)


def main(argv: list[str]) -> int:
    import contextlib

    from edgeplug.testing.executorch_suite import run_command as suite

    if not any(a == "--ops" or a.startswith("--ops=") for a in argv):
        argv = [*argv, "--ops", DEFAULT_OPS]
    scope = contextlib.nullcontext()
    if "--stock-patterns-cached" in argv:
        argv = [a for a in argv if a != "--stock-patterns-cached"]
        # the vulkan family's patch, taken from its plugin: this benchmark names it, the core does not
        from edgeplug_vulkan_delegate._executorch import pattern_graphs_traced_once

        scope = pattern_graphs_traced_once()
    with scope:
        return suite(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
