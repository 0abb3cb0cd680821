// GPU test of the fused FP8 activation quantisation: quantize_fp8_rows_scatter
// (kernels/cuda/fp8_quant) against moe_permute_forward_by_token + quantize_fp8_rows, and
// swiglu_forward_fp8 (kernels/cuda/swiglu) against swiglu_forward + quantize_fp8_rows, bit for bit
// (codes as bytes, scales as bit patterns, act as bytes). router_route_forward without its gather,
// which the FP8 experts use, is checked in cuda_router_test.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cuda/fp8_quant.hpp"
#include "kernels/cuda/permute.hpp"
#include "kernels/cuda/router.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "kernels/cuda_test_util.hpp"
#include "kernels/fp8_test_values.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
using fp8 = __nv_fp8_e4m3;

std::vector<std::uint32_t> bf16_bits_of(const std::vector<bf16>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint16_t>(v[i]);
  return b;
}

// Rows [r·width, (r+1)·width) of v for the rows r with keep[r].
template <typename T>
std::vector<T> rows_kept(const std::vector<T>& v, std::size_t width, const std::vector<bool>& keep) {
  std::vector<T> out;
  for (std::size_t r = 0; r < keep.size(); ++r)
    if (keep[r]) out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(r * width),
                            v.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
  return out;
}

// K distinct experts of E per token, uniformly.
std::vector<std::int32_t> random_topk(std::int64_t N, int K, int E, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(N * K));
  std::vector<std::int32_t> all(E);
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t t = 0; t < N; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::copy_n(all.begin(), K, idx.begin() + t * K);
  }
  return idx;
}

// ---- quantize_fp8_rows_scatter ---------------------------------------------------------------

// dst_row from moe_permute_plan of random top-k ids (a permutation of [0, N·K)), with a few
// assignments then marked as not placed (-1); x with a row of zeros and large values.
void check_scatter(std::int64_t N, int K, std::int64_t cols, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " K=" << K << " cols=" << cols);
  constexpr int E = 8;
  const std::int64_t A = N * K, across = (cols + kc::kFp8TileK - 1) / kc::kFp8TileK;
  auto x = values_with_outliers(static_cast<std::size_t>(N * cols), seed);
  const std::int64_t zero_token = N > 5 ? 5 : -1;  // the special rows where the tokens exist
  if (zero_token >= 0) {
    for (std::int64_t c = 0; c < cols; ++c) x[zero_token * cols + c] = c % 3 ? 0.0f : -0.0f;
  }
  if (N > 7) x[7 * cols + cols / 2] = 3.0e38f;  // near bf16's max
  if (N > 11) x[11 * cols] = -round_bf16(1.0e30f);

  TestStream stream;
  DeviceBuffer<std::int32_t> d_tidx(random_topk(N, K, E, seed + 1)), d_off(E + 1), d_src(A), d_dst(A);
  kc::moe_permute_plan(d_off.get(), d_src.get(), d_dst.get(), d_tidx.get(), N, K, E, stream.get());
  stream.sync();
  auto dst = d_dst.download();
  std::vector<std::int32_t> sorted = dst;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t a = 0; a < A; ++a) ASSERT_EQ(sorted[a], a) << "dst_row is not a permutation";
  if (A > 4) {  // a few assignments not placed (a single one stays placed)
    for (const std::int64_t a : {std::int64_t{0}, std::int64_t{3}, A / 2, A - 1}) dst[a] = -1;
  }
  d_dst.upload(dst);
  std::vector<bool> placed(static_cast<std::size_t>(A), false);
  for (const auto r : dst)
    if (r >= 0) placed[r] = true;

  auto d_x = upload_bf16(x);
  DeviceBuffer<bf16> d_xp(A * cols);
  DeviceBuffer<fp8> d_codes(A * cols), d_ref_codes(A * cols);
  DeviceBuffer<float> d_scales(A * across), d_ref_scales(A * across);
  d_xp.poison();
  d_codes.poison();
  d_scales.poison();
  d_ref_codes.poison(0x3c);
  d_ref_scales.poison(0x3c);
  kc::moe_permute_forward_by_token(d_xp.get(), d_x.get(), d_dst.get(), N, K, static_cast<int>(cols), stream.get());
  kc::quantize_fp8_rows(d_ref_codes.get(), d_ref_scales.get(), d_xp.get(), A, cols, cols, stream.get());
  kc::quantize_fp8_rows_scatter(d_codes.get(), d_scales.get(), d_x.get(), d_dst.get(), N, K, cols, stream.get());
  stream.sync();

  const auto codes = codes_of(d_codes.download()), ref_codes = codes_of(d_ref_codes.download());
  const auto scales = bits_of(d_scales.download()), ref_scales = bits_of(d_ref_scales.download());
  const auto w = static_cast<std::size_t>(cols), ws = static_cast<std::size_t>(across);
  EXPECT_TRUE(all_equal("codes of placed rows", rows_kept(codes, w, placed), rows_kept(ref_codes, w, placed)));
  EXPECT_TRUE(all_equal("scale bits of placed rows", rows_kept(scales, ws, placed), rows_kept(ref_scales, ws, placed)));
  // Rows nobody placed keep the poison (0x7f bytes).
  std::vector<bool> unplaced(placed.size());
  for (std::size_t r = 0; r < placed.size(); ++r) unplaced[r] = !placed[r];
  const auto left = rows_kept(codes, w, unplaced);
  EXPECT_TRUE(all_equal("codes of unplaced rows", left, std::vector<std::uint32_t>(left.size(), 0x7fu)));
  // The zero token's rows: scale 0.
  for (int k = 0; zero_token >= 0 && k < K; ++k) {
    const std::int32_t r = dst[zero_token * K + k];
    if (r >= 0) EXPECT_EQ(scales[static_cast<std::size_t>(r) * ws], 0u) << "zero row " << r;
  }
}

// 4096: whole tiles, 16-byte path; 800: a partial last tile; 96: one partial tile; 100: the
// element path (cols not a multiple of 8).
TEST(CudaFp8Fused, ScatterQuantiseMatchesPermuteThenQuantise) {
  GHT_REQUIRE_GPU();
  check_scatter(37, 4, 4096, 101);
  check_scatter(37, 4, 800, 102);
  check_scatter(37, 4, 96, 103);
  check_scatter(37, 4, 100, 104);
  check_scatter(1, 1, 800, 105);
}

TEST(CudaFp8Fused, ScatterQuantiseRejectsBadArguments) {
  auto* codes = reinterpret_cast<fp8*>(std::uintptr_t{256});
  auto* scales = reinterpret_cast<float*>(std::uintptr_t{256});
  auto* x = reinterpret_cast<const bf16*>(std::uintptr_t{256});
  auto* dst = reinterpret_cast<const std::int32_t*>(std::uintptr_t{256});
  EXPECT_THROW(kc::quantize_fp8_rows_scatter(codes, scales, x, dst, 4, 0, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::quantize_fp8_rows_scatter(codes, scales, x, dst, -1, 2, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::quantize_fp8_rows_scatter(codes, scales, x, nullptr, 4, 2, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::quantize_fp8_rows_scatter(codes, nullptr, x, dst, 4, 2, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::quantize_fp8_rows_scatter(codes, scales, x, dst, std::int64_t{1} << 30, 4, 128, nullptr),
               ght::logic_error);
  EXPECT_NO_THROW(kc::quantize_fp8_rows_scatter(nullptr, nullptr, nullptr, nullptr, 0, 4, 128, nullptr));
}

// ---- swiglu_forward_fp8 ----------------------------------------------------------------------

// gate/up as the fused gate_up GEMM writes them (one (R, 2F) tensor, ld_in = 2F), act with row
// stride ld_act; gate has a row of zeros (act 0: scale 0) and outliers on both.
void check_swiglu(std::int64_t R, int F, std::int64_t ld_act, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "R=" << R << " F=" << F << " ld_act=" << ld_act);
  const std::int64_t ld_in = 2 * static_cast<std::int64_t>(F), across = (F + kc::kFp8TileK - 1) / kc::kFp8TileK;
  auto gu = values_with_outliers(static_cast<std::size_t>(R * ld_in), seed, -4.0f, 4.0f);
  const std::int64_t zero_row = R > 2 ? 2 : -1;  // where the row exists
  for (int c = 0; zero_row >= 0 && c < F; ++c) gu[zero_row * ld_in + c] = 0.0f;

  TestStream stream;
  auto d_gu = upload_bf16(gu);
  const bf16* gate = d_gu.get();
  const bf16* up = d_gu.get() + F;
  DeviceBuffer<bf16> d_act(R * ld_act), d_ref_act(R * ld_act);
  DeviceBuffer<fp8> d_codes(R * F), d_ref_codes(R * F);
  DeviceBuffer<float> d_scales(R * across), d_ref_scales(R * across);
  for (auto* b : {&d_act, &d_ref_act}) b->poison();  // the padding columns must stay as they are
  d_codes.poison();
  d_scales.poison();
  d_ref_codes.poison(0x3c);
  d_ref_scales.poison(0x3c);
  kc::swiglu_forward(d_ref_act.get(), ld_act, gate, up, ld_in, R, F, stream.get());
  kc::quantize_fp8_rows(d_ref_codes.get(), d_ref_scales.get(), d_ref_act.get(), R, F, ld_act, stream.get());
  kc::swiglu_forward_fp8(d_act.get(), ld_act, d_codes.get(), d_scales.get(), gate, up, ld_in, R, F, stream.get());
  stream.sync();

  EXPECT_TRUE(all_equal("act bits", bf16_bits_of(d_act.download()), bf16_bits_of(d_ref_act.download())));
  EXPECT_TRUE(all_equal("codes", codes_of(d_codes.download()), codes_of(d_ref_codes.download())));
  const auto scales = bits_of(d_scales.download());
  EXPECT_TRUE(all_equal("scale bits", scales, bits_of(d_ref_scales.download())));
  for (std::int64_t t = 0; zero_row >= 0 && t < across; ++t) {
    EXPECT_EQ(scales[zero_row * across + t], 0u) << "zero row, tile " << t;
  }
}

// 800: a partial last tile (6·128 + 32); 128: one whole tile; 96: one partial tile; 100: the
// element path (F not a multiple of 8). ld_act = F and a padded ld_act.
TEST(CudaFp8Fused, SwigluQuantiseMatchesSwigluThenQuantise) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 200;
  for (const int F : {800, 128, 96}) {
    check_swiglu(53, F, F, ++seed);
    check_swiglu(53, F, F + 24, ++seed);
  }
  check_swiglu(53, 100, 100, ++seed);
  check_swiglu(53, 100, 107, ++seed);
  check_swiglu(1, 800, 800, ++seed);
}

TEST(CudaFp8Fused, SwigluQuantiseRejectsBadArguments) {
  auto* act = reinterpret_cast<bf16*>(std::uintptr_t{256});
  auto* codes = reinterpret_cast<fp8*>(std::uintptr_t{256});
  auto* scales = reinterpret_cast<float*>(std::uintptr_t{256});
  const bf16* in = act;
  EXPECT_THROW(kc::swiglu_forward_fp8(act, 100, codes, scales, in, in, 256, 4, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::swiglu_forward_fp8(act, 128, codes, scales, in, in, 100, 4, 128, nullptr), ght::logic_error);
  EXPECT_THROW(kc::swiglu_forward_fp8(act, 128, codes, scales, in, in, 256, 4, 0, nullptr), ght::logic_error);
  EXPECT_THROW(kc::swiglu_forward_fp8(act, 128, nullptr, scales, in, in, 256, 4, 128, nullptr), ght::logic_error);
  EXPECT_NO_THROW(kc::swiglu_forward_fp8(act, 128, codes, scales, in, in, 256, 0, 128, nullptr));
}

}  // namespace
