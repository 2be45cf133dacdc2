# Shell helpers the runtime builds share (tools/vulkan-runtime/build.sh and
# tools/webgpu-runtime/build.sh source this): checks, the commit of a source tree,
# ExecuTorch's CMake build with the parts every runner links, and the runner's build.

die() { echo "build.sh: error: $*" >&2; exit 2; }

edgeplug_cache_root() {
  echo "${EDGEPLUG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeplug}"
}

# check_submodules SRC PATH...: each PATH (a file a submodule brings) is in SRC
check_submodules() {
  local src="$1"; shift
  local missing=()
  for f in "$@"; do [ -f "$src/$f" ] || missing+=("$f"); done
  [ ${#missing[@]} -eq 0 ] || die "the ExecuTorch tree '$src' lacks ${missing[*]}: fetch those submodules at the commits the tree pins (git submodule update --init PATH; docs/webgpu-runtime.md and docs/vulkan-runtime.md list them)"
}

check_tools() {
  local missing=""
  for tool in cmake ninja g++; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
  [ -z "$missing" ] || die "missing tools:$missing (Debian: apt-get install cmake ninja-build g++ libvulkan1 mesa-vulkan-drivers)"
}

# The Python ExecuTorch's kernel-registration codegen runs (it imports torchgen and yaml)
python_for_codegen() {
  local py="${PYTHON:-python3}"
  "$py" -c 'import torchgen, yaml' 2>/dev/null \
    || die "$py cannot import torchgen and yaml (ExecuTorch's kernel registration codegen needs them): set PYTHON to the venv holding torch, e.g. PYTHON=.venv/bin/python"
  realpath -s "$(command -v "$py")"
}

# The commit names the build: a git checkout's HEAD, or the first word of
# SRC/.executorch-commit for a tree assembled from archives.
source_commit() {
  local src="$1" commit
  if commit="$(git -C "$src" rev-parse HEAD 2>/dev/null)"; then echo "$commit";
  elif [ -f "$src/.executorch-commit" ]; then awk '{print $1; exit}' "$src/.executorch-commit";
  else die "cannot tell which ExecuTorch commit '$src' is: not a git checkout and no .executorch-commit file"; fi
}

# configure_and_build_executorch SRC OUT JOBS PYTHON [CMAKE_ARGS...]: the runtime, the module,
# data-loader, tensor and named-data extensions, the portable and quantized CPU kernels (for
# what stays outside a delegate) and whatever backend CMAKE_ARGS turn on, installed into OUT/install
configure_and_build_executorch() {
  local src="$1" out="$2" jobs="$3" py="$4"; shift 4
  cmake -S "$src" -B "$out/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$out/install" \
    -DPYTHON_EXECUTABLE="$py" \
    -DEXECUTORCH_BUILD_EXTENSION_MODULE=ON \
    -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON \
    -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON \
    -DEXECUTORCH_BUILD_EXTENSION_NAMED_DATA_MAP=ON \
    -DEXECUTORCH_BUILD_EXTENSION_TENSOR=ON \
    -DEXECUTORCH_BUILD_KERNELS_QUANTIZED=ON \
    -DEXECUTORCH_BUILD_PORTABLE_OPS=ON \
    -DEXECUTORCH_BUILD_XNNPACK=OFF \
    -DEXECUTORCH_BUILD_PTHREADPOOL=OFF \
    -DEXECUTORCH_BUILD_CPUINFO=OFF \
    -DEXECUTORCH_BUILD_EXECUTOR_RUNNER=OFF \
    -DEXECUTORCH_BUILD_TESTS=OFF \
    -DEXECUTORCH_ENABLE_LOGGING=ON \
    "$@" \
    > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log" >&2; die "cmake configure failed (whole log: $out/configure.log)"; }
  # progress: every 25th step of ninja's count
  if ! (set -o pipefail; cmake --build "$out/build" -j "$jobs" --target install 2>&1 | tee "$out/build.log" \
        | awk '/^\[[0-9]+\/[0-9]+\]/ { if (++n % 25 == 0) { print "   " $1; fflush() } }'); then
    grep -E 'error|FAILED' "$out/build.log" | grep -v template_file_path | head -30 >&2
    die "ExecuTorch build failed (whole log: $out/build.log)"
  fi
}

# build_runner RUNNER_DIR SRC OUT JOBS NAME [CMAKE_ARGS...]: a runner (RUNNER_DIR/CMakeLists.txt, which
# builds the shared tools/runtime-runner/runner.cpp with its backend's adapter.cpp) into OUT/bin/NAME
build_runner() {
  local dir="$1" src="$2" out="$3" jobs="$4" name="$5"; shift 5
  cmake -S "$dir" -B "$out/runner-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$out/install" -DEXECUTORCH_SRC="$src" -DEXECUTORCH_BUILD="$out/build" "$@" \
    > "$out/runner-configure.log" 2>&1 || { tail -30 "$out/runner-configure.log" >&2; die "runner configure failed (log: $out/runner-configure.log)"; }
  cmake --build "$out/runner-build" -j "$jobs" > "$out/runner-build.log" 2>&1 \
    || { grep -E 'error' "$out/runner-build.log" | head -30 >&2; die "runner build failed (log: $out/runner-build.log)"; }
  mkdir -p "$out/bin"
  cp "$out/runner-build/$name" "$out/bin/"
}
