// The Vulkan runner's adapter name: the device ExecuTorch's Vulkan backend opened.
#include "adapter.h"

#include <exception>

#include <executorch/backends/vulkan/runtime/api/api.h>

namespace edgeplug {

std::string adapter_name() {
  try {
    auto* ctx = vkcompute::api::context();
    if (ctx == nullptr || ctx->adapter_ptr() == nullptr) {
      return "no Vulkan adapter";
    }
    return ctx->adapter_ptr()->device_name();
  } catch (const std::exception& e) {
    return std::string("no Vulkan adapter (") + e.what() + ")";
  }
}

}  // namespace edgeplug
