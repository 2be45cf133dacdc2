#!/usr/bin/env bash
# On the GPU machine (docs/benchmarks.md, "ExecuTorch's Vulkan runtime on an H200"): build ExecuTorch's Vulkan
# runtime from the trimmed source carried in .h200/ (tools/vulkan-runtime/build.sh, 16 jobs, timed), then
# bench/vulkan_h200.py run over the .pte files `bench/vulkan_h200.py prepare` wrote there. If the build does not
# finish in BUILD_LIMIT seconds, the runner built on the 2-core machine (.h200/runner.xz) runs instead, and the
# output says so (SKIP_BUILD=1 goes straight to it). PROFILE=1 then builds the event-tracer variant and records
# per-shader ETDumps (see the end).
set -uo pipefail
OUT="${OUT:-/tmp/h200-out}"; mkdir -p "$OUT"
BUILD_LIMIT="${BUILD_LIMIT:-330}"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
mkdir -p /tmp/icd
# the GLX ICD finds no driver headless; one naming the EGL library does
echo '{"file_format_version":"1.0.0","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.3.0"}}' > /tmp/icd/nvidia_egl.json
export VK_ICD_FILENAMES=/tmp/icd/nvidia_egl.json XDG_RUNTIME_DIR=/tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p /tmp/src && tar -xJf .h200/et-trim.tar.xz -C /tmp/src
echo cff6f4dd32e630945b7188512c1f2b4f102b05ad > /tmp/src/executorch/.executorch-commit
mkdir -p /tmp/shim && cp tools/vulkan-runtime/glslc /tmp/shim/glslc && chmod +x /tmp/shim/glslc .h200/glslang
export EDGEPLUG_GLSLANG_VALIDATOR="$PWD/.h200/glslang" PATH="/tmp/shim:$PATH"
carried() {
  mkdir -p /tmp/carried/cff6f4d/bin && xz -dc .h200/runner.xz > /tmp/carried/cff6f4d/bin/edgeplug-vulkan-runner
  chmod +x /tmp/carried/cff6f4d/bin/edgeplug-vulkan-runner && cp .h200/runtime.json /tmp/carried/cff6f4d/bin/
  export EDGEPLUG_VULKAN_RUNNER=/tmp/carried/cff6f4d/bin/edgeplug-vulkan-runner
  echo "== running the runner built on the 2-core machine"
}
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  carried
elif timeout "$BUILD_LIMIT" env PYTHON=python3 tools/vulkan-runtime/build.sh /tmp/src/executorch --jobs "$(nproc)" \
     --cache /tmp/vkcache > "$OUT/build.log" 2>&1; then
  export EDGEPLUG_VULKAN_RUNNER="$(tail -1 "$OUT/build.log")"
  echo "== ExecuTorch's Vulkan runtime built here in $(( $(date +%s) - start )) s with $(nproc) jobs"
else
  echo "== build stopped after $(( $(date +%s) - start )) s (limit $BUILD_LIMIT s); its last lines:"
  grep -v template_file_path "$OUT/build.log" | tail -12
  carried
fi
PYTHONUNBUFFERED=1 python3 bench/vulkan_h200.py run --dir .h200 --rounds "${ROUNDS:-15}" --json "$OUT/h200.json" \
  2>&1 | tee "$OUT/h200.md"
# PROFILE=1: ExecuTorch built again with its event tracer (build.sh --profile), and each .pte's per-shader GPU
# time recorded into ETDumps under $OUT/etdump (bench/vulkan_profile.py summarize reads them, on a machine with
# executorch)
if [ "${PROFILE:-0}" = 1 ]; then
  start=$(date +%s)
  if timeout "${PROFILE_LIMIT:-300}" env PYTHON=python3 tools/vulkan-runtime/build.sh /tmp/src/executorch --jobs "$(nproc)" \
       --cache /tmp/vkcache --profile > "$OUT/profile-build.log" 2>&1; then
    echo "== ExecuTorch's Vulkan runtime with its event tracer built here in $(( $(date +%s) - start )) s"
    python3 bench/vulkan_h200.py profile --dir .h200 --runner "$(tail -1 "$OUT/profile-build.log")" --out /tmp/etdump 2>&1
    tar -C /tmp -cJf "$OUT/etdump.tar.xz" etdump  # one file back (the device returns a few files only)
  else
    echo "== profile build stopped after $(( $(date +%s) - start )) s; its last lines:"
    grep -v template_file_path "$OUT/profile-build.log" | tail -12
  fi
fi
