#!/usr/bin/env bash
# On the GPU machine (docs/benchmarks.md, "ExecuTorch's WebGPU runtime"): edgeplug's .pte against stock's
# (WebGPUPartitioner) in ExecuTorch's WebGPU runtime on wgpu-native, on the NVIDIA Vulkan driver, in one run.
# Carried in .h200/: what `bench/vulkan_h200.py prepare --backend webgpu --out .h200` wrote, plus
# webgpu-runner.xz (edgeplug-webgpu-runner built here by tools/webgpu-runtime/build.sh), its runtime.json and
# registered_ops.json, and libwgpu_native.so.xz (the wgpu-native it was built on, from the build folder's dawn/lib); and .gl/ (the
# Vulkan loader's .debs, docs/benchmarks.md). Nothing is built there.
#   device: run(command="bash bench/webgpu_h200.sh", carry=[".gl", ".h200"])
set -uo pipefail
OUT="${OUT:-/tmp/h200-out}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
mkdir -p /tmp/icd
# the GLX ICD finds no driver headless; one naming the EGL library does
echo '{"file_format_version":"1.0.0","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.3.0"}}' > /tmp/icd/nvidia_egl.json
export VK_ICD_FILENAMES=/tmp/icd/nvidia_egl.json XDG_RUNTIME_DIR=/tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
RUN=/tmp/webgpu-runtime/carried/bin
mkdir -p "$RUN" /tmp/webgpu-runtime/lib
xz -dc .h200/webgpu-runner.xz > "$RUN/edgeplug-webgpu-runner" && chmod +x "$RUN/edgeplug-webgpu-runner"
xz -dc .h200/libwgpu_native.so.xz > /tmp/webgpu-runtime/lib/libwgpu_native.so
cp .h200/runtime.json "$RUN/"
[ -f .h200/registered_ops.json ] && cp .h200/registered_ops.json "$RUN/"  # the build's op list, as build.sh left it
export LD_LIBRARY_PATH="/tmp/webgpu-runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export EDGEPLUG_WEBGPU_RUNNER="$RUN/edgeplug-webgpu-runner"
PYTHONUNBUFFERED=1 python3 bench/vulkan_h200.py run --backend webgpu --dir .h200 --rounds "${ROUNDS:-15}" \
  --json "$OUT/h200.json" 2>&1 | tee "$OUT/h200.md"
