// GPU test of kernels/cuda/lm_head_ce against kernels/cpu/lm_head_ce (fp32 logits on the CPU,
// bf16 logits on the GPU as in Hugging Face).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/lm_head_ce.hpp"
#include "kernels/cuda/lm_head_ce.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

std::vector<std::int32_t> random_targets(std::int64_t n, int v, std::uint32_t seed,
                                         double ignore_frac) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, v - 1);
  std::bernoulli_distribution ign(ignore_frac);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = ign(gen) ? cpu::kIgnoreIndex : d(gen);
  return t;
}

std::vector<float> sub(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

struct Case {
  std::int64_t n;
  int c, v;
  std::int64_t chunk;
  double ignore_frac;
};
// V % 8 == 0 takes the vector path (also at 102,408 and Qwen3's 151,936), V = 517, 1031 and
// 60,001 the scalar one; chunks do not divide N. {333, 96, 1031, 333} and {1000, 128, 4104, 1000} are one
// chunk of every row (the trainer's default, trainer/regions.hpp: default_ce_chunk_rows), N not a
// multiple of 64: dW accumulated once over all N rows.
const Case kCases[] = {{300, 64, 1000, 128, 0.1}, {77, 72, 517, 32, 0.3},  {64, 64, 2048, 1000, 0.0},
                       {20, 64, 96, 8, 1.0},      {333, 96, 1031, 333, 0.1}, {1000, 128, 4104, 1000, 0.05},
                       {40, 64, 151936, 40, 0.1}, {24, 32, 102408, 10, 0.0}, {12, 32, 60001, 12, 0.2}};

// dw_beta 1: dW accumulates onto dw0; 0: dW is assigned, so the device dW starts as NaN bytes
// and the reference's at zero.
template <typename DW>
void run_case(const Case& cs, std::uint32_t seed, float dw_beta = 1.0f) {
  SCOPED_TRACE(::testing::Message() << "N=" << cs.n << " C=" << cs.c << " V=" << cs.v << " chunk="
                                    << cs.chunk << " ignore=" << cs.ignore_frac
                                    << " dw=" << (sizeof(DW) == 4 ? "f32" : "bf16") << " dw_beta=" << dw_beta);
  const bool assign = dw_beta == 0.0f;
  const std::int64_t N = cs.n;
  const int C = cs.c, V = cs.v;
  const auto x = random_bf16_values(N * C, seed);
  const auto w = random_bf16_values(static_cast<std::int64_t>(V) * C, seed + 1, -0.25f, 0.25f);
  const auto dw0 = random_bf16_values(static_cast<std::int64_t>(V) * C, seed + 2, -0.01f, 0.01f);
  const auto tg = random_targets(N, V, seed + 3, cs.ignore_frac);
  const float dloss = 1.5f;
  std::vector<float> lse(N), dx(N * C), dw = assign ? std::vector<float>(dw0.size(), 0.0f) : dw0;
  const auto res = cpu::lm_head_ce_forward<float>(lse.data(), x.data(), w.data(), tg.data(), N, C,
                                                  V, cpu::kIgnoreIndex, 64);
  cpu::lm_head_ce_backward<float>(dx.data(), dw.data(), x.data(), w.data(), tg.data(), lse.data(),
                                  N, C, V, dloss, res.valid, cpu::kIgnoreIndex, 64);

  TestStream stream;
  auto d_x = upload_bf16(x);
  auto d_w = upload_bf16(w);
  DeviceBuffer<std::int32_t> d_tg(tg), d_valid(1);
  DeviceBuffer<float> d_loss(1), d_lse(N), d_loss2(1);
  const std::size_t ws_bytes = kc::lm_head_ce_workspace_bytes(std::min<std::int64_t>(cs.chunk, N), V);
  DeviceBuffer<char> ws(ws_bytes);
  DeviceBuffer<bf16> d_dx(N * C);
  d_dx.poison();
  kc::CeOutputs out;
  out.loss = d_loss.get();
  out.valid = d_valid.get();
  out.lse = d_lse.get();
  std::vector<float> got_dw;
  if constexpr (sizeof(DW) == 4) {
    DeviceBuffer<float> d_dw(dw0);
    if (assign) d_dw.poison(0xff);
    kc::lm_head_ce_forward_backward(out, d_dx.get(), d_dw.get(), d_x.get(), d_w.get(), d_tg.get(),
                                    N, C, V, dloss, kc::kCeIgnoreIndex, cs.chunk, ws.get(),
                                    ws_bytes, stream.get(), dw_beta);
    stream.sync();
    got_dw = d_dw.download();
  } else {
    auto d_dw = upload_bf16(dw0);
    if (assign) d_dw.poison(0xff);
    kc::lm_head_ce_forward_backward(out, d_dx.get(), d_dw.get(), d_x.get(), d_w.get(), d_tg.get(),
                                    N, C, V, dloss, kc::kCeIgnoreIndex, cs.chunk, ws.get(),
                                    ws_bytes, stream.get(), dw_beta);
    stream.sync();
    got_dw = download_f32(d_dw);
  }
  // Evaluation variant: the same loss from a separate call (no lse output).
  kc::CeOutputs out2;
  out2.loss = d_loss2.get();
  kc::lm_head_ce_forward(out2, d_x.get(), d_w.get(), d_tg.get(), N, C, V, kc::kCeIgnoreIndex,
                         cs.chunk, ws.get(), ws_bytes, stream.get());
  stream.sync();

  EXPECT_EQ(d_valid.download()[0], res.valid);
  // bf16 logits: each logit is off by up to 2^-9 of its size (|logit| < ~2 here), so lse and the
  // mean loss move by a few 1e-3 at most.
  const float loss = d_loss.download()[0];
  EXPECT_NEAR(loss, res.loss, 5e-3 + 2e-3 * std::fabs(res.loss));
  EXPECT_EQ(d_loss2.download()[0], loss);  // same kernels, same order: bit-identical
  EXPECT_TRUE(all_close("lse", d_lse.download(), lse, 5e-3f, 2e-3f));
  const float sdx = std::max(max_abs(dx), 1e-6f), sdw = std::max(max_abs(assign ? dw : sub(dw, dw0)), 1e-6f);
  EXPECT_TRUE(all_close("dx", download_f32(d_dx), dx, 2e-2f * sdx, 2e-2f));
  EXPECT_TRUE(all_close("dw", got_dw, dw, 2e-2f * sdw, sizeof(DW) == 4 ? 1e-3f : 8e-3f));
}

TEST(CudaLmHeadCe, ForwardBackwardMatchCpuFp32Dw) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& c : kCases) run_case<float>(c, seed += 10);
}

TEST(CudaLmHeadCe, ForwardBackwardMatchCpuBf16Dw) {
  GHT_REQUIRE_GPU();
  run_case<bf16>(kCases[0], 500);
  run_case<bf16>(kCases[4], 600);  // one chunk: the bf16 dW rounds once instead of per chunk
}

// dw_beta 0 (GradWrite::assign, a training step's first micro-batch): a dW of NaN bytes comes out
// as the gradient alone, over several chunks (only the first assigns), one chunk, all targets
// ignored, and a bf16 dW; with no rows it comes out zero; other betas are refused.
TEST(CudaLmHeadCe, DwBetaZeroAssignsTheGradient) {
  GHT_REQUIRE_GPU();
  run_case<float>(kCases[0], 700, 0.0f);
  run_case<float>(kCases[4], 710, 0.0f);
  run_case<float>(kCases[3], 720, 0.0f);
  run_case<bf16>(kCases[1], 730, 0.0f);
  const int C = 64, V = 96;
  TestStream stream;
  DeviceBuffer<float> d_dw(static_cast<std::size_t>(V) * C), d_loss(1);
  DeviceBuffer<std::int32_t> d_valid(1);
  DeviceBuffer<bf16> d_w(static_cast<std::size_t>(V) * C);
  d_dw.poison(0xff);
  kc::CeOutputs out;
  out.loss = d_loss.get();
  out.valid = d_valid.get();
  kc::lm_head_ce_forward_backward(out, nullptr, d_dw.get(), nullptr, d_w.get(), nullptr, 0, C, V, 1.0f,
                                  kc::kCeIgnoreIndex, 8, nullptr, 0, stream.get(), 0.0f);
  stream.sync();
  EXPECT_TRUE(all_close("dw", d_dw.download(), std::vector<float>(static_cast<std::size_t>(V) * C, 0.0f), 0.0f, 0.0f));
  EXPECT_EQ(d_valid.download()[0], 0);
  EXPECT_THROW(kc::lm_head_ce_forward_backward(out, nullptr, d_dw.get(), nullptr, d_w.get(), nullptr, 0, C, V,
                                               1.0f, kc::kCeIgnoreIndex, 8, nullptr, 0, stream.get(), 0.5f),
               ght::logic_error);
}

TEST(CudaLmHeadCe, BadTargetsAreReported) {
  GHT_REQUIRE_GPU();
  TestStream stream;
  DeviceBuffer<std::int32_t> d_tg(std::vector<std::int32_t>{1, -100, 5, 17, 2});
  EXPECT_NO_THROW(kc::lm_head_ce_check_targets(d_tg.get(), 3, 10, kc::kCeIgnoreIndex, stream.get()));
  try {
    kc::lm_head_ce_check_targets(d_tg.get(), 5, 10, kc::kCeIgnoreIndex, stream.get());
    ADD_FAILURE() << "no exception";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
  }
}

TEST(CudaLmHeadCe, RejectsSmallWorkspace) {
  char ws[16];
  kc::CeOutputs out;
  EXPECT_THROW(kc::lm_head_ce_forward(out, nullptr, nullptr, nullptr, 10, 8, 100,
                                      kc::kCeIgnoreIndex, 4, ws, sizeof(ws), nullptr),
               ght::logic_error);
}

}  // namespace
