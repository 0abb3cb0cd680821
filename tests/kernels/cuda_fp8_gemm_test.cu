// GPU test of kernels/cuda/fp8_quant and kernels/cuda/expert_gemm_fp8: the block-scaled e4m3
// quantisation against kernels/cpu/fp8 bit for bit (both tile shapes, with outliers, tiny values
// and a zero tile), and the FP8 grouped GEMM against two references: the exact product of the
// dequantised operands (tight: only accumulation order and the bf16 output may differ) and the
// bf16 product (a bound from e4m3's precision, growing with sqrt(k)).
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/fp8.hpp"
#include "kernels/cuda/expert_gemm_fp8.hpp"
#include "kernels/cuda/fp8_quant.hpp"
#include "kernels/cuda_test_util.hpp"
#include "kernels/fp8_test_values.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;
using fp8 = __nv_fp8_e4m3;

using ght::test::codes_of;  // beside the overload for the CPU's codes below
std::vector<std::uint32_t> codes_of(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }

// Activations (rows, cols) with row stride ldx: GPU codes, scales and dequantised values against
// quantize_blocked(1 x 128) and dequantize_blocked.
void check_rows(std::int64_t rows, std::int64_t cols, std::int64_t ldx, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " cols=" << cols << " ldx=" << ldx);
  auto x = values_with_outliers(static_cast<std::size_t>(rows * ldx), seed);
  // One tile of zeros, negative zeros among them (scale 0, codes 0 or 0x80 as the CPU's).
  if (rows > 3) {
    for (std::int64_t c = 0; c < std::min<std::int64_t>(cols, cpu::kFp8Tile); ++c) x[3 * ldx + c] = c % 2 ? -0.0f : 0.0f;
  }
  std::vector<float> packed(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) packed[r * cols + c] = x[r * ldx + c];
  const cpu::Fp8Blocked ref = cpu::quantize_blocked(packed.data(), rows, cols, 1, cpu::kFp8Tile);

  TestStream stream;
  auto d_x = upload_bf16(x);
  DeviceBuffer<fp8> d_codes(packed.size());
  DeviceBuffer<float> d_scales(ref.scales.size());
  DeviceBuffer<float> d_deq(packed.size());
  d_codes.poison();
  d_scales.poison();
  kc::quantize_fp8_rows(d_codes.get(), d_scales.get(), d_x.get(), rows, cols, ldx, stream.get());
  kc::dequantize_fp8(d_deq.get(), d_codes.get(), d_scales.get(), rows, cols, 1, kc::kFp8TileK, stream.get());
  stream.sync();
  EXPECT_TRUE(all_equal("codes", codes_of(d_codes.download()), codes_of(ref.codes)));
  EXPECT_TRUE(all_equal("scale bits", bits_of(d_scales.download()), bits_of(ref.scales)));
  std::vector<float> deq(packed.size());
  cpu::dequantize_blocked(ref, deq.data());
  EXPECT_TRUE(all_equal("dequantised bits", bits_of(d_deq.download()), bits_of(deq)));
}

// `groups` weights (rows, cols), row stride ldw, stride_w apart: against quantize_blocked(128 x 128)
// per group.
void check_blocks(int groups, std::int64_t rows, std::int64_t cols, std::int64_t ldw, std::int64_t stride_w,
                  std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "groups=" << groups << " rows=" << rows << " cols=" << cols
                                    << " ldw=" << ldw << " stride_w=" << stride_w);
  const auto w = values_with_outliers(static_cast<std::size_t>(groups * stride_w), seed);
  std::vector<std::uint8_t> ref_codes;
  std::vector<float> ref_scales, ref_deq;
  for (int g = 0; g < groups; ++g) {
    std::vector<float> packed(static_cast<std::size_t>(rows * cols));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) packed[r * cols + c] = w[g * stride_w + r * ldw + c];
    const cpu::Fp8Blocked q = cpu::quantize_blocked(packed.data(), rows, cols, cpu::kFp8Tile, cpu::kFp8Tile);
    ref_codes.insert(ref_codes.end(), q.codes.begin(), q.codes.end());
    ref_scales.insert(ref_scales.end(), q.scales.begin(), q.scales.end());
    if (g == 0) {
      ref_deq.resize(packed.size());
      cpu::dequantize_blocked(q, ref_deq.data());
    }
  }
  TestStream stream;
  auto d_w = upload_bf16(w);
  DeviceBuffer<fp8> d_codes(ref_codes.size());
  DeviceBuffer<float> d_scales(ref_scales.size());
  DeviceBuffer<float> d_deq(static_cast<std::size_t>(rows * cols));
  d_codes.poison();
  d_scales.poison();
  kc::quantize_fp8_blocks(d_codes.get(), d_scales.get(), d_w.get(), groups, rows, cols, ldw, stride_w, stream.get());
  kc::dequantize_fp8(d_deq.get(), d_codes.get(), d_scales.get(), rows, cols, kc::kFp8TileK, kc::kFp8TileK,
                     stream.get());
  stream.sync();
  EXPECT_TRUE(all_equal("codes", codes_of(d_codes.download()), codes_of(ref_codes)));
  EXPECT_TRUE(all_equal("scale bits", bits_of(d_scales.download()), bits_of(ref_scales)));
  EXPECT_TRUE(all_equal("dequantised bits (group 0)", bits_of(d_deq.download()), bits_of(ref_deq)));
}

TEST(CudaFp8Quant, ActivationTilesMatchCpuBitForBit) {
  GHT_REQUIRE_GPU();
  check_rows(129, 800, 800, 11);    // 16-byte path, a partial last tile (800 = 6·128 + 32)
  check_rows(300, 4096, 4104, 12);  // padded rows
  check_rows(37, 325, 333, 13);     // element path: cols and ldx not multiples of 8
  check_rows(5, 100, 100, 14);      // one partial tile per row
}

TEST(CudaFp8Quant, WeightBlocksMatchCpuBitForBit) {
  GHT_REQUIRE_GPU();
  check_blocks(1, 256, 256, 256, 256 * 256, 21);           // whole blocks
  check_blocks(3, 200, 800, 800, 200 * 800 + 64, 22);      // partial blocks both ways, padded groups
  check_blocks(2, 130, 136, 144, 130 * 144 + 8, 23);       // padded rows
  check_blocks(2, 131, 325, 325, 131 * 325 + 1, 24);       // element path
}

// ---- the grouped GEMM -----------------------------------------------------------------------

// Empty groups, one row, partial and several 128-row tiles.
const std::vector<std::int32_t> kCounts = {0, 37, 130, 1, 0, 200, 9, 256};

std::vector<std::int32_t> offsets_of(const std::vector<std::int32_t>& counts) {
  std::vector<std::int32_t> off(counts.size() + 1, 0);
  for (std::size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

// Fails the test (GHT_TEST_REQUIRE_GPU=1 and a device that cannot run it) or skips it, with the reason.
#define GHT_REQUIRE_FP8_GEMM()                                                                      \
  do {                                                                                             \
    GHT_REQUIRE_GPU();                                                                             \
    if (!kc::fp8_gemm_available()) {                                                               \
      if (kc::cutlass_available() && ::ght::test::gpu_required_by_env()) {                         \
        FAIL() << "GHT_TEST_REQUIRE_GPU=1 but FP8 GEMMs cannot run: " << kc::fp8_gemm_unavailable_reason(); \
      }                                                                                            \
      GTEST_SKIP() << "FP8 grouped GEMM unavailable: " << kc::fp8_gemm_unavailable_reason();       \
    }                                                                                              \
  } while (0)

void run_gemm(std::int64_t n, std::int64_t k, float alpha, float beta, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " alpha=" << alpha << " beta=" << beta);
  const auto off = offsets_of(kCounts);
  const int E = static_cast<int>(kCounts.size());
  const std::int64_t R = off[E], T = cpu::kFp8Tile;
  const std::int64_t kt = (k + T - 1) / T, nt = (n + T - 1) / T;
  const std::int64_t stride_w = n * k + 32;  // padded between experts (a multiple of 16)
  const auto a = values_with_outliers(static_cast<std::size_t>(R * k), seed);
  const auto w = values_with_outliers(static_cast<std::size_t>(E * stride_w), seed + 1);
  const auto c0 = random_bf16_values(static_cast<std::size_t>(R * n), seed + 2);

  TestStream stream;
  auto d_a = upload_bf16(a);
  auto d_w = upload_bf16(w);
  auto d_c = upload_bf16(c0);
  DeviceBuffer<std::int32_t> d_off(off);
  DeviceBuffer<fp8> d_qa(static_cast<std::size_t>(R * k)), d_qw(static_cast<std::size_t>(E * n * k));
  DeviceBuffer<float> d_sa(static_cast<std::size_t>(R * kt)), d_sw(static_cast<std::size_t>(E * nt * kt));
  kc::quantize_fp8_rows(d_qa.get(), d_sa.get(), d_a.get(), R, k, k, stream.get());
  kc::quantize_fp8_blocks(d_qw.get(), d_sw.get(), d_w.get(), E, n, k, k, stride_w, stream.get());

  kc::Fp8GroupedGemmVarM g;
  g.n = n;
  g.k = k;
  g.a = d_qa.get();
  g.a_scales = d_sa.get();
  g.b = d_qw.get();
  g.b_scales = d_sw.get();
  g.c = d_c.get();
  g.alpha = alpha;
  g.beta = beta;
  kc::GroupOffsets o;
  o.groups = E;
  o.device = d_off.get();
  o.max_rows = R;
  kc::grouped_gemm_fp8(g, o, stream.get());
  stream.sync();
  const auto got = download_f32(d_c);

  // The operands the GEMM saw (the quantisation is checked against the CPU above).
  const auto qa = codes_of(d_qa.download()), qw = codes_of(d_qw.download());
  const auto sa = d_sa.download(), sw = d_sw.download();
  float decoded[256];
  for (int c = 0; c < 256; ++c) decoded[c] = cpu::e4m3_to_float(static_cast<std::uint8_t>(c));

  // Tight: the exact (double) sum over K tiles of sA·sB·Σ code·code. The kernel differs only by
  // the accumulation and the bf16 output (2^-9 relative, doubled for margin). Within one 128-deep
  // tile Hopper's FP8 tensor cores add with fewer bits than fp32 (about 14 kept, as DeepSeek-V3
  // measured), hence a term relative to Σ|â·b̂| (2^-9: 4 WGMMAs of 32 products per tile, each
  // aligned to its largest term and cut to ~2^-13 of it, of random sign); the tiles' scaled sums
  // are then added in fp32.
  // bf16: the product of the bf16 inputs. Each operand carries up to 2^-4 relative error (or
  // 2^-10·s absolute below e4m3's normal range); the per-product errors e_k are rounding errors
  // of either sign, so their sum grows like sqrt(Σ e_k²) (6 standard deviations of a uniform
  // error, e_k/sqrt(3) each), capped by the worst case Σ e_k; plus the two terms above.
  std::vector<float> ref_q(got.size()), ref_bf(got.size()), bound_q(got.size()), bound_bf(got.size());
  for (int e = 0; e < E; ++e) {
    const std::int64_t wbase = e * n * k, sbase = e * nt * kt;
    for (std::int64_t r = off[e]; r < off[e + 1]; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        double q = 0, q_abs = 0, bf = 0, err_sq = 0, err_sum = 0;
        for (std::int64_t t = 0; t < kt; ++t) {
          const double s_a = sa[r * kt + t], s_b = sw[sbase + (j / T) * kt + t];
          double part = 0, part_abs = 0;
          for (std::int64_t p = t * T; p < std::min(k, (t + 1) * T); ++p) {
            const double ca = decoded[qa[r * k + p]], cb = decoded[qw[wbase + j * k + p]];
            part += ca * cb;
            part_abs += std::fabs(ca * cb);
            const double va = a[r * k + p], vb = w[e * stride_w + j * k + p];
            bf += va * vb;
            const double da = std::max(0x1p-4 * std::fabs(va), 0x1p-10 * s_a);
            const double db = std::max(0x1p-4 * std::fabs(vb), 0x1p-10 * s_b);
            const double ek = da * std::fabs(vb) + std::fabs(va) * db + da * db;
            err_sq += ek * ek;
            err_sum += ek;
          }
          q += s_a * s_b * part;
          q_abs += s_a * s_b * part_abs;
        }
        const std::size_t i = static_cast<std::size_t>(r * n + j);
        ref_q[i] = static_cast<float>(alpha * q + beta * c0[i]);
        ref_bf[i] = static_cast<float>(alpha * bf + beta * c0[i]);
        bound_q[i] = static_cast<float>(0x1p-8 * std::fabs(ref_q[i]) + 0x1p-9 * std::fabs(alpha) * q_abs);
        bound_bf[i] = static_cast<float>(0x1p-8 * std::fabs(ref_bf[i]) + 0x1p-9 * std::fabs(alpha) * q_abs +
                                         std::fabs(alpha) * std::min(err_sum, 6.0 * std::sqrt(err_sq / 3.0)));
      }
    }
  }
  // all_close's tol + |ref|·eps with eps = 0 and a per-element tol: compare err/bound against 1.
  auto normalised = [&](const std::vector<float>& ref, const std::vector<float>& bound) {
    std::vector<float> z(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) z[i] = (got[i] - ref[i]) / std::max(bound[i], 1e-30f);
    return z;
  };
  const std::vector<float> zeros(got.size(), 0.0f);
  const auto zq = normalised(ref_q, bound_q), zb = normalised(ref_bf, bound_bf);
  EXPECT_TRUE(all_close("(C - dequantised reference) / bound", zq, zeros, 1.0f, 0.0f));
  EXPECT_TRUE(all_close("(C - bf16 reference) / bound", zb, zeros, 1.0f, 0.0f));
  // The margins, for whoever tightens or loosens a bound: the worst |error| / bound of each.
  std::printf("[          ] n=%lld k=%lld worst |err|/bound: dequantised %.3g, bf16 %.3g\n",
              static_cast<long long>(n), static_cast<long long>(k), max_abs(zq), max_abs(zb));
}

TEST(CudaFp8GroupedGemm, MatchesDequantisedAndBf16References) {
  GHT_REQUIRE_FP8_GEMM();
  run_gemm(264, 800, 1.0f, 0.0f, 100);   // partial N and K tiles (the experts' down projection has k = 800)
  run_gemm(128, 256, 0.5f, 0.75f, 200);  // whole tiles, alpha and beta
  run_gemm(520, 1024, 1.0f, 0.0f, 300);  // several N tiles, eight K tiles
}

TEST(CudaFp8GroupedGemm, AllGroupsEmptyLeavesCUntouched) {
  GHT_REQUIRE_FP8_GEMM();
  const std::int64_t n = 128, k = 128;
  const std::vector<std::int32_t> off = {0, 0, 0, 0};
  TestStream stream;
  DeviceBuffer<std::int32_t> d_off(off);
  DeviceBuffer<fp8> d_q(static_cast<std::size_t>(3 * n * k));
  DeviceBuffer<float> d_s(16);
  DeviceBuffer<bf16> d_c(16);
  d_c.poison(0x3f);
  const auto before = d_c.download();
  kc::Fp8GroupedGemmVarM g;
  g.n = n;
  g.k = k;
  g.a = d_q.get();
  g.a_scales = d_s.get();
  g.b = d_q.get();
  g.b_scales = d_s.get();
  g.c = d_c.get();
  kc::GroupOffsets o;
  o.groups = 3;
  o.device = d_off.get();
  kc::grouped_gemm_fp8(g, o, stream.get());
  stream.sync();
  const auto after = d_c.download();
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_EQ(__bfloat16_as_ushort(after[i]), __bfloat16_as_ushort(before[i]));
}

TEST(CudaFp8GroupedGemm, RejectsMisalignedShapes) {
  GHT_REQUIRE_FP8_GEMM();
  DeviceBuffer<std::int32_t> d_off(std::vector<std::int32_t>{0, 16});
  DeviceBuffer<fp8> d_q(4096);
  DeviceBuffer<float> d_s(64);
  DeviceBuffer<bf16> d_c(4096);
  kc::Fp8GroupedGemmVarM g;
  g.n = 128;
  g.k = 24;  // not a multiple of 16
  g.a = d_q.get();
  g.a_scales = d_s.get();
  g.b = d_q.get();
  g.b_scales = d_s.get();
  g.c = d_c.get();
  kc::GroupOffsets o;
  o.groups = 1;
  o.device = d_off.get();
  EXPECT_THROW(kc::grouped_gemm_fp8(g, o, nullptr), ght::logic_error);
  g.k = 32;
  g.n = 20;  // not a multiple of 8
  EXPECT_THROW(kc::grouped_gemm_fp8(g, o, nullptr), ght::logic_error);
}

// Without CUTLASS or an sm_90 device the entry point says why instead of running anything. Runs
// on any machine (no device needed).
TEST(CudaFp8GroupedGemm, UnavailableThrowsWithTheReason) {
  if (kc::fp8_gemm_available()) GTEST_SKIP() << "FP8 grouped GEMM available here; nothing to refuse";
  const std::string why = kc::fp8_gemm_unavailable_reason();
  EXPECT_FALSE(why.empty());
  kc::Fp8GroupedGemmVarM g;
  g.n = 128;
  g.k = 128;
  kc::GroupOffsets o;
  try {
    kc::grouped_gemm_fp8(g, o, nullptr);
    ADD_FAILURE() << "grouped_gemm_fp8 ran although FP8 GEMMs are unavailable (" << why << ")";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

}  // namespace
