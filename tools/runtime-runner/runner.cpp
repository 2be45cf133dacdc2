// edgeplug's runner over ExecuTorch's runtime, shared by the runtime builds
// (tools/vulkan-runtime, tools/webgpu-runtime): it loads one .pte in ExecuTorch's
// runtime, linked with one GPU backend, and runs its method on request, keeping the
// method's state (mutable buffers such as a KV cache) from one request to the next.
// Each build links this file with its backend's adapter.cpp (adapter.h), which names
// the GPU device the backend opened.
//
// Protocol, on stdin/stdout (stderr carries ExecuTorch's own log lines):
//   start:   the runner writes one JSON line: {"ok": true, "adapter": ...,
//            "method": ..., "inputs": [...], "num_outputs": N} or
//            {"ok": false, "error": ...} and exits.
//   request: one JSON line, then the raw bytes of each tensor input in order:
//            {"cmd": "run", "repeat": R, "inputs": [{"kind": "tensor",
//             "dtype": D, "sizes": [...], "nbytes": B} | {"kind": "int",
//             "value": V} | {"kind": "double", "value": V} |
//             {"kind": "bool", "value": V} | {"kind": "none"}]}
//            {"cmd": "reset"}   reloads the method (fresh state)
//            {"cmd": "etdump", "path": P}   (a build.sh --profile build only,
//             whose start line says "etdump": true) writes the ETDump of every
//             run so far to P: ExecuTorch's per-delegate events and the
//             backend's per-shader GPU timestamps; the runner exits after it
//            {"cmd": "quit"}
//   answer:  one JSON line {"ok": true, "times_us": [...], "outputs": [...]}
//            then the raw bytes of each tensor output; or {"ok": false,
//            "error": ...}. dtype codes are ExecuTorch's ScalarType values.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/platform/runtime.h>
#include <nlohmann/json.hpp>

#include "adapter.h"
#ifdef EDGEPLUG_ETDUMP
#include <executorch/devtools/etdump/etdump_flatcc.h>
#endif

using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using nlohmann::json;

namespace {

void answer(const json& j) {
  std::string line = j.dump();
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void fail(const std::string& what, Error err) {
  answer({{"ok", false},
          {"error", what + ": " + executorch::runtime::to_string(err)},
          {"code", static_cast<int>(err)}});
}

bool read_exact(void* dst, size_t n) {
  return std::fread(dst, 1, n, stdin) == n;
}

json describe_inputs(Module& module, const std::string& method) {
  json inputs = json::array();
  auto meta = module.method_meta(method);
  if (!meta.ok()) {
    return inputs;
  }
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto tag = meta->input_tag(i);
    if (tag.ok() && *tag == executorch::runtime::Tag::Tensor) {
      auto t = meta->input_tensor_meta(i);
      std::vector<int64_t> sizes(t->sizes().begin(), t->sizes().end());
      inputs.push_back({{"kind", "tensor"},
                        {"dtype", static_cast<int>(t->scalar_type())},
                        {"sizes", sizes}});
    } else {
      inputs.push_back({{"kind", tag.ok() ? static_cast<int>(*tag) : -1}});
    }
  }
  return inputs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: %s PROGRAM.pte [DATA.ptd] [--method NAME]\n", argv[0]);
    return 2;
  }
  executorch::runtime::runtime_init();
  std::string pte = argv[1];
  std::string ptd;
  std::string method = "forward";
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--method=", 0) == 0) {
      method = a.substr(9);
    } else {
      ptd = a;
    }
  }
  std::unique_ptr<executorch::runtime::EventTracer> tracer;
#ifdef EDGEPLUG_ETDUMP
  tracer = std::make_unique<executorch::etdump::ETDumpGen>();
  auto* etdump = static_cast<executorch::etdump::ETDumpGen*>(tracer.get());
  const bool profiling = true;
#else
  const bool profiling = false;
#endif
  std::unique_ptr<Module> module =
      ptd.empty() ? std::make_unique<Module>(pte, Module::LoadMode::File, std::move(tracer))
                  : std::make_unique<Module>(pte, ptd, Module::LoadMode::File, std::move(tracer));
  Error err;
  try {
    err = module->load_method(method);
  } catch (const std::exception& e) {
    answer({{"ok", false}, {"error", "load_method(" + method + ") threw: " + e.what()}});
    return 1;
  }
  if (err != Error::Ok) {
    fail("load_method(" + method + ") failed", err);
    return 1;
  }
  auto meta = module->method_meta(method);
  answer({{"ok", true},
          {"adapter", edgeplug::adapter_name()},
          {"method", method},
          {"inputs", describe_inputs(*module, method)},
          {"num_outputs", meta.ok() ? meta->num_outputs() : 0},
          {"etdump", profiling}});

  std::string line;
  while (true) {
    line.clear();
    int c;
    while ((c = std::fgetc(stdin)) != EOF && c != '\n') {
      line.push_back(static_cast<char>(c));
    }
    if (c == EOF && line.empty()) {
      return 0;
    }
    json req;
    try {
      req = json::parse(line);
    } catch (const std::exception& e) {
      answer({{"ok", false}, {"error", std::string("bad request: ") + e.what()}});
      return 2;
    }
    std::string cmd = req.value("cmd", "");
    if (cmd == "quit") {
      return 0;
    }
    if (cmd == "reset") {
      module->unload_method(method);
      try {
        err = module->load_method(method);
      } catch (const std::exception& e) {
        answer({{"ok", false}, {"error", std::string("reload threw: ") + e.what()}});
        return 1;
      }
      if (err != Error::Ok) {
        fail("reload of " + method + " failed", err);
      } else {
        answer({{"ok", true}});
      }
      continue;
    }
    if (cmd == "etdump") {
#ifdef EDGEPLUG_ETDUMP
      std::string path = req.value("path", "");
      auto dump = etdump->get_etdump_data();
      FILE* f = path.empty() ? nullptr : std::fopen(path.c_str(), "wb");
      if (f == nullptr || dump.buf == nullptr ||
          std::fwrite(dump.buf, 1, dump.size, f) != dump.size) {
        if (f) std::fclose(f);
        answer({{"ok", false}, {"error", "cannot write the ETDump to '" + path + "'"}});
        return 1;
      }
      std::fclose(f);
      answer({{"ok", true}, {"nbytes", dump.size}});
      return 0;
#else
      answer({{"ok", false}, {"error", "this runner was built without the event tracer (build.sh --profile)"}});
      continue;
#endif
    }
    if (cmd != "run") {
      answer({{"ok", false}, {"error", "unknown cmd '" + cmd + "'"}});
      continue;
    }
    // Inputs: the bytes stay alive in `storage` until the run ends.
    std::vector<std::vector<uint8_t>> storage;
    std::vector<TensorPtr> tensors;
    std::vector<EValue> inputs;
    bool ok = true;
    for (const auto& in : req["inputs"]) {
      std::string kind = in.value("kind", "tensor");
      if (kind == "tensor") {
        size_t nbytes = in["nbytes"].get<size_t>();
        storage.emplace_back(nbytes);
        if (nbytes && !read_exact(storage.back().data(), nbytes)) {
          answer({{"ok", false}, {"error", "short read of an input's bytes"}});
          return 2;
        }
        std::vector<executorch::aten::SizesType> sizes;
        for (auto s : in["sizes"]) sizes.push_back(s.get<int64_t>());
        auto dtype = static_cast<executorch::aten::ScalarType>(in["dtype"].get<int>());
        tensors.push_back(executorch::extension::make_tensor_ptr(
            std::move(sizes), storage.back().data(), dtype));
        inputs.emplace_back(tensors.back());
      } else if (kind == "int") {
        inputs.emplace_back(in["value"].get<int64_t>());
      } else if (kind == "double") {
        inputs.emplace_back(in["value"].get<double>());
      } else if (kind == "bool") {
        inputs.emplace_back(in["value"].get<bool>());
      } else if (kind == "none") {
        inputs.emplace_back();
      } else {
        ok = false;
      }
    }
    if (!ok) {
      answer({{"ok", false}, {"error", "unknown input kind"}});
      continue;
    }
    int repeat = req.value("repeat", 1);
    std::vector<double> times;
    std::optional<executorch::runtime::Result<std::vector<EValue>>> result;
    bool failed = false;
    for (int r = 0; r < std::max(repeat, 1); ++r) {
      auto t0 = std::chrono::steady_clock::now();
      try {
        result.emplace(module->execute(method, inputs));
      } catch (const std::exception& e) {
        // a backend that throws (the Vulkan backend on a Vulkan error): answer it, do not abort
        answer({{"ok", false}, {"error", std::string("execute(") + method + ") threw: " + e.what()}});
        failed = true;
        break;
      }
      auto t1 = std::chrono::steady_clock::now();
      if (!result->ok()) break;
      times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    if (failed) {
      continue;
    }
    if (!result->ok()) {
      fail("execute(" + method + ") failed", result->error());
      continue;
    }
    json outs = json::array();
    std::vector<std::pair<const void*, size_t>> blobs;
    for (const auto& ev : **result) {
      if (ev.isTensor()) {
        const auto& t = ev.toTensor();
        std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
        outs.push_back({{"kind", "tensor"},
                        {"dtype", static_cast<int>(t.scalar_type())},
                        {"sizes", sizes},
                        {"nbytes", t.nbytes()}});
        blobs.emplace_back(t.const_data_ptr(), t.nbytes());
      } else if (ev.isInt()) {
        outs.push_back({{"kind", "int"}, {"value", ev.toInt()}});
      } else if (ev.isDouble()) {
        outs.push_back({{"kind", "double"}, {"value", ev.toDouble()}});
      } else if (ev.isBool()) {
        outs.push_back({{"kind", "bool"}, {"value", ev.toBool()}});
      } else {
        outs.push_back({{"kind", "none"}});
      }
    }
    answer({{"ok", true}, {"times_us", times}, {"outputs", outs}});
    for (auto& [ptr, n] : blobs) {
      std::fwrite(ptr, 1, n, stdout);
    }
    std::fflush(stdout);
  }
}
