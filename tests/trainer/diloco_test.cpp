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
    EXPECT_NEAR(norm, std::sqrt(sq), 1e-12 * std::sqrt(sq)) << "outer step " << s;
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

}  // namespace
}  // namespace ght::trainer
