#!/usr/bin/env bash
# Install the core and the xnnpack plugin alone into a fresh venv (reusing the
# wheels already downloaded) and check that exactly that backend is visible;
# then the same for the coreml plugin alone (xnnpack uninstalled), then webgpu
# with only the library it requires beside it (edgeplug-vulkan-delegate, no edgeplug-vulkan).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q . plugins/xnnpack
got=$("$venv/bin/python" -c 'import edgeplug; print(",".join(edgeplug.backends()))')
echo "backends in a venv with only edgeplug-xnnpack: $got"
test "$got" = "xnnpack"
if "$venv/bin/python" -c 'import edgeplug_vulkan' 2>/dev/null; then
  echo "edgeplug_vulkan must not be installed by edgeplug-xnnpack" >&2; exit 1
fi
"$venv/bin/edgeplug" backends
"$venv/bin/pip" uninstall -q -y edgeplug-xnnpack
"$venv/bin/pip" install -q plugins/coreml
got=$("$venv/bin/python" -c 'import edgeplug; print(",".join(edgeplug.backends()))')
echo "backends in a venv with only edgeplug-coreml: $got"
test "$got" = "coreml"
# coremltools comes with executorch, so Core ML serializes in a plain install
"$venv/bin/python" -c 'import edgeplug, sys; a = edgeplug.get_backend("coreml").availability(); sys.exit(0 if a.ok else f"coreml unavailable alone: {a.reason}")'
"$venv/bin/edgeplug" backends
"$venv/bin/pip" uninstall -q -y edgeplug-coreml
"$venv/bin/pip" install -q plugins/vulkan_delegate plugins/webgpu
got=$("$venv/bin/python" -c 'import edgeplug; print(",".join(edgeplug.backends()))')
echo "backends in a venv with only edgeplug-webgpu (and edgeplug-vulkan-delegate): $got"
test "$got" = "webgpu"
if "$venv/bin/python" -c 'import edgeplug_vulkan' 2>/dev/null; then
  echo "edgeplug_vulkan must not be installed by edgeplug-webgpu" >&2; exit 1
fi
# it works alone: an RMSNorm lowered for webgpu (et_vk.rms_norm fused) and verified with its WGSL kernel
XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} "$venv/bin/python" - <<'PY'
import torch
import edgeplug

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.RMSNorm(16)).eval()
result = edgeplug.lower(model, (torch.randn(4, 16),), "webgpu", verify=True)
fused = [f for f in result.report.fusions if f.outcome == "fused"]
assert fused, f"no fused norm: {result.report.fusions}"
v = result.report.verification
assert v is not None and v.method == "kernels" and v.passed, v
assert "et_vk.rms_norm.default x1 on the adapter" in v.note, v.note
print(f"webgpu alone: {len(fused)} fused norm, verified with its kernel on {v.adapter}, max |diff| {v.max_abs_diff:.2e}")
PY
"$venv/bin/edgeplug" backends
rm -rf "$(dirname "$venv")"
echo "single-plugin install: OK"
