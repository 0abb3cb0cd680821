#pragma once
/**
 * @file fp8.hpp
 * @brief FP8 (e4m3) with block scales: the CPU reference for block-scaled FP8 GEMMs.
 *
 * e4m3 is the OCP FP8 format that Hopper's tensor cores read (`__nv_fp8_e4m3`): 1 sign bit, 4
 * exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111 the NaN; largest finite
 * value 448, smallest normal 2^-6, subnormal spacing 2^-9. Conversion rounds to nearest even and
 * saturates at ±448 (CUDA's `__NV_SATFINITE`); tests/kernels/cuda_fp8_test.cu checks both
 * directions against CUDA's own conversion.
 *
 * Block scaling (DeepSeek-V3's recipe): a tensor is cut into tiles (1 x 128 for activations,
 * 128 x 128 for weights), each with one fp32 scale s = amax / 448 of its values. A value x is
 * stored as e4m3(x · (448 / amax)) and read back as code · s. A GEMM multiplies codes per K tile
 * of 128, accumulates in fp32, and scales each tile's partial sum by s_A · s_B.
 *
 * Bounds (what the tests check): a value that scales into the normal range comes back within
 * 2^-4 of itself, relative (half of the 3-bit mantissa's spacing); one that scales below 2^-6
 * within 2^-10 · s, absolute (half the subnormal spacing).
 */
#include <cstdint>
#include <vector>

namespace ght::kernels::cpu {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr std::uint8_t kE4m3Nan = 0x7F;
inline constexpr int kFp8Tile = 128;  ///< K extent of a scale tile (and both sides of a weight block)

/// e4m3 code of x: round to nearest even, ±448 beyond the range, kE4m3Nan (sign kept) for NaN.
[[nodiscard]] std::uint8_t e4m3_from_float(float x) noexcept;
/// The value of an e4m3 code (NaN for S.1111.111).
[[nodiscard]] float e4m3_to_float(std::uint8_t code) noexcept;

/// A row-major (rows, cols) tensor in e4m3 codes with one fp32 scale per tile_rows x tile_cols tile.
struct Fp8Blocked {
  std::int64_t rows = 0, cols = 0;
  int tile_rows = 1, tile_cols = kFp8Tile;
  std::vector<std::uint8_t> codes;  ///< rows · cols
  std::vector<float> scales;        ///< ceil(rows / tile_rows) · ceil(cols / tile_cols), row-major

  [[nodiscard]] std::int64_t tiles_across() const { return (cols + tile_cols - 1) / tile_cols; }
  /// The scale of element (r, c).
  [[nodiscard]] float scale(std::int64_t r, std::int64_t c) const {
    return scales[static_cast<std::size_t>((r / tile_rows) * tiles_across() + c / tile_cols)];
  }
};

/**
 * @brief Block-scaled quantisation of x (rows, cols): per tile s = amax / 448 (0 for a tile of
 * zeros, whose codes are 0), codes e4m3(x · (448 / amax)). A tile holding a NaN or an infinity
 * is an error (ght::logic_error): its scale would carry it to every element.
 */
[[nodiscard]] Fp8Blocked quantize_blocked(const float* x, std::int64_t rows, std::int64_t cols, int tile_rows,
                                          int tile_cols);
/// out (rows, cols) = code · scale per element.
void dequantize_blocked(const Fp8Blocked& q, float* out);

/**
 * @brief C (M, N) = A (M, K) · B (N, K)^T from block-scaled operands, as an FP8 tensor-core GEMM
 * computes it: per K tile of kFp8Tile, the codes' products summed in fp32 in k order, then added
 * to C scaled by A's tile scale and B's. A's tiles must be 1 x kFp8Tile and B's kFp8Tile x kFp8Tile
 * (ght::logic_error otherwise, and for mismatched K).
 */
void matmul_nt_fp8(float* C, const Fp8Blocked& A, const Fp8Blocked& B);

}  // namespace ght::kernels::cpu
