# edgeplug: `make demo` and `make test` work on a fresh clone.
PY ?= python3
# the ExecuTorch release to install and test with (edgeplug is tested with 1.4.x and 1.5.x; CI runs both):
# `make test EXECUTORCH=1.4.1` builds and uses a venv of its own (.venv-et1.4.1)
EXECUTORCH ?= 1.5.1
VENV := $(if $(filter 1.5.1,$(EXECUTORCH)),.venv,.venv-et$(EXECUTORCH))
BIN := $(VENV)/bin
PLUGINS := vulkan_delegate vulkan webgpu qnn samsung xnnpack coreml
STAMP := $(VENV)/.edgeplug-installed

.PHONY: setup demo lint test test-slow test-release bench zoo executorch-suite vulkan-runtime webgpu-runtime clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch 2.13.0 (CPU) first, explicitly: any looser spec may pull a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml $(foreach p,$(PLUGINS),plugins/$(p)/pyproject.toml)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q executorch==$(EXECUTORCH)
	$(BIN)/pip install -q -e '.[test]' $(foreach p,$(PLUGINS),-e plugins/$(p))
	@$(BIN)/python -c "from importlib.metadata import version as v; import sys; \
	  sys.exit(0 if v('executorch') == '$(EXECUTORCH)' else 'executorch %s installed, $(EXECUTORCH) asked for' % v('executorch'))"
	# optimum-executorch (the deployed-program tests' exporter) pins an older transformers: no deps
	$(BIN)/pip install -q --no-deps optimum-executorch==1.1.0
	$(BIN)/pip install -q 'optimum>=2.0' accelerate
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/edgeplug backends
	$(BIN)/edgeplug lower handwritten-llama-decoder --backend vulkan -o out/llama-vulkan.pte --report out/llama-vulkan.json

# ruff and mypy with pyproject.toml's configuration (its [tool.ruff] and [tool.mypy] say what and why)
lint: setup
	$(BIN)/ruff check core plugins
	$(BIN)/mypy

# two worker processes (pytest-xdist), each taking whole files so a file's fixtures are built once.
# make test: every test but the slow end-to-end ones (marked slow: exported LLM programs, generated packages installed,
# ExecuTorch's suite slice); make test-slow runs those; CI runs both (.ci/run)
TEST_WORKERS ?= 2
PYTEST := XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile
test: setup lint
	$(PYTEST) --durations=25 -m "not slow" tests plugins

test-slow: setup
	$(PYTEST) --durations=25 -m slow tests plugins

# on the other end of the tested range (CI: make test-release EXECUTORCH=1.4.1): every plugin's conformance suite,
# the core's conformance, lowering and verification tests, and the release checks (README: "ExecuTorch releases")
RELEASE_TESTS = tests/test_conformance.py tests/test_lower.py tests/test_executorch_versions.py \
  tests/test_executorch_boundary.py $(wildcard plugins/*/tests/test_backend.py) plugins/webgpu/tests/test_executorch_release.py
test-release: setup
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
	  --durations=10 $(RELEASE_TESTS)

# ExecuTorch's backend test suite (the float32 operator tests the executorch wheel ships) through edgeplug's xnnpack
# flow and stock's, test by test in one process (docs/benchmarks.md keeps its table): fails on any test stock's flow
# passes that edgeplug neither passes nor refuses up front. CI runs a slice of it (the xnnpack plugin's
# test_executorch_suite_slice.py, in make test); this is the whole run, well over an hour on a loaded 2-core machine
executorch-suite: setup
	mkdir -p out
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python -m edgeplug.testing.executorch_suite --backend xnnpack \
	  --json out/executorch-suite-xnnpack.json

# Benchmarks (not tests): figures and how to read them in docs/benchmarks.md
bench: setup
	$(BIN)/python bench/graph_overhead.py --repeat 3
	$(BIN)/python bench/fusion_overhead.py
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python bench/rms_norm.py \
	  --sizes 1x4096,64x4096,1024x4096,4096x4096,4096x1024,4096x5000 --torch-threads 1

# The model zoo: transformers architectures x every backend against stock (docs/zoo.md; `edgeplug zoo`,
# cells in out/zoo-cells.jsonl: after an interruption, rerun the command with --resume),
# then the quantized cells (docs/zoo.md's quantized section, out/zoo-quantized.jsonl), then executorch's own
# example models and every quantize scheme x example (the whole sets: EDGEPLUG_ZOO=1)
# the quantized section of docs/zoo.md: every zoo decoder x every scheme of every backend, beside stock's flow
# for the same quantizer (8da4w@xnnpack: XNNPACK's 8da4w lowered for the backends that do not offer it)
ZOO_DECODERS = llama,qwen3,gemma3,mistral,phi3,olmo2,falcon-mamba
ZOO_SCHEMES = 8a8w,8da4w,8da4w-g128,e8,e4,w8,w4,w4-g32,16a8w,8a4w,16a4w,a8w8,8da4w@xnnpack
zoo: setup
	rm -f out/zoo-cells.jsonl
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/edgeplug zoo --schemes float --compare-stock --jobs 2 --layers 1 \
	  --repeat 3 --out out/zoo-cells.jsonl --markdown docs/zoo.md
	rm -f out/zoo-quantized.jsonl
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/edgeplug zoo --models $(ZOO_DECODERS) --schemes $(ZOO_SCHEMES) \
	  --compare-stock --jobs 2 --layers 1 --out out/zoo-quantized.jsonl --markdown docs/zoo.md
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} EDGEPLUG_ZOO=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_et_examples.py tests/test_zoo.py tests/test_quantize_examples.py plugins/vulkan_delegate/tests/test_bf16_rms_norm.py tests/test_quantize_verify.py \
	  plugins/vulkan_delegate/tests/test_quantized_host_verification.py

# ExecuTorch's own Vulkan runtime, built from source trees you fetched (docs/vulkan-runtime.md), then the
# tests that run programs in it and the real-runtime-against-emulation-against-stock table (docs/benchmarks.md)
ET_SRC ?= $(HOME)/src/executorch
GLSLANG_SRC ?= $(HOME)/src/glslang
vulkan-runtime: setup
	PYTHON=$(BIN)/python tools/vulkan-runtime/build.sh $(ET_SRC) $(if $(wildcard $(GLSLANG_SRC)),--glslang $(GLSLANG_SRC))
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python -m pytest -q -p no:cacheprovider \
	  plugins/vulkan/tests/test_real_runtime.py plugins/vulkan/tests/test_runtime_gaps.py \
	  plugins/vulkan/tests/test_real_runtime_quantized.py plugins/vulkan/tests/test_backend.py
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python bench/vulkan_runtime.py --json out/vulkan-runtime.json

# ExecuTorch's own WebGPU runtime on wgpu-native (the wgpu wheel's library, in place of Dawn), built from the same
# source tree (docs/webgpu-runtime.md); then naga over every WGSL shader it embeds, the tests that run programs in
# it, and the real-runtime-against-emulation-against-stock table (docs/benchmarks.md)
webgpu-runtime: setup
	PYTHON=$(BIN)/python tools/webgpu-runtime/build.sh $(ET_SRC)
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python tools/webgpu-runtime/check_wgsl.py $(ET_SRC)
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python -m pytest -q -p no:cacheprovider \
	  plugins/webgpu/tests/test_real_runtime.py plugins/webgpu/tests/test_backend.py
	XDG_RUNTIME_DIR=$${XDG_RUNTIME_DIR:-/tmp} $(BIN)/python bench/vulkan_runtime.py --backend webgpu \
	  --sets seed,rmsnorm,examples,zoo,quantized,optimum --json out/webgpu-runtime.json

clean:
	rm -rf .venv .venv-et* out
