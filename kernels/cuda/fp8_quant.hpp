#pragma once
/**
 * @file fp8_quant.hpp
 * @brief Block-scaled e4m3 quantisation on the GPU: the inputs of the FP8 expert GEMMs
 * (kernels/cuda/expert_gemm_fp8.hpp). Mirrors kernels/cpu/fp8.hpp bit for bit: per tile
 * s = amax / 448 and codes e4m3(x · (448 / amax)), both divisions and the product rounded to
 * nearest in fp32 (no fast-math contraction), the conversion CUDA's `__NV_SATFINITE` e4m3 one,
 * which tests/kernels/cuda_fp8_test.cu checks against the CPU's.
 *
 * Two tile shapes, as the GEMM reads them:
 *   activations  1 x 128: scales (rows, ceil(cols/128)) row-major, the CPU's Fp8Blocked layout
 *   weights    128 x 128: per group, scales (ceil(rows/128), ceil(cols/128)) row-major, groups
 *                        packed one after another (the CPU's layout per group)
 * Codes are written packed (row stride = cols; per group rows·cols apart for weights).
 *
 * A tile of zeros gets scale 0 and codes 0. A non-finite input gives its tile a non-finite scale
 * (the CPU reference throws instead; a kernel cannot): NaN when the tile holds a NaN, else +inf.
 *
 * FLOPs ≈ 3 per element. Bytes: 2 read + 1 written per element, plus 4 per tile (scales).
 *
 * Fused forms, so that the FP8 experts' activations need no pass of their own over HBM:
 * quantize_fp8_rows_scatter below (the token permutation's scatter) and swiglu_forward_fp8
 * (kernels/cuda/swiglu.hpp). Both write the same bits as quantize_fp8_rows on their bf16 output.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/// Extent of a scale tile along K (and both sides of a weight block); kernels/cpu/fp8's kFp8Tile.
inline constexpr int kFp8TileK = 128;

/**
 * @brief Quantise activations x (rows, cols) with one scale per 1 x 128 tile.
 * @param codes (rows, cols) e4m3, overwritten
 * @param scales (rows, ceil(cols/128)) fp32, overwritten
 * @param ldx row stride of x in elements (0 = cols)
 * @throws ght::logic_error on bad sizes; ght::cuda_error when the launch fails
 */
void quantize_fp8_rows(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* x, std::int64_t rows,
                       std::int64_t cols, std::int64_t ldx, cudaStream_t stream);

/**
 * @brief moe_permute_forward_by_token (kernels/cuda/permute.hpp) and quantize_fp8_rows, fused:
 * codes and scales row dst_row[a] are the 1 x 128 quantisation of x row a / K, for every
 * assignment a = t·K + k in [0, N·K) with dst_row[a] >= 0 (negative: not placed, skipped),
 * bit-identical to the two calls; the bf16 xp is never written. The K assignments of a token run
 * side by side, so x is read about once from HBM.
 *
 * FLOPs ≈ 3 per placed element. Bytes: 2·N·cols read, per placed row cols codes +
 * 4·ceil(cols/128) scales written, 4·N·K of dst_row; the two calls move 4·N·K·cols more (xp
 * written and read back).
 * @param codes (rows, cols) e4m3, the placed rows overwritten (rows >= the largest dst_row + 1)
 * @param scales (rows, ceil(cols/128)) fp32, the placed rows overwritten
 * @param x (N, cols) row-major, packed
 * @param dst_row (N·K) assignment -> row, as moe_permute_plan writes it
 * @throws ght::logic_error on bad sizes (N·K must fit int32) or a null pointer; ght::cuda_error
 *         when the launch fails
 */
void quantize_fp8_rows_scatter(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* x,
                               const std::int32_t* dst_row, std::int64_t N, int K, std::int64_t cols,
                               cudaStream_t stream);

/**
 * @brief Quantise `groups` weights w_g (rows, cols) with one scale per 128 x 128 block.
 * @param codes (groups, rows, cols) e4m3, overwritten
 * @param scales (groups, ceil(rows/128), ceil(cols/128)) fp32, overwritten
 * @param w group g at w + g·stride_w, row stride ldw (0 = cols); e.g. the gate/up rows of the
 *        flat per-expert layout with stride_w = 3·F·C
 * @throws ght::logic_error on bad sizes; ght::cuda_error when the launch fails
 */
void quantize_fp8_blocks(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* w, int groups,
                         std::int64_t rows, std::int64_t cols, std::int64_t ldw, std::int64_t stride_w,
                         cudaStream_t stream);

/**
 * @brief out (rows, cols) = code · scale, with tile_rows x tile_cols tiles (1 x 128 or 128 x 128)
 * and the scale layout above (one group). Tests and debugging.
 */
void dequantize_fp8(float* out, const __nv_fp8_e4m3* codes, const float* scales, std::int64_t rows,
                    std::int64_t cols, int tile_rows, int tile_cols, cudaStream_t stream);

}  // namespace ght::kernels::cuda
