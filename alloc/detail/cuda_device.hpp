#pragma once
/**
 * @file cuda_device.hpp
 * @brief Internal helpers for the CUDA resources; include only under GHT_HAVE_CUDA.
 */
#include <cuda_runtime_api.h>

#include <string>

#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::alloc::detail {

/// Makes `device` current for a scope and restores the caller's device after, so a resource
/// bound to one device can be used from a thread that works on another.
class device_guard {
 public:
  explicit device_guard(int device) {
    GHT_CUDA_TRY(cudaGetDevice(&old_));
    if (old_ != device) GHT_CUDA_TRY(cudaSetDevice(device));
    device_ = device;
  }
  ~device_guard() {
    if (old_ != device_) (void)cudaSetDevice(old_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int old_ = 0;
  int device_ = 0;
};

/// Throw ght::out_of_memory for cudaErrorMemoryAllocation, else ght::cuda_error; the message
/// names the resource, the call and the size.
[[noreturn]] inline void throw_alloc_error(cudaError_t err, const std::string& who,
                                           const char* call, std::size_t bytes) {
  (void)cudaGetLastError();  // clear the sticky error so the caller can carry on
  const std::string what = who + ": " + call + " of " + config::format_bytes(bytes) +
                           " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) throw ght::out_of_memory(what);
  throw ght::cuda_error(what);
}

/// Checks `device` names an existing device.
inline void check_device(int device, const std::string& who) {
  int count = 0;
  GHT_CUDA_TRY(cudaGetDeviceCount(&count));
  GHT_EXPECTS(device >= 0 && device < count, who + ": CUDA device " + std::to_string(device) +
                                                 " does not exist (" + std::to_string(count) +
                                                 " devices)");
}

/// Free bytes on `device` (cudaMemGetInfo); UINT64_MAX when it cannot be read.
inline std::uint64_t device_free_bytes(int device) noexcept {
  int old = 0;
  if (cudaGetDevice(&old) != cudaSuccess) return UINT64_MAX;
  if (old != device && cudaSetDevice(device) != cudaSuccess) return UINT64_MAX;
  std::size_t free_b = 0, total_b = 0;
  const cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
  if (old != device) (void)cudaSetDevice(old);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return UINT64_MAX;
  }
  return free_b;
}

}  // namespace ght::alloc::detail
