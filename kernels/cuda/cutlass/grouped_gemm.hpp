#pragma once
/**
 * @file grouped_gemm.hpp
 * @brief Entry points of the CUTLASS grouped GEMMs (GroupedGemmImpl::cutlass), one per
 * instantiation, without CUTLASS's headers (kernels/cuda/expert_gemm.cu includes this; the
 * instantiations live in grouped_*.cu, built for sm_90a when CMake finds CUTLASS, and
 * GHT_HAVE_CUTLASS is defined then). grouped_gemm.cuh says how a call runs.
 */
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda::cutlass_grouped {

/// One grouped GEMM (expert_gemm.hpp's var-M or var-K), its offsets on the device.
struct Problem {
  int groups = 0;
  const std::int32_t* offsets = nullptr;  ///< (groups+1), device
  bool var_k = false;
  std::int64_t m = 0;                     ///< var-K: rows of every C_e
  std::int64_t n = 0, k = 0;              ///< var-M: n, k; var-K: n (k is the group's rows)
  const void* a = nullptr;                ///< bf16
  std::int64_t lda = 0;
  const void* b = nullptr;                ///< bf16
  std::int64_t ldb = 0;
  std::int64_t stride_b = 0;              ///< var-M: elements between groups' B
  void* c = nullptr;                      ///< bf16 or fp32, read (beta != 0) and written in place
  std::int64_t ldc = 0;
  std::int64_t stride_c = 0;              ///< var-K: elements between groups' C
  float alpha = 1.0f, beta = 0.0f;
  int device = 0, sm_count = 0;
};

/// var-M, B_e stored (n, k) row-major (trans_b), bf16 C: 128x256 tiles, cooperative.
void var_m_bt_bf16_128x256(const Problem& p, cudaStream_t stream);
/// var-M, B_e stored (k, n) row-major, bf16 C: 128x256 tiles, cooperative.
void var_m_bn_bf16_128x256(const Problem& p, cudaStream_t stream);
/// var-K (weight gradients), fp32 C: 128x128 tiles, cooperative.
void var_k_f32(const Problem& p, cudaStream_t stream);
/// var-K (weight gradients), bf16 C: 128x128 tiles, cooperative.
void var_k_bf16(const Problem& p, cudaStream_t stream);

}  // namespace ght::kernels::cuda::cutlass_grouped
