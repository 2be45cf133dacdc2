#!/usr/bin/env bash
# Build ExecuTorch's runtime with its Vulkan backend from a source tree the
# user points at, plus edgeplug's small runner over it (runner/). Nothing of
# ExecuTorch's is copied into this repository: the build lives in a cache
# folder outside the checkout.
#
#   tools/vulkan-runtime/build.sh SRC_DIR [--glslang GLSLANG_SRC] [--jobs N] [--cache DIR] [--profile]
#
# --profile: a second build (its own cache folder, <commit>-profile) with
# ExecuTorch's event tracer and devtools: its runner records an ETDump with the
# Vulkan backend's per-shader GPU timestamps (bench/vulkan_profile.py reads it).
# Its timings carry the query pool's cost: take latency from the plain build.
#
# SRC_DIR: an ExecuTorch checkout with the Vulkan submodules (see
# docs/vulkan-runtime.md). ExecuTorch's shaders need a glslc that knows
# GL_EXT_integer_dot_product (Vulkan SDK 1.4.341 or newer); where the glslc on
# PATH does not (Debian 12's), pass --glslang with a glslang checkout
# (tag vulkan-sdk-1.4.350.0 or newer): it is built once into the cache and
# driven through the glslc shim beside this script. Prints the runner's path last; point
# EDGEPLUG_VULKAN_RUNNER at it, or leave it in the default cache folder, where
# edgeplug finds it on its own.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../runtime-runner/common.sh
. "$HERE/../runtime-runner/common.sh"

SRC=""
GLSLANG=""
JOBS="$(nproc)"
CACHE="$(edgeplug_cache_root)/vulkan-runtime"
PROFILE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="$2"; shift 2 ;;
    --glslang) GLSLANG="$2"; shift 2 ;;
    --cache) CACHE="$2"; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$SRC" ] || die "one SRC_DIR, got '$SRC' and '$1'"; SRC="$1"; shift ;;
  esac
done
[ -n "$SRC" ] || die "usage: build.sh SRC_DIR [--glslang GLSLANG_SRC] [--jobs N] [--cache DIR]"
[ -f "$SRC/CMakeLists.txt" ] && [ -d "$SRC/backends/vulkan/runtime" ] \
  || die "'$SRC' is not an ExecuTorch source tree (no backends/vulkan/runtime)"
SRC="$(cd "$SRC" && pwd)"

for sub in Vulkan-Headers/include/vulkan/vulkan.h volk/volk.c VulkanMemoryAllocator/include/vk_mem_alloc.h; do
  [ -f "$SRC/backends/vulkan/third-party/$sub" ] || die "submodule file backends/vulkan/third-party/$sub is missing: run 'git submodule update --init backends/vulkan/third-party/Vulkan-Headers backends/vulkan/third-party/volk backends/vulkan/third-party/VulkanMemoryAllocator third-party/flatbuffers' in $SRC"
done
[ -f "$SRC/third-party/flatbuffers/CMakeLists.txt" ] || die "submodule third-party/flatbuffers is missing: run 'git submodule update --init third-party/flatbuffers' in $SRC"

check_tools

# A glslc that compiles ExecuTorch's integer-dot-product shaders: the one on PATH, or glslang built
# from --glslang behind the shim
probe="$(mktemp -d)"
printf '#version 450\n#extension GL_EXT_integer_dot_product : require\nlayout(local_size_x = 1) in;\nlayout(set = 0, binding = 0) buffer B { int v[]; };\nvoid main() { v[0] = dotPacked4x8AccSatEXT(v[1], v[2], v[3]); }\n' > "$probe/p.comp"
if [ -n "$GLSLANG" ]; then
  [ -f "$GLSLANG/CMakeLists.txt" ] && [ -d "$GLSLANG/glslang" ] || die "'$GLSLANG' is not a glslang source tree"
  GL_OUT="$CACHE/glslang"
  if [ ! -x "$GL_OUT/install/bin/glslangValidator" ]; then
    echo "== glslang from $GLSLANG -> $GL_OUT"
    mkdir -p "$GL_OUT"  # its log lies beside it: a fresh machine has no cache folder yet
    cmake -S "$GLSLANG" -B "$GL_OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENABLE_OPT=OFF \
      -DGLSLANG_TESTS=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_INSTALL_PREFIX="$GL_OUT/install" > "$GL_OUT.log" 2>&1 \
      && cmake --build "$GL_OUT/build" -j "$JOBS" --target install >> "$GL_OUT.log" 2>&1 \
      || { tail -20 "$GL_OUT.log" >&2 || true; die "glslang build failed (log: $GL_OUT.log)"; }
  fi
  export EDGEPLUG_GLSLANG_VALIDATOR="$GL_OUT/install/bin/glslangValidator"
  mkdir -p "$probe/bin" && cp "$HERE/glslc" "$probe/bin/glslc"
  SHIM_BIN="$CACHE/glslc-shim"; mkdir -p "$SHIM_BIN"; cp "$HERE/glslc" "$SHIM_BIN/glslc"
  export PATH="$SHIM_BIN:$PATH"
fi
glslc -fshader-stage=compute "$probe/p.comp" -o "$probe/p.spv" --target-env=vulkan1.1 >/dev/null 2>&1 \
  || die "$(command -v glslc) ($(glslc --version 2>/dev/null | head -1)) cannot compile GL_EXT_integer_dot_product, which ExecuTorch's shaders use: pass --glslang GLSLANG_SRC (a checkout of https://github.com/KhronosGroup/glslang at vulkan-sdk-1.4.350.0 or newer), or put a Vulkan SDK 1.4.341+ glslc first on PATH"
rm -rf "$probe"

PY="$(python_for_codegen)"
COMMIT="$(source_commit "$SRC")"
SHORT="${COMMIT:0:7}"
OUT="$CACHE/$SHORT"
TRACE=(-DEXECUTORCH_BUILD_DEVTOOLS=OFF)
if [ "$PROFILE" = 1 ]; then
  OUT="$CACHE/$SHORT-profile"
  [ -f "$SRC/third-party/flatcc/CMakeLists.txt" ] || die "--profile needs the submodule third-party/flatcc (ExecuTorch's ETDump writer): run 'git submodule update --init third-party/flatcc' in $SRC"
  TRACE=(-DEXECUTORCH_BUILD_DEVTOOLS=ON -DEXECUTORCH_ENABLE_EVENT_TRACER=ON)
fi
mkdir -p "$OUT"
echo "== ExecuTorch $SHORT from $SRC -> $OUT ($JOBS jobs)"

start=$(date +%s)
configure_and_build_executorch "$SRC" "$OUT" "$JOBS" "$PY" \
  -DEXECUTORCH_BUILD_VULKAN=ON \
  -DGLSLC_PATH="$(command -v glslc)" \
  "${TRACE[@]}" \
  -DEXECUTORCH_VULKAN_SHADER_COMPILE_NTHREADS="$JOBS"
build_runner "$HERE/runner" "$SRC" "$OUT" "$JOBS" edgeplug-vulkan-runner
end=$(date +%s)

cat > "$OUT/bin/runtime.json" <<JSON
{"executorch_commit": "$COMMIT", "built_seconds": $((end - start)), "jobs": $JOBS, "glslc": "$(glslc --version 2>/dev/null | head -1)", "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "profile": $([ "$PROFILE" = 1 ] && echo true || echo false)}
JSON
echo "== built in $((end - start)) s with $JOBS jobs"
echo "$OUT/bin/edgeplug-vulkan-runner"
