// DiLoCo's outer step on one process (trainer/diloco.hpp): several steps against torch's SGD
// with nesterov=True written out here; bf16 pseudo-gradients; where its state is allocated; and
// the exact statement of "H=1, outer lr 1, momentum 0 is data parallel" on one worker.
// Several ranks: tests/trainer/mpi/diloco_mpi_test.cpp; the CLI: tests/cli/train_diloco_test.sh.
#include "trainer/diloco.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "alloc/tiered.hpp"
#include "trainer/model_config.hpp"
#include "optimizer/bf16.hpp"
#include "tier/error.hpp"

namespace ght::trainer {
namespace {

std::vector<float> random_values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

DilocoConfig config(double lr, double mu, bool bf16) {
  DilocoConfig c;
  c.inner_steps = 4;
  c.outer_lr = lr;
  c.outer_momentum = mu;
  c.bf16_pseudo_grads = bf16;
  return c;
}

// Three outer steps, each from a fresh θ_local near θ_global, against the reference; the norm is
// that of the pseudo-gradient; global() and local() both end at the new θ_global.
void check_against_reference(bool bf16) {
  const std::size_t n = 1000;
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  const DilocoConfig cfg = config(0.7, 0.9, bf16);
  DilocoOuter o(cfg, n, *comm, *a);
  std::vector<float> g = random_values(n, 1, 0.05f), buf(n, 0.0f);
  std::copy(g.begin(), g.end(), o.global().begin());
  for (int s = 0; s < 3; ++s) {
    std::vector<float> local = g;
    const std::vector<float> moved = random_values(n, 10 + s, 3e-3f);
    for (std::size_t i = 0; i < n; ++i) local[i] -= moved[i];
    std::copy(local.begin(), local.end(), o.local().begin());
    const double norm = o.step();
    double sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float d = g[i] - local[i];
      if (bf16) d = optimizer::bf16_bits_to_float(optimizer::float_to_bf16_bits(d));
      sq += static_cast<double>(d) * d;
      buf[i] = 0.9f * buf[i] + d;                 // torch: buf.mul_(momentum).add_(grad)
      g[i] = g[i] - 0.7f * (d + 0.9f * buf[i]);  // grad.add(buf, alpha=momentum); p.add_(grad, alpha=-lr)
    }
    // A few fp32 roundings per step: where the compiler contracts the update into FMAs (aarch64),
    // the parameters drift from this unfused reference by an ulp, and the next norm by ~1e-8.
    EXPECT_NEAR(norm, std::sqrt(sq), 1e-6 * std::sqrt(sq)) << "outer step " << s;
    EXPECT_EQ(o.last_allreduce_bytes(), n * (bf16 ? 2 : 4)) << "bf16 pseudo-gradients go as 2 bytes each";
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(o.global()[i], g[i], 1e-7f) << "outer step " << s << " parameter " << i;
      ASSERT_EQ(o.local()[i], o.global()[i]) << "θ_local is set to θ_global";
      ASSERT_NEAR(o.momentum()[i], buf[i], 1e-7f);
    }
  }
}

TEST(DilocoOuter, FollowsNesterovSgdOnThePseudoGradient) { check_against_reference(false); }

TEST(DilocoOuter, Bf16PseudoGradientsAreRoundedBeforeTheAllReduce) { check_against_reference(true); }

TEST(DilocoOuter, StateComesFromTheRunsAllocatorOnTheHost) {
  const std::size_t n = 4096;
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  const auto master0 = a->class_usage(TensorClass::master).current;
  const auto other0 = a->class_usage(TensorClass::other).current;
  {
    DilocoOuter o(config(0.7, 0.9, false), n, *comm, *a);
    EXPECT_EQ(a->class_usage(TensorClass::master).current - master0, n * sizeof(float));  // θ_global
    EXPECT_EQ(a->class_usage(TensorClass::other).current - other0, 2 * n * sizeof(float));  // momentum, Δ
    EXPECT_EQ(a->where(o.global().data())->tier, TierKind::host);
    EXPECT_EQ(a->where(o.momentum().data())->region, "diloco.momentum");
  }
  EXPECT_EQ(a->class_usage(TensorClass::master).current, master0);
  EXPECT_EQ(a->class_usage(TensorClass::other).current, other0);
}

// "DiLoCo with H=1, outer lr 1 and momentum 0 is data parallel", on one worker, exactly: the
// inner step is the data-parallel AdamW step, and the outer step then returns
// θ = fl(θ_g − fl(θ_g − θ_l)). That is θ_l bit for bit whenever the fp32 pseudo-gradient
// θ_g − θ_l is exact, which Sterbenz's lemma guarantees for θ_l within a factor 2 of θ_g (same
// sign); it is not in general (a weight near zero that an update moves past zero or by more than
// its size), where the result is off by at most half an ulp of the pseudo-gradient. So the two
// runs agree to rounding, not bit for bit (tests/cli/train_diloco_test.sh bounds the losses).
TEST(DilocoOuter, OneWorkerWithLrOneAndNoMomentumReturnsItsWeightsWhereThePseudoGradientIsExact) {
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  const std::size_t n = 10000;
  DilocoOuter o(config(1.0, 0.0, false), n, *comm, *a);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mag(1e-3f, 2.0f), ratio(0.5f, 2.0f);
  std::vector<float> local(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = (i % 2 ? -1.0f : 1.0f) * mag(gen);
    o.global()[i] = g;
    local[i] = g * ratio(gen);  // within a factor 2: θ_g − θ_l is exact
  }
  std::copy(local.begin(), local.end(), o.local().begin());
  (void)o.step();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(o.global()[i], local[i]) << "parameter " << i;

  // Outside Sterbenz's range: 1 − 2^-30 rounds to 1 in fp32, so the update is lost entirely.
  DilocoOuter far(config(1.0, 0.0, false), 1, *comm, *a);
  far.global()[0] = 1.0f;
  far.local()[0] = std::ldexp(1.0f, -30);
  (void)far.step();
  EXPECT_EQ(far.global()[0], 0.0f);
}

TEST(DilocoOuter, DueEveryHStepsAndAtTheLastStep) {
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  DilocoOuter o(config(0.7, 0.9, false), 1, *comm, *a);  // H = 4
  std::vector<std::int64_t> due;
  for (std::int64_t s = 1; s <= 10; ++s) {
    if (o.due(s, 10)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<std::int64_t>{4, 8, 10}));
}

// Streaming DiLoCo's pieces on one process (several ranks and the loop:
// tests/trainer/mpi/diloco_mpi_test.cpp).
TEST(StreamingDiloco, FragmentsDealTheUnitsByStride) {
  const MoEModel<float> m(preset("tiny"));  // 2 layers: units embed, layer 0, layer 1, final norm
  const auto& ts = m.tensors();
  const auto f = diloco_fragment_tensors(ts, 2);
  ASSERT_EQ(f.size(), 2u);
  std::size_t total = 0;
  for (std::size_t p = 0; p < 2; ++p) {
    total += f[p].size();
    for (std::size_t t : f[p]) {
      const std::string& n = ts[t].name;
      // Units 0 (embedding) and 2 (layer 1) in fragment 0; 1 (layer 0) and 3 (the final norm) in 1.
      const bool first = n == "model.embed_tokens.weight" || n.rfind("model.layers.1.", 0) == 0;
      EXPECT_EQ(p, first ? 0u : 1u) << n;
    }
  }
  EXPECT_EQ(total, ts.size());
  EXPECT_EQ(diloco_fragment_tensors(ts, 1)[0].size(), ts.size());
  EXPECT_THROW((void)diloco_fragment_tensors(ts, 5), ght::logic_error);  // 4 units
}

TEST(StreamingDiloco, EachFragmentIsSentOnceEveryHStepsAtItsOffsetAndAppliedTauLater) {
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  DilocoConfig c = config(0.7, 0.9, false);
  c.inner_steps = 6;
  c.fragments = 3;
  c.overlap_steps = 1;
  DilocoOuter o(c, 30, *comm, *a);
  o.set_fragments({{{0, 10}}, {{10, 20}}, {{20, 30}}});
  std::vector<std::string> events;
  for (std::int64_t s = 1; s <= 13; ++s) {
    const OuterDue d = o.due_streaming(s, 13);
    if (d.send) {
      events.push_back("send " + std::to_string(*d.send) + "@" + std::to_string(s));
      o.send(*d.send, s);
    }
    if (d.apply) {
      events.push_back("apply " + std::to_string(*d.apply) + "@" + std::to_string(s));
      (void)o.apply(*d.apply);
    }
    if (d.full) events.push_back("full@" + std::to_string(s));
  }
  // Fragment p at 2(p+1) + 6k, applied one step later; the last step closes with the full step.
  EXPECT_EQ(events, (std::vector<std::string>{"send 0@2", "apply 0@3", "send 1@4", "apply 1@5", "send 2@6", "apply 2@7",
                                              "send 0@8", "apply 0@9", "send 1@10", "apply 1@11", "send 2@12",
                                              "apply 2@13", "full@13"}));
}

// One worker: the fragment's outer step is the plain one on its elements, the merge mixes α of
// the local weights after the overlapped steps, and nothing outside the fragment moves.
TEST(StreamingDiloco, ApplyRunsTheOuterStepOnTheFragmentAndMerges) {
  const auto comm = dist::make_single_communicator();
  const auto a = alloc::make_default_tiered_allocator();
  DilocoConfig c = config(0.7, 0.9, false);
  c.inner_steps = 4;
  c.fragments = 2;
  c.overlap_steps = 1;
  c.mix = 0.25;
  const std::size_t n = 64;
  DilocoOuter o(c, n, *comm, *a);
  o.set_fragments({{{0, 16}, {32, 48}}, {{16, 32}, {48, 64}}});
  const std::vector<float> g0 = random_values(n, 3, 0.05f), sent = random_values(n, 4, 0.05f),
                           later = random_values(n, 5, 0.05f);
  std::copy(g0.begin(), g0.end(), o.global().begin());
  std::copy(sent.begin(), sent.end(), o.local().begin());
  o.send(1, 2);
  EXPECT_EQ(o.pending(), std::optional<std::size_t>(1));
  std::copy(later.begin(), later.end(), o.local().begin());  // the worker moved on for τ steps
  const double norm = o.apply(1);
  double sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool in = (i >= 16 && i < 32) || i >= 48;
    if (!in) {
      ASSERT_EQ(o.global()[i], g0[i]) << i;
      ASSERT_EQ(o.local()[i], later[i]) << i;
      ASSERT_EQ(o.momentum()[i], 0.0f) << i;
      continue;
    }
    const float d = g0[i] - sent[i];
    sq += static_cast<double>(d) * d;
    const float buf = d, g = g0[i] - 0.7f * (d + 0.9f * buf);
    ASSERT_NEAR(o.momentum()[i], buf, 1e-7f) << i;
    ASSERT_NEAR(o.global()[i], g, 1e-7f) << i;
    ASSERT_NEAR(o.local()[i], 0.25f * later[i] + 0.75f * g, 1e-7f) << i;
  }
  EXPECT_NEAR(norm, std::sqrt(sq), 1e-12 * std::sqrt(sq));
  EXPECT_FALSE(o.pending());
  EXPECT_THROW((void)o.apply(1), ght::logic_error);  // not sent again
}

TEST(StreamingDiloco, ConfigIsChecked) {
  TrainConfig c;
  c.diloco.inner_steps = 6;
  c.eval_every = 0;
  c.diloco.fragments = 4;
  EXPECT_THROW(c.validate(), ght::logic_error);  // 4 does not divide 6
  c.diloco.fragments = 3;
  c.diloco.overlap_steps = 2;
  EXPECT_THROW(c.validate(), ght::logic_error);  // two fragments in flight
  c.diloco.overlap_steps = 1;
  c.diloco.mix = 1.5;
  EXPECT_THROW(c.validate(), ght::logic_error);
  c.diloco.mix = 0.5;
  EXPECT_NO_THROW(c.validate());
  c.eval_every = 6;
  EXPECT_THROW(c.validate(), ght::logic_error);  // evals only at the end
}

}  // namespace
}  // namespace ght::trainer
