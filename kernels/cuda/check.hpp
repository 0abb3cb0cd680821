#pragma once
/**
 * @file check.hpp
 * @brief GHT_CUBLAS_TRY / GHT_CUDNN_TRY: check a cuBLAS(Lt) or cuDNN status and throw
 * ght::cuda_error naming the call, the status and file:line (the GHT_CUDA_TRY pattern of
 * tier/cuda_check.hpp, extended to the libraries). Include only from CUDA-enabled sources.
 */
#include <cublas_api.h>

#include <string>

#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::detail {
[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                            int line) {
  // A failed library call may leave a sticky runtime error behind; clear it like GHT_CUDA_TRY.
  (void)cudaGetLastError();
  throw ght::cuda_error(std::string("cuBLAS error ") + cublasGetStatusName(st) + ": " +
                        cublasGetStatusString(st) + " in " + call + " at " + file + ":" +
                        std::to_string(line));
}
}  // namespace ght::detail

#define GHT_CUBLAS_TRY(call)                                                       \
  do {                                                                             \
    cublasStatus_t ght_cublas_st_ = (call);                                        \
    if (ght_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                    \
      ::ght::detail::throw_cublas_error(ght_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

#if defined(GHT_HAVE_CUDNN) || __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
namespace ght::detail {
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file,
                                           int line) {
  (void)cudaGetLastError();
  throw ght::cuda_error(std::string("cuDNN error ") + cudnnGetErrorString(st) + " (" +
                        std::to_string(static_cast<int>(st)) + ") in " + call + " at " + file +
                        ":" + std::to_string(line));
}
}  // namespace ght::detail

#define GHT_CUDNN_TRY(call)                                                       \
  do {                                                                            \
    cudnnStatus_t ght_cudnn_st_ = (call);                                         \
    if (ght_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                     \
      ::ght::detail::throw_cudnn_error(ght_cudnn_st_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
#endif
