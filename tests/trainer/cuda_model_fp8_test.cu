// The CUDA model with its experts' forward in FP8 (CudaModelOptions::fp8_experts, GHT_FP8=experts)
// against the same model in bf16: logits within a bound that e4m3's precision allows, the FP8
// copies made again after every weight change, and CUDA graph replays bit-identical to eager runs.
//
// The bound: e4m3 keeps 3 mantissa bits, so each quantised operand is within 2^-4 of its value
// relative to its tile's scale, and a product of two within about 2^-3; summed over K, the
// rounding errors of an expert GEMM's output partly cancel, leaving a few per cent of its norm.
// The experts' output is one term of the residual stream, which the LM head reads through the
// final norm, so the logits move by less than that: rel_l2 <= 5e-2 and cosine >= 0.998. The FP8
// path must also be visibly taken: rel_l2 > 1e-4 against bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/vector_compare.hpp"
#include "kernels/cuda/expert_gemm_fp8.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {
namespace {

ModelConfig fp8_config() {
  // The `small` preset's widths (d 256, 8 experts of 256, top-2, byte vocabulary), 2 layers of
  // 2 x 64 tokens: every GEMM's K is a multiple of 16, as the FP8 GEMM needs.
  ModelConfig c = preset("small");
  c.layers = 2;
  c.seq_len = 64;
  c.micro_batch = 2;
  c.top_k = 2;
  return c;
}

std::vector<std::int32_t> random_tokens(const ModelConfig& c, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  std::vector<std::int32_t> t(static_cast<std::size_t>(c.micro_batch) * c.seq_len);
  for (auto& x : t) x = tok(gen);
  return t;
}

CudaModelOptions options(bool fp8, bool graphs = false) {
  CudaModelOptions o;
  o.attention_impl = kernels::cuda::AttentionImpl::fallback;  // deterministic
  o.fp8_experts = fp8;
  o.cuda_graphs = graphs;
  return o;
}

std::vector<float> all_logits(CudaMoEModel& m, const std::vector<std::int32_t>& tokens) {
  const ModelConfig& c = m.config();
  std::vector<float> out(tokens.size() * static_cast<std::size_t>(c.vocab));
  m.logits(out.data(), tokens.data(), c.micro_batch, c.seq_len, false);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Skips with the reason where FP8 cannot run, after checking that the model refuses it there.
#define GHT_REQUIRE_FP8()                                                                         \
  do {                                                                                            \
    GHT_REQUIRE_GPU();                                                                            \
    if (!kernels::cuda::fp8_gemm_available()) {                                                   \
      EXPECT_THROW(CudaMoEModel(fp8_config(), options(true)), ght::config_error);                \
      GTEST_SKIP() << "FP8 GEMMs unavailable: " << kernels::cuda::fp8_gemm_unavailable_reason(); \
    }                                                                                             \
  } while (0)

TEST(CudaModelFp8, LogitsStayWithinTheE4m3BoundOfBf16) {
  GHT_REQUIRE_FP8();
  const ModelConfig c = fp8_config();
  const auto tokens = random_tokens(c, 5);
  CudaMoEModel bf(c, options(false)), f8(c, options(true));
  bf.init(3);
  f8.init(3);
  const auto ref = all_logits(bf, tokens), got = all_logits(f8, tokens);
  const ght::test::VectorError d = ght::test::compare_vectors(got, ref);
  std::printf("FP8 experts against bf16: logits rel_l2 %.3e, cosine %.6f\n", d.rel_l2, d.cosine);
  EXPECT_LE(d.rel_l2, 5e-2);
  EXPECT_GE(d.cosine, 0.998);
  EXPECT_GT(d.rel_l2, 1e-4) << "the FP8 path left the logits as bf16's: was it taken?";
  EXPECT_TRUE(same_bits(all_logits(f8, tokens), got)) << "FP8 forward not deterministic";
}

// New weights reach the FP8 copies: loaded, or written in place and announced by weights_changed()
// (as an optimizer update is), the logits equal a fresh model's with those weights.
TEST(CudaModelFp8, EveryWeightChangeIsQuantisedAgain) {
  GHT_REQUIRE_FP8();
  const ModelConfig c = fp8_config();
  const auto tokens = random_tokens(c, 6);
  CudaMoEModel fresh(c, options(true)), m(c, options(true));
  fresh.init(11);
  const auto want = all_logits(fresh, tokens);
  m.init(10);
  (void)all_logits(m, tokens);  // quantises seed 10's weights
  GHT_CUDA_TRY(cudaMemcpy(m.weights(), fresh.weights(), m.num_params() * 2, cudaMemcpyDeviceToDevice));
  m.weights_changed();
  EXPECT_TRUE(same_bits(all_logits(m, tokens), want)) << "written in place";
  std::vector<float> w(m.num_params());
  fresh.store_weights(w);
  m.init(10);
  (void)all_logits(m, tokens);
  m.load_weights(w);
  EXPECT_TRUE(same_bits(all_logits(m, tokens), want)) << "loaded";
}

// Micro-batches replayed from CUDA graphs, with the weights changed between steps, give eager
// runs' losses and gradients bit for bit: a micro-batch that re-quantises is a graph of its own.
TEST(CudaModelFp8, CudaGraphReplaysEqualEagerRunsAcrossWeightChanges) {
  GHT_REQUIRE_FP8();
  const ModelConfig c = fp8_config();
  CudaMoEModel donor(c, options(false));
  donor.init(21);
  auto run = [&](bool graphs, std::vector<Loss>& losses) {
    CudaMoEModel m(c, options(true, graphs));
    m.init(20);
    m.zero_grad();
    for (int step = 0; step < 3; ++step) {
      if (step == 2) {
        GHT_CUDA_TRY(cudaMemcpy(m.weights(), donor.weights(), m.num_params() * 2, cudaMemcpyDeviceToDevice));
      }
      m.weights_changed();
      for (int micro = 0; micro < 3; ++micro) {
        const auto t = random_tokens(c, static_cast<std::uint32_t>(100 + 3 * step + micro));
        losses.push_back(m.forward_backward(t.data(), t.data(), c.micro_batch, c.seq_len, 0.5f));
      }
    }
    std::vector<float> g(m.num_params());
    m.store_grads(g);
    return std::pair{g, m.cuda_graph_launches()};
  };
  std::vector<Loss> eager_l, graph_l;
  const auto [eager, n_eager] = run(false, eager_l);
  const auto [graphed, n_graphed] = run(true, graph_l);
  EXPECT_EQ(n_eager, 0);
  EXPECT_GT(n_graphed, 0) << "no micro-batch ran as a graph launch";
  ASSERT_EQ(eager_l.size(), graph_l.size());
  for (std::size_t i = 0; i < eager_l.size(); ++i) {
    EXPECT_EQ(graph_l[i].ce, eager_l[i].ce) << "micro-batch " << i;
    EXPECT_EQ(graph_l[i].aux, eager_l[i].aux) << "micro-batch " << i;
  }
  EXPECT_TRUE(same_bits(eager, graphed)) << "accumulated gradients differ between graph replays and eager runs";
}

}  // namespace
}  // namespace ght::trainer
