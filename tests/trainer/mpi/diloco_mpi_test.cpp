// DiLoCo's outer step over MPI (trainer/diloco.hpp), run by tests/CMakeLists.txt under
// `mpirun -np 2` and `-np 4`. The training loop runs on the CPU backend wrapped in a backend that
// records, on every rank, θ_global at the start of each window of H inner steps and the rank's
// θ_local after the window's last inner step. The records of all ranks are gathered, and the outer
// step is recomputed here from them (torch.optim.SGD(nesterov=True) semantics, in fp32 as the
// trainer does): the θ_global that the next window starts from must match it.
//
// Bounds: the reference adds the ranks' pseudo-gradients in rank order; MPI may add them in
// another order (with 4 ranks), and a build may contract a·b+c into an FMA. Each changes a
// result by a few ulps of the update (|Δ| < 1e-2 here), so 1e-6 absolute is far below what a
// wrong mean, a wrong momentum or a missing rank moves (about lr·|Δ|, ~1e-3). Seen on x86-64:
// 0 (bit-identical) on 2 ranks, up to 2e-9 on 4.
//
// bf16 pseudo-gradients are summed in bf16 (Communicator::allreduce_sum(bf16*)): every partial
// sum is rounded, in MPI's order. The reference adds in rank order: for two ranks that is MPI's
// result bit for bit, for more both lie within γ_{N-1}·Σ_r|Δ_r| of the exact sum, so the reference
// allows twice that (and what it implies for the momentum and θ) on top of the 1e-6.
//
// With H=1, outer lr 1 and momentum 0 the new θ_global must also be the mean of the ranks''
// θ_local (model averaging); it is NOT the data-parallel step, since each worker's AdamW
// normalises its own gradient (tests/cli/train_diloco_test.sh shows the losses part at step 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/bf16.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/diloco.hpp"
#include "trainer/loop.hpp"
#include "trainer/mpi/mpi_main.hpp"
#include "trainer/train_run_util.hpp"

namespace {

using namespace ght::trainer;

std::shared_ptr<ght::dist::Communicator> g_comm;  // one per process: MPI is initialised once

// The optimizer's master (θ_local on this rank), flat in tensor order.
std::vector<float> master_of(TrainBackend& be) {
  std::vector<float> flat;
  for (std::size_t r = 0; r < be.tensors().size(); ++r) {
    std::vector<float> t(be.tensors()[r].numel);
    be.optimizer().save_state(r, t.data(), nullptr, nullptr);
    flat.insert(flat.end(), t.begin(), t.end());
  }
  return flat;
}

// γ_k = k·u/(1 − k·u), u = 2^-8: the relative bound of k bf16 roundings.
double gamma_bf16(int k) {
  const double u = std::ldexp(1.0, -8);
  return k * u / (1 - k * u);
}

// The sum of `deltas` (one per rank, each already what that rank sends) as the trainer's
// all-reduce forms it, in rank order, and a bound on how far the transport's sum may be from it
// when each Δ_r may be off by up to `e_in` in total (the reference's θ_global is the run's only
// within a bound: the streaming test). fp32 sums: bound 0 (the tests' 1e-6 covers the order).
struct PseudoSum {
  float sum = 0;
  double gap = 0;
};
PseudoSum pseudo_sum(const std::vector<float>& deltas, bool bf16, double e_in = 0) {
  PseudoSum s;
  double mag = 0;
  for (std::size_t r = 0; r < deltas.size(); ++r) {
    const float d = deltas[r];
    mag += std::abs(d);
    if (r == 0) {
      s.sum = d;
    } else {
      s.sum = bf16 ? ght::optimizer::to_float(ght::optimizer::to_bf16(s.sum + d)) : s.sum + d;
    }
  }
  const int n = static_cast<int>(deltas.size());
  // Two ranks with the same inputs: one rounding, the same in any order.
  if (bf16 && (n > 2 || e_in > 0)) s.gap = e_in + gamma_bf16(n - 1) * (2 * mag + e_in);
  return s;
}

// How far a bf16-rounded Δ_r may move when θ_global is off by up to `e` (the rounding may cross
// a boundary: an ulp, at most 2^-7 of the value).
double bf16_input_error(double e, float delta) { return e > 0 ? e + std::ldexp(std::abs(delta) + e, -7) : 0; }

struct Case {
  std::int64_t h;
  double lr, momentum;
  bool bf16;
  int windows;
};

class DilocoMpi : public testing::TestWithParam<Case> {};

TEST_P(DilocoMpi, OuterStepsFollowTheReference) {
  const Case k = GetParam();
  const int n = g_comm->size(), rank = g_comm->rank();
  const ght::test::SharedRunDir dir(*g_comm, "ght_diloco_mpi");
  const std::string& root = dir.root;
  TrainConfig cfg = test::tiny_cpu_run_config(root + "/data", root + "/run");
  cfg.model.grad_accum = 1;
  cfg.threads = 1;
  cfg.steps = cfg.schedule.total_steps = k.h * k.windows;
  cfg.diloco = {k.h, k.lr, k.momentum, k.bf16};
  TrainRunOptions run;
  run.quiet = true;
  {
    TrainSession s(cfg, run, g_comm);
    // θ_global at each window's start, θ_local at its end.
    std::vector<std::vector<float>> starts, locals;
    ght::test::StepHook be(make_cpu_backend(s), [&](TrainBackend& in, std::int64_t step, double lr, DataLoader& data) {
      if (step % k.h == 0) starts.push_back(master_of(in));
      StepOutcome o = in.step(step, lr, data);
      if ((step + 1) % k.h == 0) locals.push_back(master_of(in));
      return o;
    });
    (void)run_training(be, s);
    starts.push_back(master_of(be));  // after the last outer step: θ_local = θ_global
    ASSERT_EQ(starts.size(), static_cast<std::size_t>(k.windows + 1));
    ASSERT_EQ(locals.size(), static_cast<std::size_t>(k.windows));

    const std::size_t p = starts[0].size();
    std::vector<float> buf(p, 0.0f);
    std::vector<double> ebuf(p, 0.0);  // bound on |the run's momentum − buf| (bf16 sums, > 2 ranks)
    std::vector<float> deltas(static_cast<std::size_t>(n));
    double worst = 0, worst_mean = 0;
    for (int w = 0; w < k.windows; ++w) {
      // Every rank's θ_local of this window: each fills its slot, a sum over ranks gathers them.
      std::vector<float> all(p * static_cast<std::size_t>(n), 0.0f);
      std::copy(locals[w].begin(), locals[w].end(), all.begin() + static_cast<std::ptrdiff_t>(p) * rank);
      g_comm->allreduce_sum(all.data(), all.size());
      const std::vector<float>& g = starts[w];
      const auto lr = static_cast<float>(k.lr), mu = static_cast<float>(k.momentum);
      for (std::size_t i = 0; i < p; ++i) {
        float mean_local = 0;
        for (int r = 0; r < n; ++r) {
          float delta = g[i] - all[static_cast<std::size_t>(r) * p + i];
          if (k.bf16) delta = ght::optimizer::bf16_bits_to_float(ght::optimizer::float_to_bf16_bits(delta));
          deltas[static_cast<std::size_t>(r)] = delta;
          mean_local += all[static_cast<std::size_t>(r) * p + i] / static_cast<float>(n);
        }
        const PseudoSum sum = pseudo_sum(deltas, k.bf16);
        const float delta = sum.sum / static_cast<float>(n);
        const double e_delta = sum.gap / n;
        buf[i] = mu * buf[i] + delta;
        ebuf[i] = mu * ebuf[i] + e_delta;
        const float want = g[i] - lr * (delta + mu * buf[i]);
        const float got = starts[w + 1][i];
        worst = std::max(worst, static_cast<double>(std::abs(got - want)));
        ASSERT_NEAR(got, want, 1e-6 + lr * (e_delta + mu * ebuf[i]))
            << "window " << w << " parameter " << i << " on rank " << rank;
        if (k.h == 1 && k.lr == 1 && k.momentum == 0) {
          worst_mean = std::max(worst_mean, static_cast<double>(std::abs(got - mean_local)));
          ASSERT_NEAR(got, mean_local, 1e-6) << "model averaging: window " << w << " parameter " << i;
        }
      }
    }
    if (rank == 0) {
      std::printf("%d ranks, H=%lld, lr %g, momentum %g%s: %d outer steps, worst |θ - reference| %.1e", n,
                  static_cast<long long>(k.h), k.lr, k.momentum, k.bf16 ? ", bf16" : "", k.windows, worst);
      if (k.h == 1 && k.lr == 1 && k.momentum == 0) std::printf(", worst |θ - mean θ_local| %.1e", worst_mean);
      std::printf("\n");
    }
  }
  g_comm->barrier();  // every rank is done with the directory before rank 0 removes it
}

INSTANTIATE_TEST_SUITE_P(Cases, DilocoMpi,
                         testing::Values(Case{1, 1.0, 0.0, false, 3},    // model averaging
                                         Case{3, 0.7, 0.9, false, 3},    // the paper's defaults
                                         Case{2, 0.7, 0.9, true, 3}));   // bf16 pseudo-gradients

// ---- Streaming DiLoCo (fragments, overlapped all-reduce, merge) ----------------------------

// A run's masters at the start and at the end of every step, and its losses.
struct EveryStep {
  std::vector<std::vector<float>> starts, ends;
  std::vector<double> losses;
  [[nodiscard]] ght::test::StepHook::Step hook() {
    return [this](TrainBackend& in, std::int64_t step, double lr, DataLoader& data) {
      starts.push_back(master_of(in));
      StepOutcome o = in.step(step, lr, data);
      ends.push_back(master_of(in));
      losses.push_back(o.loss);
      return o;
    };
  }
};

struct StreamCase {
  std::int64_t h, fragments, overlap;
  double mix;
  bool bf16;
  std::int64_t steps;
};

class StreamingDilocoMpi : public testing::TestWithParam<StreamCase> {
 protected:
  void TearDown() override { g_comm->barrier(); }  // every rank is done before rank 0 removes it
  [[nodiscard]] TrainConfig config(const std::string& out) const {
    const StreamCase k = GetParam();
    TrainConfig cfg = test::tiny_cpu_run_config(dir_.root + "/data", dir_.root + "/" + out);
    cfg.model.grad_accum = 1;
    cfg.threads = 1;
    cfg.steps = cfg.schedule.total_steps = k.steps;
    cfg.diloco = {k.h, 0.7, 0.9, k.bf16};
    cfg.diloco.fragments = k.fragments;
    cfg.diloco.overlap_steps = k.overlap;
    cfg.diloco.mix = k.mix;
    return cfg;
  }
  ght::test::SharedRunDir dir_{*g_comm, "ght_sdiloco_mpi"};
};

// Every rank's records of one step (each fills its slot; a sum over ranks gathers them).
std::vector<float> all_ranks(const std::vector<float>& mine) {
  const std::size_t p = mine.size();
  std::vector<float> all(p * static_cast<std::size_t>(g_comm->size()), 0.0f);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(p) * g_comm->rank());
  g_comm->allreduce_sum(all.data(), all.size());
  return all;
}

// The schedule and the arithmetic replayed here from the records, in fp32 as the trainer
// computes them (the same bound as above: MPI may add 4 ranks in another order, a build may
// contract to FMA): after every step the master must be what the streaming rule gives.
TEST_P(StreamingDilocoMpi, FollowsTheReferenceAndResumesExactlyWithAFragmentInFlight) {
  const StreamCase k = GetParam();
  const int n = g_comm->size(), rank = g_comm->rank();
  TrainRunOptions run;
  run.quiet = true;
  std::vector<std::vector<float>> starts, ends;
  std::vector<double> losses;
  std::vector<float> final_master;
  std::vector<std::size_t> frag_of;  // element -> fragment
  {
    TrainSession s(config("run"), run, g_comm);
    EveryStep rec;
    ght::test::StepHook be(make_cpu_backend(s), rec.hook());
    (void)run_training(be, s);
    starts = rec.starts;
    ends = rec.ends;
    losses = rec.losses;
    final_master = master_of(be);
    const auto frags = diloco_fragment_tensors(be.tensors(), static_cast<int>(k.fragments));
    std::vector<std::size_t> offset;
    std::size_t total = 0;
    for (const auto& t : be.tensors()) offset.push_back(std::exchange(total, total + t.numel));
    frag_of.assign(total, 0);
    for (std::size_t f = 0; f < frags.size(); ++f) {
      for (std::size_t t : frags[f]) std::fill_n(frag_of.begin() + static_cast<std::ptrdiff_t>(offset[t]), be.tensors()[t].numel, f);
    }
  }
  ASSERT_EQ(ends.size(), static_cast<std::size_t>(k.steps));
  const std::size_t p = final_master.size();
  std::vector<float> g = starts[0], buf(p, 0.0f), sum(p, 0.0f);
  const float lr = 0.7f, mu = 0.9f, alpha = static_cast<float>(k.mix), ranks = static_cast<float>(n);
  auto pseudo = [&](float a, float b) {
    const float d = a - b;
    return k.bf16 ? ght::optimizer::bf16_bits_to_float(ght::optimizer::float_to_bf16_bits(d)) : d;
  };
  // Bounds on |the run's value − the reference's| from bf16 sums in MPI's order (0 for fp32 and
  // for two ranks): θ_global, the momentum, a sent fragment's sum.
  std::vector<double> eg(p, 0.0), ebuf(p, 0.0), esum(p, 0.0);
  std::vector<float> deltas(static_cast<std::size_t>(n));
  // The reference's sum over ranks for element i, with its bound; θ_global off by up to e_theta.
  auto sum_over_ranks = [&](const std::vector<float>& everyone, std::size_t i, double e_theta) {
    double e_in = 0;
    for (int r = 0; r < n; ++r) {
      const float d = pseudo(g[i], everyone[static_cast<std::size_t>(r) * p + i]);
      deltas[static_cast<std::size_t>(r)] = d;
      if (k.bf16) e_in += bf16_input_error(e_theta, d);
    }
    return pseudo_sum(deltas, k.bf16, e_in);
  };
  auto outer = [&](std::size_t i, float summed, double e_summed) {
    const float delta = summed / ranks;
    buf[i] = mu * buf[i] + delta;
    g[i] -= lr * (delta + mu * buf[i]);
    ebuf[i] = mu * ebuf[i] + e_summed / n;
    eg[i] += lr * (e_summed / n + mu * ebuf[i]);
  };
  const std::int64_t spacing = k.h / k.fragments;
  bool pending = false;  // a fragment sent and not yet applied: `pending_frag`
  std::size_t pending_frag = 0;
  std::int64_t sent_at = 0;
  double worst = 0;
  int sends = 0;
  for (std::int64_t t = 1; t <= k.steps; ++t) {
    std::vector<float> local = ends[static_cast<std::size_t>(t - 1)];  // this rank after step t
    std::optional<std::size_t> send;
    if (t != k.steps) {
      for (std::int64_t f = 0; f < k.fragments; ++f) {
        if (t >= spacing * (f + 1) && (t - spacing * (f + 1)) % k.h == 0) send = static_cast<std::size_t>(f);
      }
    }
    std::vector<float> everyone;  // all ranks' weights after step t, when a sum needs them
    if (send) {
      everyone = all_ranks(local);
      for (std::size_t i = 0; i < p; ++i) {
        if (frag_of[i] != *send) continue;
        const PseudoSum acc = sum_over_ranks(everyone, i, eg[i]);
        sum[i] = acc.sum;
        esum[i] = acc.gap;
      }
      pending = true;
      pending_frag = *send;
      sent_at = t;
      ++sends;
    }
    if (pending && (t == sent_at + k.overlap || t == k.steps)) {
      if (everyone.empty() && t == k.steps) everyone = all_ranks(local);
      for (std::size_t i = 0; i < p; ++i) {
        if (frag_of[i] != pending_frag) continue;
        outer(i, sum[i], esum[i]);
        local[i] = alpha == 0 ? g[i] : alpha * local[i] + (1 - alpha) * g[i];
        if (t == k.steps) {  // every rank's merged weights feed the closing step
          for (int r = 0; r < n; ++r) {
            float& x = everyone[static_cast<std::size_t>(r) * p + i];
            x = alpha == 0 ? g[i] : alpha * x + (1 - alpha) * g[i];
          }
        }
      }
      pending = false;
    }
    if (t == k.steps) {  // the closing whole-model outer step
      if (everyone.empty()) everyone = all_ranks(local);
      for (std::size_t i = 0; i < p; ++i) {
        // θ_global is off by eg, and a fragment merged just before by as much again.
        const PseudoSum acc = sum_over_ranks(everyone, i, 2 * eg[i]);
        outer(i, acc.sum, acc.gap);
        local[i] = g[i];
      }
    }
    const std::vector<float>& got = t < k.steps ? starts[static_cast<std::size_t>(t)] : final_master;
    for (std::size_t i = 0; i < p; ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[i] - local[i])));
      ASSERT_NEAR(got[i], local[i], 1e-6 + eg[i]) << "after step " << t << ", parameter " << i << " (fragment " << frag_of[i]
                                          << ") on rank " << rank;
    }
  }
  EXPECT_GE(sends, static_cast<int>(k.fragments));  // every fragment went at least once

  // Stopped right after a fragment was sent (its all-reduce in flight), then resumed: the same run.
  const std::int64_t stop = spacing + (k.overlap > 0 ? 0 : 1);
  {
    TrainRunOptions part = run;
    part.stop_at = stop;
    TrainSession s(config("part"), part, g_comm);
    EveryStep rec;
    ght::test::StepHook be(make_cpu_backend(s), rec.hook());
    (void)run_training(be, s);
  }
  TrainRunOptions resume = run;
  resume.resume = "auto";
  TrainSession s(config("part"), resume, g_comm);
  EveryStep rec;
  ght::test::StepHook be(make_cpu_backend(s), rec.hook());
  (void)run_training(be, s);
  ASSERT_EQ(rec.losses.size(), static_cast<std::size_t>(k.steps - stop));
  for (std::size_t j = 0; j < rec.losses.size(); ++j) {
    EXPECT_EQ(rec.losses[j], losses[static_cast<std::size_t>(stop) + j]) << "step " << stop + 1 + static_cast<std::int64_t>(j);
  }
  EXPECT_EQ(master_of(be), final_master) << "final weights after the resume";
  if (rank == 0) {
    std::printf("%d ranks, H=%lld, %lld fragments, overlap %lld, mix %g%s: %d fragment syncs + the closing step, "
                "worst |θ - reference| %.1e; resumed after step %lld (a fragment in flight: %s): bit-identical\n",
                n, static_cast<long long>(k.h), static_cast<long long>(k.fragments), static_cast<long long>(k.overlap),
                k.mix, k.bf16 ? ", bf16" : "", sends, worst, static_cast<long long>(stop), k.overlap > 0 ? "yes" : "no");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, StreamingDilocoMpi,
                         testing::Values(StreamCase{4, 2, 1, 0.0, false, 9},   // replace after one overlapped step
                                         StreamCase{6, 3, 1, 0.5, false, 11},  // strided thirds, mixed half
                                         StreamCase{4, 2, 0, 0.0, true, 7}));  // no overlap, bf16 pseudo-gradients

}  // namespace

int main(int argc, char** argv) { return ght::test::run_mpi_tests(argc, argv, g_comm); }
