"""Compile every WGSL shader ExecuTorch's WebGPU backend embeds with wgpu-native's compiler (naga), the one
the backend meets at run time when built on wgpu-native (tools/webgpu-runtime/build.sh), and list those it
refuses, each with naga's own words.

    python tools/webgpu-runtime/check_wgsl.py EXECUTORCH_SRC [--json OUT.json]

The shaders are read from the tree's ``backends/webgpu/runtime/ops/*/*_wgsl.h`` (the generated headers the
backend compiles in: one raw string per shader variant). The device asks for shader-f16 where the adapter
offers it, as the backend does. Exit status 0 when naga takes every shader, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_SHADER = re.compile(r'inline constexpr const char\* (k\w+) = R"\((.*?)\)";', re.S)


def embedded_shaders(src: Path) -> list[tuple[str, str, str]]:
    """(header path relative to the tree, constant name, WGSL text) for each embedded shader."""
    found = []
    for header in sorted((src / "backends/webgpu/runtime/ops").glob("*/*_wgsl.h")):
        for name, text in _SHADER.findall(header.read_text()):
            found.append((str(header.relative_to(src)), name, text))
    return found


def compile_all(shaders: list[tuple[str, str, str]]) -> tuple[str, list[dict]]:
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    features = [f for f in ("shader-f16",) if f in adapter.features]
    device = adapter.request_device_sync(required_features=features)
    refused = []
    for header, name, text in shaders:
        try:
            device.create_shader_module(code=text)
        except Exception as exc:  # wgpu raises GPUValidationError with naga's message; keep its words
            words = " ".join(str(exc).split())
            refused.append({"header": header, "shader": name, "naga": words})
    info = adapter.info
    return f"{info.get('device', '?')} via {info.get('backend_type', '?')}", refused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="an ExecuTorch source tree with backends/webgpu")
    ap.add_argument("--json", type=Path, help="write the result here as JSON")
    args = ap.parse_args(argv)
    shaders = embedded_shaders(args.src)
    if not shaders:
        print(f"check_wgsl.py: error: no embedded WGSL under {args.src}/backends/webgpu/runtime/ops", file=sys.stderr)
        return 2
    adapter, refused = compile_all(shaders)
    print(f"{len(shaders)} shaders, {len(shaders) - len(refused)} compiled by naga on {adapter}, {len(refused)} refused")
    for r in refused:
        print(f"  {r['shader']} ({r['header']}): {r['naga'][:400]}")
    if args.json:
        args.json.write_text(json.dumps({"adapter": adapter, "shaders": len(shaders), "refused": refused}, indent=1))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
