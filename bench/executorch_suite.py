"""ExecuTorch's backend test suite (operators), through edgeplug's lowering and through stock's flow, side by side.

    python bench/executorch_suite.py --backend xnnpack [--ops adaptive_maxpool2d,lstm,...] [--json out.json]

The same as ``python -m edgeplug.testing.executorch_suite`` (the command any plugin author runs, every option
of it taken here), with this benchmark's representative set of operator files as the default ``--ops``
(``--ops ''`` for every file). Each test runs once per flow, in one process, the flows alternating test by test;
it prints the Markdown table docs/benchmarks.md keeps and, per test, where the flows differ.
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
    from edgeplug.testing.executorch_suite import run_command as suite

    if not any(a == "--ops" or a.startswith("--ops=") for a in argv):
        argv = [*argv, "--ops", DEFAULT_OPS]
    return suite(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
