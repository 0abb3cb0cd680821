#pragma once
/**
 * @file cuda_check.hpp
 * @brief GHT_CUDA_TRY: check a CUDA runtime call and throw ght::cuda_error on failure.
 *
 * Include only from sources compiled with GHT_HAVE_CUDA. The sticky error is cleared with
 * cudaGetLastError() before throwing, so the caller can recover from non-fatal errors.
 */
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <string>

#include "tier/error.hpp"

namespace ght::detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();  // clear the sticky error
  throw ght::cuda_error(std::string("CUDA error ") + cudaGetErrorName(err) + ": " +
                        cudaGetErrorString(err) + " in " + call + " at " + file + ":" +
                        std::to_string(line));
}

/// Usable CUDA devices; when there are none, 0 and `why` says why. The runtime reports a machine
/// without an NVIDIA driver as "CUDA driver version is insufficient": that is said first.
inline int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess && n > 0) return n;
  (void)cudaGetLastError();
  if (err == cudaSuccess) {
    *why = "cudaGetDeviceCount found 0 devices";
    return 0;
  }
  *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  if ((err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) &&
      ::access("/proc/driver/nvidia/version", F_OK) != 0) {
    *why = "no NVIDIA driver is loaded; " + *why;
  }
  return 0;
}
}  // namespace ght::detail

#define GHT_CUDA_TRY(call)                                                 \
  do {                                                                     \
    cudaError_t ght_cuda_err_ = (call);                                    \
    if (ght_cuda_err_ != cudaSuccess) [[unlikely]] {                       \
      ::ght::detail::throw_cuda_error(ght_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)

/// Check the last kernel launch.
#define GHT_CUDA_CHECK_LAUNCH() GHT_CUDA_TRY(cudaGetLastError())
