#!/usr/bin/env bash
# Build ExecuTorch's runtime with its WebGPU backend on wgpu-native (the library
# inside the `wgpu` wheel) instead of Dawn, plus edgeplug's runner over it.
# Nothing of ExecuTorch's is copied into this repository or patched: the build
# lives in a cache folder outside the checkout, and what stands in for Dawn
# (dawn/DawnConfig.cmake and the compatibility header dawn/webgpu.h, with
# wgpu-native's library and headers beside them) is copied into it.
#
#   tools/webgpu-runtime/build.sh SRC_DIR [--wgpu DIR] [--jobs N] [--cache DIR] [--profile]
#
# SRC_DIR: an ExecuTorch checkout with the submodules docs/webgpu-runtime.md lists.
# --wgpu DIR: wgpu-native's library and headers (libwgpu_native-release.so,
#   webgpu.h, wgpu.h); by default the `wgpu` wheel's resources folder in $PYTHON.
# --profile: a second build (<commit>-profile) with the backend's GPU timestamp
#   queries (EXECUTORCH_BUILD_WEBGPU_PROFILING).
# Beside the runner: runtime.json (the commit built) and registered_ops.json (the
# ops the runtime registers, which the webgpu backend then delegates: registered_ops.py).
# Prints the runner's path last; point EDGEPLUG_WEBGPU_RUNNER at it, or leave it
# in the default cache folder, where edgeplug finds it on its own.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../runtime-runner/common.sh
. "$HERE/../runtime-runner/common.sh"

SRC=""
WGPU=""
JOBS="$(nproc)"
CACHE="$(edgeplug_cache_root)/webgpu-runtime"
PROFILE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="$2"; shift 2 ;;
    --wgpu) WGPU="$2"; shift 2 ;;
    --cache) CACHE="$2"; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$SRC" ] || die "one SRC_DIR, got '$SRC' and '$1'"; SRC="$1"; shift ;;
  esac
done
[ -n "$SRC" ] || die "usage: build.sh SRC_DIR [--wgpu DIR] [--jobs N] [--cache DIR] [--profile]"
[ -f "$SRC/CMakeLists.txt" ] && [ -d "$SRC/backends/webgpu/runtime" ] \
  || die "'$SRC' is not an ExecuTorch source tree with the WebGPU backend (no backends/webgpu/runtime; it came in 2026)"
SRC="$(cd "$SRC" && pwd)"
# backends/webgpu configures backends/vulkan for its schema, which checks these submodules exist
check_submodules "$SRC" third-party/flatbuffers/CMakeLists.txt third-party/json/single_include/nlohmann/json.hpp \
  backends/vulkan/third-party/Vulkan-Headers/include/vulkan/vulkan.h backends/vulkan/third-party/volk/volk.c \
  backends/vulkan/third-party/VulkanMemoryAllocator/include/vk_mem_alloc.h
check_tools
PY="$(python_for_codegen)"
"$PY" -c 'import yaml' 2>/dev/null || die "$PY cannot import yaml (the WebGPU backend's WGSL header check needs it)"

if [ -z "$WGPU" ]; then
  WGPU="$("$PY" -c 'import os, wgpu; print(os.path.join(os.path.dirname(wgpu.__file__), "resources"))' 2>/dev/null)" \
    || die "$PY has no 'wgpu' package, whose wheel carries wgpu-native: pip install wgpu, or pass --wgpu DIR"
fi
for f in libwgpu_native-release.so webgpu.h wgpu.h; do
  [ -f "$WGPU/$f" ] || die "'$WGPU' has no $f: pass --wgpu with the folder holding wgpu-native's library and headers"
done

COMMIT="$(source_commit "$SRC")"
SHORT="${COMMIT:0:7}"
OUT="$CACHE/$SHORT"
EXTRA=()
if [ "$PROFILE" = 1 ]; then
  OUT="$CACHE/$SHORT-profile"
  EXTRA=(-DEXECUTORCH_BUILD_WEBGPU_PROFILING=ON)
fi
mkdir -p "$OUT"

# What stands in for Dawn, in the build folder: wgpu-native's library and headers, our
# package config and compatibility header
# (each copied only when it changed: a fresh header would rebuild every op of the backend)
DAWN="$OUT/dawn"
mkdir -p "$DAWN/lib" "$DAWN/include/webgpu" "$DAWN/include/wgpu-native"
put() { cmp -s "$1" "$2" || cp "$1" "$2"; }
put "$WGPU/libwgpu_native-release.so" "$DAWN/lib/libwgpu_native.so"
put "$WGPU/webgpu.h" "$DAWN/include/wgpu-native/webgpu.h"
put "$WGPU/wgpu.h" "$DAWN/include/wgpu-native/wgpu.h"
put "$HERE/dawn/webgpu.h" "$DAWN/include/webgpu/webgpu.h"
put "$HERE/dawn/DawnConfig.cmake" "$DAWN/DawnConfig.cmake"

echo "== ExecuTorch $SHORT from $SRC with WebGPU on wgpu-native from $WGPU -> $OUT ($JOBS jobs)"
start=$(date +%s)
configure_and_build_executorch "$SRC" "$OUT" "$JOBS" "$PY" \
  -DEXECUTORCH_BUILD_WEBGPU=ON -DDawn_DIR="$DAWN" "${EXTRA[@]}"
# backends/webgpu configures backends/vulkan for the delegate's schema alone (vulkan_backend is not built: it
# would need glslc), yet vulkan's install() still lists libvulkan_backend.a in ExecuTorch's exported targets,
# whose package config then refuses to load. An empty archive in its place lets the runner find the package;
# the runner does not link it.
[ -e "$OUT/install/lib/libvulkan_backend.a" ] || ar rc "$OUT/install/lib/libvulkan_backend.a"
build_runner "$HERE/runner" "$SRC" "$OUT" "$JOBS" edgeplug-webgpu-runner -DDawn_DIR="$DAWN" \
  $([ "$PROFILE" = 1 ] && echo -DEDGEPLUG_WEBGPU_PROFILING=ON)
end=$(date +%s)

cat > "$OUT/bin/runtime.json" <<JSON
{"executorch_commit": "$COMMIT", "built_seconds": $((end - start)), "jobs": $JOBS, "wgpu_native": "$WGPU", "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "profile": $([ "$PROFILE" = 1 ] && echo true || echo false)}
JSON
# the ops this runtime registers, read from the sources it compiled, for edgeplug's webgpu support check
"$PY" "$HERE/registered_ops.py" "$OUT" --commit "$COMMIT" || die "could not record the ops the runtime registers"
echo "== built in $((end - start)) s with $JOBS jobs"
echo "$OUT/bin/edgeplug-webgpu-runner"
