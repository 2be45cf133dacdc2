// The WebGPU runner's adapter name: the adapter ExecuTorch's WebGPU backend opened
// (its process-wide context), with the graphics API wgpu-native runs it through and
// wgpu-native's version.
#include "adapter.h"

#include <executorch/backends/webgpu/runtime/WebGPUDevice.h>

namespace edgeplug {

namespace {

std::string view(WGPUStringView s) {
  if (s.data == nullptr) return "";
  return s.length == WGPU_STRLEN ? std::string(s.data) : std::string(s.data, s.length);
}

const char* api_name(WGPUBackendType type) {
  switch (type) {
    case WGPUBackendType_Vulkan: return "Vulkan";
    case WGPUBackendType_Metal: return "Metal";
    case WGPUBackendType_D3D12: return "D3D12";
    case WGPUBackendType_OpenGL: return "OpenGL";
    case WGPUBackendType_OpenGLES: return "OpenGL ES";
    default: return "an unnamed API";
  }
}

}  // namespace

std::string adapter_name() {
  auto* ctx = executorch::backends::webgpu::get_default_webgpu_context();
  if (ctx == nullptr || ctx->adapter == nullptr) {
    return "no WebGPU adapter (the backend could not open one: see its log)";
  }
  WGPUAdapterInfo info = {};
  if (wgpuAdapterGetInfo(ctx->adapter, &info) != WGPUStatus_Success) {
    return "a WebGPU adapter that does not say its name";
  }
  std::string name = view(info.device);
  if (name.empty()) name = view(info.description);
  const uint32_t v = wgpuGetVersion();  // one byte a part: 0x1d000101 is 29.0.1.1
  std::string out = name + " via " + api_name(info.backendType) + ", wgpu-native " +
      std::to_string(v >> 24) + "." + std::to_string((v >> 16) & 0xff) + "." +
      std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff);
  wgpuAdapterInfoFreeMembers(info);
  return out;
}

}  // namespace edgeplug
