#pragma once
/**
 * @file expert_gemm.hpp
 * @brief Grouped GEMMs for the MoE experts over tokens in expert order (kernels/cuda/permute.hpp):
 * group e owns rows [offsets[e], offsets[e+1]) of the permuted activations. Row-major, bf16
 * inputs, fp32 accumulation.
 *
 * Two shapes cover an expert MLP's forward and backward:
 *   var-M (forward, data gradient): C[rows_e, :] = alpha·A[rows_e, :]·op(B_e) + beta·C[rows_e, :]
 *       e.g. gate_up = xp·Wgu_e^T, y = act·Wd_e^T, dact = dy·Wd_e, dxp = dgu·Wgu_e
 *   var-K (weight gradient):       C_e = alpha·A[rows_e, :]^T·B[rows_e, :] + beta·C_e
 *       e.g. dWgu_e += dgu_e^T·xp_e, dWd_e += dy_e^T·act_e
 *
 * Implementations (all kept; bench/kernels/bench_expert_gemm.cu compares them):
 *   cublaslt_loop   one cuBLASLt GEMM per non-empty expert. Needs the offsets on the HOST: when
 *                   only device offsets are given, they are copied down, which SYNCHRONISES the
 *                   stream once per call. Supports every output type.
 *   cublaslt_streams the same per-expert GEMMs, spread round-robin over kExpertStreams side
 *                   streams forked from (and joined back into) the caller's stream with events.
 *                   An expert of a few hundred rows gives one GEMM only tens of tiles, a third
 *                   of an H100/H200's 132 SMs; several in flight fill the GPU. Each side stream
 *                   has its own cuBLASLt workspace. Side streams are per host thread and device.
 *   cublas_grouped  cublasGemmGroupedBatchedEx (cuBLAS >= 12.5): one call for all experts, but
 *                   its per-group sizes are host arrays too (same sync). Its bf16 inputs need a
 *                   bf16 output (cuBLAS supports no bf16 -> fp32 grouped GEMM), so fp32 C throws.
 *   custom          our own grouped kernel (WMMA bf16 tensor cores, 128x128x32 tiles, two-stage
 *                   cp.async pipeline): reads the offsets on the device and never synchronises;
 *                   fp32 or bf16 output. Needs the contiguous dimensions (k, and n unless
 *                   trans_b, for var-M; m and n for var-K), the leading dimensions and stride_b
 *                   to be multiples of 8 and A/B 16-byte aligned.
 *   cutlass         CUTLASS's sm90 pointer-array grouped GEMM (TMA + WGMMA, warp-specialised,
 *                   persistent; kernels/cuda/cutlass/), the kind PyTorch's _grouped_mm runs. The
 *                   problem sizes stay on the device (a small kernel derives them from the
 *                   offsets), so it never synchronises either. Covers var-M with bf16 C and
 *                   var-K with bf16 or fp32 C, all operands 16-byte aligned with leading
 *                   dimensions (and stride_b / stride_c) that keep every row 16-byte aligned,
 *                   n and k (var-M) or m and n (var-K) multiples of 8; any other call runs
 *                   `custom` instead (cutlass_covers() tells which). Only in builds with CUTLASS
 *                   (cutlass_available()); elsewhere asking for it throws. Tiles: var-M
 *                   128x256x64, var-K 128x128x64, both cooperative. On the H200 128x256 was the
 *                   fastest var-M tile in every case measured (7 MoE shapes x 4 data GEMMs: 0.57-
 *                   1.01 of dense against 0.51-0.84 for 128x128; 128x128 ping-pong and 128x160
 *                   lost too), so the others were removed (bench/NOTES.md, "CUTLASS tile variants for the
 *                   expert data GEMMs" and "A 128×160 expert tile").
 *
 * FLOPs: 2·R·n·k (var-M) or 2·m·n·R (var-K), R = offsets[E]. Bytes: 2·(R·k + E·n·k) + R·n·sizeof(C)
 * (var-M); 2·R·(m + n) + E·m·n·sizeof(C)·(beta ? 2 : 1) (var-K).
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/cuda/gemm.hpp"

namespace ght::kernels::cuda {

enum class GroupedGemmImpl : int { cublaslt_loop = 0, cublas_grouped = 1, custom = 2, cublaslt_streams = 3, cutlass = 4 };

/// Side streams of GroupedGemmImpl::cublaslt_streams.
inline constexpr int kExpertStreams = 4;

/// True for the implementations that need the group offsets on the host.
[[nodiscard]] constexpr bool needs_host_offsets(GroupedGemmImpl impl) noexcept {
  return impl != GroupedGemmImpl::custom && impl != GroupedGemmImpl::cutlass;
}

/// True when this build has the CUTLASS grouped GEMM (CMake found CUTLASS; sm_90a kernels).
[[nodiscard]] bool cutlass_available() noexcept;

/// The default implementation: cutlass when built in (no host sync), else cublaslt_streams
/// (which downloads the offsets once per layer).
[[nodiscard]] GroupedGemmImpl default_grouped_gemm_impl() noexcept;

[[nodiscard]] std::string_view to_string(GroupedGemmImpl impl) noexcept;

/// Group offsets: device copy always (custom reads it), host copy when the caller has one
/// (saves the loop and cuBLAS-grouped paths their synchronising download).
struct GroupOffsets {
  int groups = 0;                               ///< E
  const std::int32_t* device = nullptr;         ///< (E+1), offsets[0] = 0, non-decreasing
  const std::int32_t* host = nullptr;           ///< (E+1) or nullptr
  /// Upper bound of offsets[E] (the rows allocated, e.g. N·K). The custom var-M kernel sizes
  /// its grid with it, since it never reads the offsets on the host.
  std::int64_t max_rows = 0;
};

/// var-M: C[rows_e] = alpha·A[rows_e]·op(B_e) + beta·C[rows_e], B_e = b + e·stride_b.
struct GroupedGemmVarM {
  std::int64_t n = 0, k = 0;
  const __nv_bfloat16* a = nullptr;  ///< (R, k) with row stride lda (0 = k)
  std::int64_t lda = 0;
  const __nv_bfloat16* b = nullptr;  ///< per group (k, n), or (n, k) when trans_b; row stride ldb
  std::int64_t ldb = 0;              ///< 0 = packed
  std::int64_t stride_b = 0;         ///< elements between groups' B (e.g. 3·F·C in the flat layout)
  bool trans_b = false;
  void* c = nullptr;                 ///< (R, n) with row stride ldc (0 = n)
  DType c_type = DType::bf16;
  std::int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
};

/// var-K: C_e = alpha·A[rows_e]^T·B[rows_e] + beta·C_e, C_e = c + e·stride_c.
struct GroupedGemmVarK {
  std::int64_t m = 0, n = 0;
  const __nv_bfloat16* a = nullptr;  ///< (R, m), row stride lda (0 = m)
  std::int64_t lda = 0;
  const __nv_bfloat16* b = nullptr;  ///< (R, n), row stride ldb (0 = n)
  std::int64_t ldb = 0;
  void* c = nullptr;                 ///< per group (m, n), row stride ldc (0 = n)
  DType c_type = DType::f32;
  std::int64_t ldc = 0;
  std::int64_t stride_c = 0;         ///< elements between groups' C
  float alpha = 1.0f, beta = 1.0f;   ///< weight gradients accumulate by default
};

/**
 * @brief Run a var-M grouped GEMM with the chosen implementation.
 * @throws ght::logic_error on bad arguments or an unsupported combination (see above);
 *         ght::cuda_error on library failures
 */
void grouped_gemm(const GroupedGemmVarM& args, const GroupOffsets& offsets, GroupedGemmImpl impl,
                  cudaStream_t stream);

/// Run a var-K grouped GEMM (weight gradients). Groups with no rows get C_e = beta·C_e.
void grouped_gemm(const GroupedGemmVarK& args, const GroupOffsets& offsets, GroupedGemmImpl impl,
                  cudaStream_t stream);

/// True when GroupedGemmImpl::cutlass runs this call itself (this build has CUTLASS and the call
/// is one it covers, see the file comment); false when it would run `custom` instead.
[[nodiscard]] bool cutlass_covers(const GroupedGemmVarM& args);
[[nodiscard]] bool cutlass_covers(const GroupedGemmVarK& args);

/// Copy the (E+1) device offsets to the host. Synchronises `stream`.
[[nodiscard]] std::vector<std::int32_t> download_offsets(const std::int32_t* device_offsets,
                                                         int groups, cudaStream_t stream);

}  // namespace ght::kernels::cuda
