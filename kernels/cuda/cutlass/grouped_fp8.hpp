#pragma once
/**
 * @file grouped_fp8.hpp
 * @brief Entry point of the CUTLASS block-scaled FP8 grouped GEMM (grouped_fp8_blockwise.cu,
 * sm_90a, built when CMake finds CUTLASS; GHT_HAVE_CUTLASS is defined then), without CUTLASS's
 * headers. kernels/cuda/expert_gemm_fp8.cu checks the arguments and calls it.
 *
 * var-M, B stored (n, k) row-major ("bt"): for each group e,
 *   C[rows_e, :] = alpha·(A[rows_e, :] ⊙ sA)·(B_e ⊙ sB_e)^T + beta·C[rows_e, :]
 * with e4m3 A and B, fp32 accumulation and bf16 C. Each K tile of 128 is accumulated on its own
 * and added to the fp32 sum scaled by sA(row, kt)·sB_e(nt, kt) (kernels/cpu/fp8's matmul_nt_fp8).
 *
 * Scale layouts (what kernels/cuda/fp8_quant writes): sA (R, ceil(k/128)) row-major, exactly
 * that row stride (CUTLASS derives the layout from the group's shape); sB_e (ceil(n/128),
 * ceil(k/128)) row-major at sb + e·stride_sb.
 *
 * Like the bf16 grouped GEMMs (grouped_gemm.cuh), the problem shapes stay on the device: one small
 * kernel turns the offsets into CUTLASS's per-group arrays, so nothing waits for the routing.
 */
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda::cutlass_grouped {

/// One block-scaled FP8 var-M grouped GEMM, its offsets on the device.
struct Fp8Problem {
  int groups = 0;
  const std::int32_t* offsets = nullptr;  ///< (groups+1), device
  std::int64_t n = 0, k = 0;
  const void* a = nullptr;                ///< e4m3 (R, k), row stride lda
  std::int64_t lda = 0;
  const float* sa = nullptr;              ///< (R, ceil(k/128))
  const void* b = nullptr;                ///< e4m3, per group (n, k) with row stride ldb
  std::int64_t ldb = 0;
  std::int64_t stride_b = 0;              ///< elements between groups' B
  const float* sb = nullptr;              ///< per group (ceil(n/128), ceil(k/128))
  std::int64_t stride_sb = 0;             ///< floats between groups' scales
  void* c = nullptr;                      ///< bf16 (R, n), row stride ldc, read (beta != 0) and written
  std::int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  int device = 0, sm_count = 0;
};

/// var-M, B_e stored (n, k) row-major, e4m3 with 1x128 / 128x128 scales, bf16 C: 128x128x128
/// tiles, cooperative, fp32 promotion every K tile.
void var_m_bt_fp8_blockwise(const Fp8Problem& p, cudaStream_t stream);

}  // namespace ght::kernels::cuda::cutlass_grouped
