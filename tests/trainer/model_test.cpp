// The Qwen3-MoE model on the CPU backend: HF parameter names and layout, init, whole-model
// gradient vs finite differences in double, float-vs-double forward, logits vs loss, document
// masking, micro-batch accumulation, thread-count determinism and error handling.
#include "trainer/model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <tuple>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/fd_check.hpp"
#include "tier/error.hpp"

using ght::trainer::Loss;
using ght::trainer::ModelConfig;
using ght::trainer::MoEModel;

namespace {

// The model-test shape from the brief: d 16, 2 layers, 4 experts.
ModelConfig small_config(bool tied) {
  ModelConfig c;
  c.name = "model-test";
  c.d_model = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 12;
  c.vocab = 29;
  c.tied_embeddings = tied;
  c.aux_loss_coef = 0.1;  // larger than the defaults so these terms weigh in the FD check
  c.z_loss_coef = 0.05;
  c.validate();
  return c;
}

struct Batch {
  int B, T;
  std::vector<std::int32_t> tokens, targets, docs;
};

Batch make_batch(const ModelConfig& c, int B, int T, std::uint64_t seed) {
  Batch b{B, T, {}, {}, {}};
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(tok(g));
    b.targets.push_back(tok(g));
    b.docs.push_back((i % T) < T / 2 ? 0 : 1);  // two documents per row
  }
  b.targets[1] = ght::trainer::kIgnoreIndex;
  return b;
}

// Spread the weights wider than the 0.02 init so the check is well conditioned, and give the
// routers large weights so the top-k choices have clear gaps (the FD steps must not flip them).
template <class T>
void condition(MoEModel<T>& m, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (const auto& t : m.tensors()) {
    auto p = m.params().subspan(t.offset, t.numel);
    const bool router = t.name.find("mlp.gate.weight") != std::string::npos;
    const double sd = t.shape.size() == 1 ? 0.2 : router ? 1.0 : 0.35;
    const double mean = t.shape.size() == 1 ? 1.0 : 0.0;
    for (auto& v : p) v = static_cast<T>(mean + sd * n(g));
  }
}

template <class T>
std::vector<std::vector<std::int32_t>> routing(const MoEModel<T>& m) {
  std::vector<std::vector<std::int32_t>> r;
  for (int l = 0; l < m.config().layers; ++l) {
    auto s = m.topk_indices(l);
    r.emplace_back(s.begin(), s.end());
  }
  return r;
}

}  // namespace

TEST(Model, HuggingFaceNamesShapesAndLayout) {
  for (bool tied : {true, false}) {
    const auto c = small_config(tied);
    MoEModel<float> m(c);
    std::map<std::string, std::vector<std::int64_t>> want = {
        {"model.embed_tokens.weight", {29, 16}}, {"model.norm.weight", {16}}};
    if (!tied) want["lm_head.weight"] = {29, 16};
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      want[p + "input_layernorm.weight"] = {16};
      want[p + "post_attention_layernorm.weight"] = {16};
      want[p + "self_attn.q_proj.weight"] = {32, 16};
      want[p + "self_attn.k_proj.weight"] = {16, 16};
      want[p + "self_attn.v_proj.weight"] = {16, 16};
      want[p + "self_attn.o_proj.weight"] = {16, 32};
      want[p + "self_attn.q_norm.weight"] = {8};
      want[p + "self_attn.k_norm.weight"] = {8};
      want[p + "mlp.gate.weight"] = {4, 16};
      for (int e = 0; e < 4; ++e) {
        const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
        want[pe + "gate_proj.weight"] = {12, 16};
        want[pe + "up_proj.weight"] = {12, 16};
        want[pe + "down_proj.weight"] = {16, 12};
      }
    }
    ASSERT_EQ(m.tensors().size(), want.size());
    std::size_t next = 0;
    for (const auto& t : m.tensors()) {
      ASSERT_TRUE(want.count(t.name)) << "unexpected tensor " << t.name;
      EXPECT_EQ(t.shape, want[t.name]) << t.name;
      EXPECT_EQ(t.offset, next) << t.name << " is not packed";
      std::size_t n = 1;
      for (auto s : t.shape) n *= static_cast<std::size_t>(s);
      EXPECT_EQ(t.numel, n);
      EXPECT_EQ(t.decay, t.shape.size() != 1) << t.name;
      next += t.numel;
    }
    EXPECT_EQ(static_cast<std::int64_t>(m.params().size()), c.total_params());
    EXPECT_EQ(m.grads().size(), m.params().size());
    EXPECT_EQ(m.param("model.layers.1.mlp.gate.weight").size(), 64u);
    EXPECT_THROW((void)m.tensor("model.layers.9.mlp.gate.weight"), ght::logic_error);
  }
}

// The two FLOP counts of seed-21b (d 4096, 40 heads x 128, 8 kv heads, 30 layers, 64 experts of
// ffn 800 with top-4, V 151936 tied, T 4096), counted here by hand from the shapes.
TEST(Model, StrictAndSeedFlopCountsOfTheSeedShape) {
  const ModelConfig c = ght::trainer::preset("seed-21b");
  const double d = 4096, q = 40 * 128, kv = 8 * 128, L = 30, T = 4096, V = 151936;
  const double attention = d * q + 2 * d * kv + q * d + 2 * 128;  // q, k, v, o + q/k norms
  const double dense = attention + d * 64 + 2 * d;                // + router + 2 norms
  const double active_experts = 4 * 3 * d * 800;
  const double n_active_nonembedding = L * (dense + active_experts) + d;  // + final norm
  EXPECT_EQ(static_cast<double>(c.active_nonembedding_params()), n_active_nonembedding);
  EXPECT_DOUBLE_EQ(c.flops_per_token(), 6 * n_active_nonembedding + 12 * L * 40 * 128 * T);
  // The seed's count: embeddings in N (once: tied) and d_model, not heads x head_dim, in attention.
  EXPECT_DOUBLE_EQ(c.seed_flops_per_token(), 6 * (n_active_nonembedding + V * d) + 12 * L * T * d);
  EXPECT_NEAR(c.seed_flops_per_token() / c.flops_per_token(), 1.094, 0.001);
  // Untied, the LM head's weights count too.
  ModelConfig u = c;
  u.tied_embeddings = false;
  EXPECT_DOUBLE_EQ(u.seed_flops_per_token() - c.seed_flops_per_token(), 6 * V * d);
  EXPECT_DOUBLE_EQ(u.flops_per_token(), c.flops_per_token());
}

TEST(Model, InitIsHfLikeAndSeeded) {
  MoEModel<float> a(small_config(false)), b(small_config(false));
  a.init(42);
  b.init(42);
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  b.init(43);
  EXPECT_FALSE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  double s = 0, s2 = 0, n = 0;
  for (const auto& t : a.tensors()) {
    for (std::size_t i = 0; i < t.numel; ++i) {
      const double v = a.params()[t.offset + i];
      if (t.shape.size() == 1) {
        ASSERT_EQ(v, 1.0) << t.name;
      } else {
        s += v;
        s2 += v * v;
        n += 1;
      }
    }
  }
  EXPECT_NEAR(s / n, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(s2 / n), 0.02, 0.001);
}

class ModelGradP : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ModelGradP, WholeModelGradientMatchesFiniteDifferences) {
  const auto [tied, docs] = GetParam();
  const auto c = small_config(tied);
  ght::trainer::ModelOptions opts;
  opts.reset_positions_at_doc = docs;
  opts.ce_chunk_rows = 5;  // several chunks, last one partial
  MoEModel<double> m(c, opts);
  condition(m, 1234);
  const Batch b = make_batch(c, 2, 7, 99);
  const std::int32_t* dp = docs ? b.docs.data() : nullptr;

  const Loss l0 = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T, dp);
  EXPECT_GT(l0.aux, 0.0);
  EXPECT_GT(l0.z, 0.0);
  EXPECT_NEAR(l0.total, l0.ce + c.aux_loss_coef * l0.aux + c.z_loss_coef * l0.z, 1e-12);
  const auto route0 = routing(m);
  m.zero_grad();
  m.backward(1.0);
  std::vector<double> analytic(m.grads().begin(), m.grads().end());

  // ~60 entries: one from every tensor plus random extras.
  std::vector<double> x(m.params().begin(), m.params().end());
  std::vector<std::size_t> pick;
  std::mt19937_64 g(5);
  for (const auto& t : m.tensors()) pick.push_back(t.offset + g() % t.numel);
  while (pick.size() < 60) pick.push_back(g() % x.size());
  std::vector<double> sub_x(pick.size()), sub_g(pick.size());
  for (std::size_t i = 0; i < pick.size(); ++i) {
    sub_x[i] = x[pick[i]];
    sub_g[i] = analytic[pick[i]];
  }
  auto loss = [&] {
    for (std::size_t i = 0; i < pick.size(); ++i) m.params()[pick[i]] = sub_x[i];
    const double v = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T, dp).total;
    EXPECT_EQ(routing(m), route0) << "a finite-difference step changed the routing";
    return v;
  };
  ght::test::fd_check(loss, sub_x, sub_g, std::string("model tied=") + (tied ? "1" : "0") +
                                              " docs=" + (docs ? "1" : "0"),
                      pick.size());
}

INSTANTIATE_TEST_SUITE_P(TiedDocs, ModelGradP,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(Model, BackwardAccumulatesAndScales) {
  const auto c = small_config(false);
  MoEModel<double> m(c);
  condition(m, 7);
  const Batch b = make_batch(c, 2, 5, 3);
  m.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
  m.zero_grad();
  m.backward(1.0);
  const std::vector<double> once(m.grads().begin(), m.grads().end());
  m.zero_grad();
  m.backward(0.25);
  m.backward(0.75);  // same forward, two scaled backwards
  ght::test::expect_close(std::vector<double>(m.grads().begin(), m.grads().end()), once, 1e-14,
                          1e-12, "accumulated grads");
}

TEST(Model, FloatForwardMatchesDouble) {
  const auto c = small_config(false);
  MoEModel<double> md(c);
  MoEModel<float> mf(c);
  condition(md, 11);
  for (std::size_t i = 0; i < md.params().size(); ++i)
    mf.params()[i] = static_cast<float>(md.params()[i]);
  for (std::size_t i = 0; i < md.params().size(); ++i) md.params()[i] = mf.params()[i];
  const Batch b = make_batch(c, 2, 9, 4);
  const Loss ld = md.forward(b.tokens.data(), b.targets.data(), b.B, b.T, b.docs.data());
  const Loss lf = mf.forward(b.tokens.data(), b.targets.data(), b.B, b.T, b.docs.data());
  EXPECT_LE(ght::test::rel_err(lf.ce, ld.ce), 1e-5);
  EXPECT_LE(ght::test::rel_err(lf.aux, ld.aux), 1e-5);
  EXPECT_LE(ght::test::rel_err(lf.z, ld.z), 1e-5);
  EXPECT_LE(ght::test::rel_err(lf.total, ld.total), 1e-5);
  EXPECT_EQ(routing(md), routing(mf));
  std::vector<float> od(2 * 9 * c.vocab), of(od.size());
  md.logits(od.data(), b.tokens.data(), b.B, b.T, false);
  mf.logits(of.data(), b.tokens.data(), b.B, b.T, false);
  double mx = 0;
  for (float v : od) mx = std::max(mx, std::abs(double(v)));
  ght::test::expect_close(of, od, 1e-5 * mx, 1e-5, "float vs double logits");
}

TEST(Model, LogitsAgreeWithTheLoss) {
  const auto c = small_config(true);
  MoEModel<double> m(c);
  m.init(3);
  const Batch b = make_batch(c, 2, 6, 8);
  const Loss l = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
  std::vector<float> lg(2 * 6 * c.vocab), last(2 * c.vocab);
  m.logits(lg.data(), b.tokens.data(), b.B, b.T, false);
  m.logits(last.data(), b.tokens.data(), b.B, b.T, true);
  double sum = 0;
  int n = 0;
  for (int i = 0; i < 12; ++i) {
    if (b.targets[i] == ght::trainer::kIgnoreIndex) continue;
    const float* r = lg.data() + i * c.vocab;
    double mx = -1e300, s = 0;
    for (int v = 0; v < c.vocab; ++v) mx = std::max(mx, double(r[v]));
    for (int v = 0; v < c.vocab; ++v) s += std::exp(r[v] - mx);
    sum += mx + std::log(s) - r[b.targets[i]];
    ++n;
  }
  EXPECT_NEAR(sum / n, l.ce, 1e-6);  // logits are returned in fp32
  for (int bb = 0; bb < 2; ++bb)
    for (int v = 0; v < c.vocab; ++v)
      EXPECT_EQ(last[bb * c.vocab + v], lg[(bb * 6 + 5) * c.vocab + v]);
  EXPECT_THROW(m.backward(), ght::logic_error);  // logits() invalidates the saved forward
}

TEST(Model, DocumentMaskingIsolatesPackedDocuments) {
  // With doc masking and position reset, a packed document sees exactly what it would see alone.
  const auto c = small_config(false);
  ght::trainer::ModelOptions opts;
  opts.reset_positions_at_doc = true;
  MoEModel<double> m(c, opts);
  condition(m, 21);
  const std::vector<std::int32_t> packed = {3, 9, 1, 4, 4, 20, 7, 11};
  const std::vector<std::int32_t> docs = {0, 0, 0, 5, 5, 5, 5, 5};
  const std::vector<std::int32_t> alone = {4, 4, 20, 7, 11};
  std::vector<float> lp(8 * c.vocab), la(5 * c.vocab);
  m.logits(lp.data(), packed.data(), 1, 8, false, docs.data());
  m.logits(la.data(), alone.data(), 1, 5, false);
  for (int i = 0; i < 5 * c.vocab; ++i) ASSERT_NEAR(lp[3 * c.vocab + i], la[i], 1e-5) << i;
  // without the mask, the second document does see the first
  m.logits(lp.data(), packed.data(), 1, 8, false);
  double diff = 0;
  for (int i = 0; i < 5 * c.vocab; ++i) diff = std::max(diff, double(std::abs(lp[3 * c.vocab + i] - la[i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(Model, GradientsAreThreadCountIndependent) {
  // Bit-exact resume needs the same gradients whatever OMP_NUM_THREADS is.
  auto c = ght::trainer::preset("tiny");
  MoEModel<float> m(c);
  m.init(1);
  const Batch b = make_batch(c, 2, 64, 5);
  auto run = [&] {
    m.zero_grad();
    const Loss l = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T, b.docs.data());
    m.backward(1.0f);
    return std::make_tuple(l.total, l.ce, std::vector<float>(m.grads().begin(), m.grads().end()));
  };
  const auto many = run();
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  const auto one = run();
#ifdef _OPENMP
  omp_set_num_threads(saved);
#endif
  EXPECT_EQ(std::get<0>(many), std::get<0>(one));
  EXPECT_TRUE(std::get<2>(many) == std::get<2>(one)) << "gradients differ between thread counts";
  EXPECT_NEAR(std::get<1>(many), std::log(256.0), 0.15);  // near-uniform predictions at init
}

TEST(Model, ErrorsNameTheProblem) {
  const auto c = small_config(true);
  MoEModel<float> m(c);
  m.init(1);
  EXPECT_THROW(m.backward(), ght::logic_error);  // no forward yet
  std::vector<std::int32_t> tok = {1, 2, 29}, tgt = {1, 2, 3};
  try {
    m.forward(tok.data(), tgt.data(), 1, 3);
    FAIL() << "no throw";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 29"), std::string::npos) << e.what();
  }
  tok[2] = 0;
  tgt[0] = -5;
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 3), ght::logic_error);
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 0, 3), ght::logic_error);
  ModelConfig bad = c;
  bad.kv_heads = 3;
  EXPECT_THROW(MoEModel<float>{bad}, ght::logic_error);
}
