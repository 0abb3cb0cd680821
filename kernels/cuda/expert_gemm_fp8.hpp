#pragma once
/**
 * @file expert_gemm_fp8.hpp
 * @brief Block-scaled FP8 grouped GEMM for the MoE experts' forward (var-M, B_e stored (n, k),
 * "trans_b"): group e owns rows [offsets[e], offsets[e+1]) of the permuted activations, as in
 * expert_gemm.hpp:
 *
 *   C[rows_e, :] = alpha·Â[rows_e, :]·B̂_e^T + beta·C[rows_e, :]
 *
 * where Â = A ⊙ sA and B̂_e = B_e ⊙ sB_e are e4m3 codes times their block scales (1 x 128 tiles
 * along k for the activations, 128 x 128 blocks for the weights; kernels/cuda/fp8_quant.hpp makes
 * both, kernels/cpu/fp8.hpp is the reference). Products of each K tile of 128 are summed on their
 * own and added to an fp32 sum scaled by the two tiles' scales; C is bf16.
 *
 * It runs CUTLASS's sm90 pointer-array block-scaled grouped GEMM (kernels/cuda/cutlass/
 * grouped_fp8.hpp): TMA + WGMMA, warp-specialised and persistent, 128x128x128 tiles. The group
 * sizes stay on the device (no stream synchronisation, graph-capturable once the stream scratch
 * buffer has grown). It needs a build with CUTLASS and an sm_90 device: fp8_gemm_available()
 * tells, and grouped_gemm_fp8() throws with the reason otherwise.
 *
 * Requirements (checked): device offsets; A, B, C 16-byte aligned; k, lda, ldb and stride_b
 * multiples of 16 (e4m3 rows in 16-byte units); n and ldc multiples of 8; sA with exactly
 * ceil(k/128) scales per row (CUTLASS derives that layout from the group's shape); n, k < 2^31.
 *
 * FLOPs: 2·R·n·k, R = offsets[E]. Bytes: R·k + E·n·k (codes) + 4·(R + E·ceil(n/128))·ceil(k/128)
 * (scales) + 2·R·n·(beta ? 2 : 1) (C).
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/expert_gemm.hpp"

namespace ght::kernels::cuda {

/// var-M block-scaled FP8: C[rows_e] = alpha·Â[rows_e]·B̂_e^T + beta·C[rows_e].
struct Fp8GroupedGemmVarM {
  std::int64_t n = 0, k = 0;
  const __nv_fp8_e4m3* a = nullptr;  ///< (R, k) codes, row stride lda (0 = k)
  std::int64_t lda = 0;
  const float* a_scales = nullptr;   ///< (R, ceil(k/128)) row-major (quantize_fp8_rows)
  const __nv_fp8_e4m3* b = nullptr;  ///< per group (n, k) codes, row stride ldb (0 = k)
  std::int64_t ldb = 0;
  std::int64_t stride_b = 0;         ///< elements between groups' B (0 = n·ldb)
  const float* b_scales = nullptr;   ///< per group (ceil(n/128), ceil(k/128)) row-major (quantize_fp8_blocks)
  std::int64_t stride_b_scales = 0;  ///< floats between groups' scales (0 = packed)
  __nv_bfloat16* c = nullptr;        ///< (R, n), row stride ldc (0 = n)
  std::int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
};

/// True when grouped_gemm_fp8() can run here: this build has CUTLASS and the current device is
/// sm_90 (H100/H200). Never throws (no device counts as unavailable).
[[nodiscard]] bool fp8_gemm_available() noexcept;

/// Why fp8_gemm_available() is false (no CUTLASS in this build, no CUDA device, or a device that
/// is not sm_90, named); empty when it is true.
[[nodiscard]] std::string fp8_gemm_unavailable_reason();

/**
 * @brief Run the block-scaled FP8 var-M grouped GEMM on `stream`.
 * @throws ght::logic_error when FP8 GEMMs are unavailable (the message gives the reason) or on
 *         bad arguments; ght::cuda_error on launch failures
 */
void grouped_gemm_fp8(const Fp8GroupedGemmVarM& args, const GroupOffsets& offsets, cudaStream_t stream);

}  // namespace ght::kernels::cuda
