/*
 * edgeplug's <webgpu/webgpu.h> for building ExecuTorch's WebGPU backend on wgpu-native
 * instead of Dawn. build.sh copies it into the build folder as include/webgpu/webgpu.h,
 * ahead of wgpu-native's own headers (include/wgpu-native/), which it includes.
 *
 * Where wgpu-native (29.0.x, inside the `wgpu` wheel 0.32) differs from Dawn for what the
 * backend uses:
 *
 * - wgpuInstanceWaitAny is exported but not implemented: it panics ("not implemented",
 *   src/unimplemented.rs) and the panic aborts the process. The backend waits on every
 *   future through it (adapter, device, each output's buffer map). Here a future-returning
 *   call the backend makes (adapter and device requests, buffer maps) gets a callback of
 *   ours in front of the caller's and a future id of ours; wgpuInstanceWaitAny is ours and
 *   waits by polling the devices (wgpuDevicePoll, blocking) until that callback has run.
 * - wgpu-native returns future id 0 for every call and fires callbacks whatever their mode
 *   (adapter and device requests at once, maps on a poll); our callbacks ask for
 *   WGPUCallbackMode_AllowProcessEvents, which wgpu-native implements.
 * - wgpuAdapterGetLimits returns a WGPUBool (1) where Dawn returns WGPUStatus: 1 is also
 *   WGPUStatus_Success, so the backend's check holds; nothing to do.
 *
 * C++ only (the backend is C++17): the registry below is one object across translation units
 * through inline variables.
 */
#pragma once

#include <wgpu-native/webgpu.h>
#include <wgpu-native/wgpu.h>

#ifdef __cplusplus
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace edgeplug_wgpu_compat {

struct Pending {
  std::atomic<bool> done{false};
};

struct Registry {
  std::mutex mu;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  std::vector<WGPUDevice> devices;  // the devices made through the shim: WaitAny polls them
  uint64_t next_id = 1;
};

inline Registry& registry() {
  static Registry r;
  return r;
}

inline WGPUFuture track(std::shared_ptr<Pending> p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  WGPUFuture f = {};
  f.id = r.next_id++;
  r.pending.emplace(f.id, std::move(p));
  return f;
}

// One hop in front of a caller's callback: run it, then mark its future done.
template <class Callback>
struct Hop {
  Callback callback;
  void* userdata1;
  void* userdata2;
  std::shared_ptr<Pending> pending;
};

inline void adapter_hop(WGPURequestAdapterStatus status, WGPUAdapter adapter, WGPUStringView message,
                        void* hop_ptr, void*) {
  std::unique_ptr<Hop<WGPURequestAdapterCallback>> hop(static_cast<Hop<WGPURequestAdapterCallback>*>(hop_ptr));
  if (hop->callback) hop->callback(status, adapter, message, hop->userdata1, hop->userdata2);
  hop->pending->done.store(true);
}

inline void device_hop(WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message,
                       void* hop_ptr, void*) {
  std::unique_ptr<Hop<WGPURequestDeviceCallback>> hop(static_cast<Hop<WGPURequestDeviceCallback>*>(hop_ptr));
  if (status == WGPURequestDeviceStatus_Success && device != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.devices.push_back(device);
  }
  if (hop->callback) hop->callback(status, device, message, hop->userdata1, hop->userdata2);
  hop->pending->done.store(true);
}

inline void map_hop(WGPUMapAsyncStatus status, WGPUStringView message, void* hop_ptr, void*) {
  std::unique_ptr<Hop<WGPUBufferMapCallback>> hop(static_cast<Hop<WGPUBufferMapCallback>*>(hop_ptr));
  if (hop->callback) hop->callback(status, message, hop->userdata1, hop->userdata2);
  hop->pending->done.store(true);
}

template <class Info, class Callback, class Fn>
inline Info hop_info(const Info& given, Fn fn, std::shared_ptr<Pending> pending) {
  Info info = given;
  info.mode = WGPUCallbackMode_AllowProcessEvents;
  info.callback = fn;
  info.userdata1 = new Hop<Callback>{given.callback, given.userdata1, given.userdata2, std::move(pending)};
  info.userdata2 = nullptr;
  return info;
}

inline WGPUFuture request_adapter(WGPUInstance instance, const WGPURequestAdapterOptions* options,
                                  WGPURequestAdapterCallbackInfo info) {
  auto pending = std::make_shared<Pending>();
  WGPUFuture f = track(pending);
  ::wgpuInstanceRequestAdapter(
      instance, options, hop_info<WGPURequestAdapterCallbackInfo, WGPURequestAdapterCallback>(info, adapter_hop, pending));
  return f;
}

inline WGPUFuture request_device(WGPUAdapter adapter, const WGPUDeviceDescriptor* descriptor,
                                 WGPURequestDeviceCallbackInfo info) {
  auto pending = std::make_shared<Pending>();
  WGPUFuture f = track(pending);
  ::wgpuAdapterRequestDevice(
      adapter, descriptor, hop_info<WGPURequestDeviceCallbackInfo, WGPURequestDeviceCallback>(info, device_hop, pending));
  return f;
}

inline WGPUFuture map_async(WGPUBuffer buffer, WGPUMapMode mode, size_t offset, size_t size,
                            WGPUBufferMapCallbackInfo info) {
  auto pending = std::make_shared<Pending>();
  WGPUFuture f = track(pending);
  ::wgpuBufferMapAsync(buffer, mode, offset, size,
                       hop_info<WGPUBufferMapCallbackInfo, WGPUBufferMapCallback>(info, map_hop, pending));
  return f;
}

inline void device_released(WGPUDevice device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.devices.begin(); it != r.devices.end(); ++it) {
    if (*it == device) {
      r.devices.erase(it);
      break;
    }
  }
}

inline void release_device(WGPUDevice device) {
  device_released(device);
  ::wgpuDeviceRelease(device);
}

// WaitAny over our futures: Success once one of them has completed (marking it), TimedOut
// when timeout_ns passes first, Error for a future this shim did not make.
inline WGPUWaitStatus wait_any(WGPUInstance instance, size_t count, WGPUFutureWaitInfo* infos,
                               uint64_t timeout_ns) {
  Registry& r = registry();
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    bool any = false;
    std::vector<WGPUDevice> devices;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      for (size_t i = 0; i < count; ++i) {
        auto it = r.pending.find(infos[i].future.id);
        if (it == r.pending.end()) {
          return WGPUWaitStatus_Error;
        }
        if (it->second->done.load()) {
          infos[i].completed = 1;
          r.pending.erase(it);
          any = true;
        }
      }
      devices = r.devices;
    }
    if (any) {
      return WGPUWaitStatus_Success;
    }
    if (timeout_ns == 0) {
      return WGPUWaitStatus_TimedOut;
    }
    if (timeout_ns != UINT64_MAX) {
      const auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - start);
      if (static_cast<uint64_t>(waited.count()) >= timeout_ns) {
        return WGPUWaitStatus_TimedOut;
      }
    }
    // A blocking poll returns once the device's submitted work is done, running the
    // callbacks that became ready (a buffer map's); then anything else pending.
    for (WGPUDevice device : devices) {
      ::wgpuDevicePoll(device, 1, nullptr);
    }
    ::wgpuInstanceProcessEvents(instance);
    if (devices.empty()) {
      std::this_thread::yield();
    }
  }
}

}  // namespace edgeplug_wgpu_compat

// The backend's calls reach the shim (its sources spell the standard names).
#define wgpuInstanceWaitAny edgeplug_wgpu_compat::wait_any
#define wgpuInstanceRequestAdapter edgeplug_wgpu_compat::request_adapter
#define wgpuAdapterRequestDevice edgeplug_wgpu_compat::request_device
#define wgpuBufferMapAsync edgeplug_wgpu_compat::map_async
#define wgpuDeviceRelease edgeplug_wgpu_compat::release_device

#endif  // __cplusplus
