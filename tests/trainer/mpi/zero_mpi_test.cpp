// ZeRO-1 (trainer/zero.hpp) on the CPU backend over MPI, run by tests/CMakeLists.txt under
// `mpirun -np 2` and `-np 4`. Every rank runs every test; the single-process reference runs on
// rank 0 alone, with a communicator of its own.
//
// Bounds (stated, and checked):
//  - Sharded vs replicated state on N ranks: the same micro-batches, the same loss scaling, the
//    same AdamW arithmetic per element. What may differ: the order in which MPI adds the ranks'
//    gradients (reduce-scatter vs all-reduce; with 2 ranks there is one addition, exact in any
//    order) and the order of the double Σg² behind the clip coefficient (rounded to fp32 before
//    use). Both are ulp-level; AdamW's normalised update passes relative gradient differences
//    through without amplifying them (away from ε). Bound: 1e-6 relative on losses and grad
//    norms, 1e-6 absolute on master (|update| ~ lr = 2e-3 a step). Seen on x86-64: bit-identical.
//  - N ranks x 1 micro-batch vs 1 rank x N: also the order of the per-token gradient sums
//    differs (one rank adds micro-batch 2 into the buffer holding micro-batch 1): ~6e-8 relative
//    per gradient; the bound is tests/cli/train_dist_test.sh's, 1e-5 relative on losses and
//    norms, far below what a wrong share of the data or a wrong 1/(N·A) moves (whole percent).
//  - Resume (same N, onto one process, between sharded and replicated): bit-identical.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/loop.hpp"
#include "trainer/mpi/mpi_main.hpp"
#include "trainer/train_run_util.hpp"
#include "trainer/zero.hpp"

namespace {

using namespace ght::trainer;
using ght::dist::Communicator;

std::shared_ptr<Communicator> g_comm;  // one per process: MPI is initialised once

// What a run leaves: its steps, the whole optimizer state (gathered from the shards), the state
// bytes this rank's allocator holds on the host.
struct RunResult {
  std::vector<StepOutcome> steps;
  std::vector<float> master, m, v;
  std::uint64_t state_bytes = 0;
  std::size_t owned = 0;  // parameters whose state this rank holds
  bool sharded = false;
};

RunResult train(const TrainConfig& cfg, std::shared_ptr<Communicator> comm, const std::string& resume = "",
          std::optional<std::int64_t> stop_at = std::nullopt) {
  TrainRunOptions opts;
  opts.quiet = true;
  opts.resume = resume;
  opts.stop_at = stop_at;
  TrainSession s(cfg, opts, comm);
  RunResult r;
  ght::test::StepHook be(make_cpu_backend(s), [&r](TrainBackend& in, std::int64_t step, double lr, DataLoader& data) {
    r.steps.push_back(in.step(step, lr, data));
    return r.steps.back();
  });
  (void)run_training(be, s);
  const auto& ts = be.tensors();
  const std::size_t p = ts.back().offset + ts.back().numel;
  r.master.assign(p, 0.0f);
  r.m.assign(p, 0.0f);
  r.v.assign(p, 0.0f);
  const StateShards* z = be.state_shards();
  const std::vector<TensorSlice> slices = z != nullptr ? z->slices() : whole_tensors(ts);
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const std::size_t at = ts[slices[k].tensor].offset + slices[k].first;
    be.optimizer().save_state(k, r.master.data() + at, r.m.data() + at, r.v.data() + at);
    r.owned += slices[k].n;
  }
  if (z != nullptr) {
    r.sharded = true;
    for (auto* a : {&r.master, &r.m, &r.v}) comm->all_gather(a->data(), z->layout().counts(0));
  }
  const auto& alloc = be.optimizer().allocator();
  for (auto cls : {ght::TensorClass::master, ght::TensorClass::adam_m, ght::TensorClass::adam_v}) {
    r.state_bytes += alloc.tier_class_usage(ght::TierKind::host, cls).current;
  }
  return r;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(a), 1e-30); }

// One directory for all ranks (rank 0's) with a corpus in it.
class ZeroMpi : public testing::Test {
 protected:
  void TearDown() override { g_comm->barrier(); }  // every rank is done before rank 0 removes it
  [[nodiscard]] TrainConfig config(const std::string& out, const std::string& state, int steps = 4) const {
    TrainConfig c = test::tiny_cpu_run_config(root_ + "/data", root_ + "/" + out);
    c.model.grad_accum = 1;
    c.threads = 1;
    c.steps = c.schedule.total_steps = steps;
    c.dist.optimizer_state = state;
    return c;
  }
  ght::test::SharedRunDir dir_{*g_comm, "ght_zero_mpi"};
  const std::string& root_ = dir_.root;
};

TEST_F(ZeroMpi, ShardedEqualsReplicatedAndOneRankWithNTimesTheMicroBatches) {
  const int n = g_comm->size(), rank = g_comm->rank();
  const RunResult z = train(config("sharded", "sharded"), g_comm);
  const RunResult r = train(config("replicated", "replicated"), g_comm);
  ASSERT_TRUE(z.sharded);
  ASSERT_FALSE(r.sharded);
  ASSERT_EQ(z.steps.size(), 4u);
  ASSERT_EQ(r.steps.size(), 4u);
  double worst = 0, worst_state = 0;
  for (std::size_t k = 0; k < z.steps.size(); ++k) {
    for (auto [a, b] : {std::pair{z.steps[k].loss, r.steps[k].loss}, std::pair{z.steps[k].grad_norm, r.steps[k].grad_norm},
                        std::pair{z.steps[k].aux_loss, r.steps[k].aux_loss}}) {
      worst = std::max(worst, rel(a, b));
      ASSERT_LE(rel(a, b), 1e-6) << "step " << k + 1 << ": sharded " << a << ", replicated " << b;
    }
  }
  for (std::size_t i = 0; i < z.master.size(); ++i) {
    worst_state = std::max(worst_state, static_cast<double>(std::abs(z.master[i] - r.master[i])));
    ASSERT_NEAR(z.master[i], r.master[i], 1e-6) << "master " << i;
  }
  // Host state: 12 bytes per parameter this rank holds, 1/N of the model's (to the alignment).
  const std::size_t p = z.master.size();
  EXPECT_EQ(z.state_bytes, 12 * z.owned);
  EXPECT_EQ(r.state_bytes, 12 * p);
  EXPECT_LE(z.owned, p / static_cast<std::size_t>(n) + static_cast<std::size_t>(n) * ght::dist::kShardAlign);
  double total = static_cast<double>(z.state_bytes);
  g_comm->allreduce_sum(&total, 1);
  EXPECT_EQ(total, 12.0 * static_cast<double>(p));

  // One process with N micro-batches per step (rank 0; the others wait at the barrier).
  double worst_one = 0;
  if (rank == 0) {
    TrainConfig one = config("one", "sharded");
    one.model.grad_accum = n;
    const RunResult o = train(one, ght::dist::make_single_communicator());
    ASSERT_FALSE(o.sharded);
    for (std::size_t k = 0; k < o.steps.size(); ++k) {
      for (auto [a, b] : {std::pair{o.steps[k].loss, z.steps[k].loss}, std::pair{o.steps[k].grad_norm, z.steps[k].grad_norm}}) {
        worst_one = std::max(worst_one, rel(a, b));
        ASSERT_LE(rel(a, b), 1e-5) << "step " << k + 1 << ": 1 rank " << a << ", " << n << " ranks " << b;
      }
    }
    std::printf("%d ranks: sharded vs replicated worst relative %.1e (losses, norms), |master| %.1e; vs 1 rank x %d "
                "micro-batches %.1e; host state %llu of %llu bytes on rank 0\n",
                n, worst, worst_state, n, worst_one, static_cast<unsigned long long>(z.state_bytes),
                static_cast<unsigned long long>(12 * p));
  }
}

TEST_F(ZeroMpi, ResumeIsExactAndReshardsOntoOneProcessAndBetweenLayouts) {
  const RunResult whole = train(config("whole", "sharded", 5), g_comm);
  const RunResult first = train(config("resumed", "sharded", 5), g_comm, "", 3);
  ASSERT_EQ(first.steps.size(), 3u);
  const RunResult rest = train(config("resumed", "sharded", 5), g_comm, "auto");
  ASSERT_EQ(rest.steps.size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(rest.steps[k].loss, whole.steps[k + 3].loss) << "step " << k + 4;
    EXPECT_EQ(rest.steps[k].grad_norm, whole.steps[k + 3].grad_norm) << "step " << k + 4;
  }
  EXPECT_EQ(rest.master, whole.master);
  EXPECT_EQ(rest.m, whole.m);
  EXPECT_EQ(rest.v, whole.v);

  const std::string ckpt3 = root_ + "/resumed/ckpt_00000003";
  // The N-rank checkpoint on the same N with replicated state: every rank holds all of it.
  const RunResult as_replicated = train(config("as_replicated", "replicated", 5), g_comm, ckpt3, 3);
  EXPECT_TRUE(as_replicated.steps.empty());
  EXPECT_EQ(as_replicated.master, first.master);
  EXPECT_EQ(as_replicated.m, first.m);
  EXPECT_EQ(as_replicated.v, first.v);
  // A replicated checkpoint resumed sharded.
  const RunResult rep = train(config("rep", "replicated", 5), g_comm, "", 3);
  const RunResult rep_sharded = train(config("rep_sharded", "sharded", 5), g_comm, root_ + "/rep/ckpt_00000003", 3);
  ASSERT_TRUE(rep_sharded.sharded);
  EXPECT_EQ(rep_sharded.master, rep.master);
  EXPECT_EQ(rep_sharded.m, rep.m);
  EXPECT_EQ(rep_sharded.v, rep.v);
  // The N-rank checkpoint onto one process (rank 0), then one more step there.
  if (g_comm->rank() == 0) {
    const RunResult one = train(config("one", "sharded", 5), ght::dist::make_single_communicator(), ckpt3, 3);
    ASSERT_FALSE(one.sharded);
    EXPECT_EQ(one.master, first.master);
    EXPECT_EQ(one.m, first.m);
    EXPECT_EQ(one.v, first.v);
  }
}

// The optimizer over shards with the norm combined over the ranks against one AdamW over the
// whole on every rank: clipping and the skip follow the whole model, bf16 state rounds alike.
TEST_F(ZeroMpi, NormClipAndNonFiniteSkipAreTheWholeModels) {
  namespace opt = ght::optimizer;
  const int n = g_comm->size(), rank = g_comm->rank();
  std::vector<NamedTensor> ts = {{"a", {3001}, 0, 3001, true}, {"b", {4000}, 3001, 4000, false},
                                 {"c", {2999}, 7001, 2999, true}};
  const std::size_t p = 10000;
  std::vector<float> g(p), w0(p);
  for (std::size_t i = 0; i < p; ++i) {
    g[i] = 0.01f * std::sin(0.37f * static_cast<float>(i) + 0.1f);
    w0[i] = 0.02f * std::cos(0.11f * static_cast<float>(i));
  }
  for (opt::StateType st : {opt::StateType::fp32, opt::StateType::bf16}) {
    opt::AdamWOptions o;
    o.path = opt::PathChoice::cpu;
    o.cpu_threads = 1;
    o.state_type = st;
    o.hyper.max_grad_norm = 0.05;  // the norm is ~0.7: clipped
    const StateShards z(ts, StateShards::whole_model(ts), n, rank);
    std::vector<float> gz = g;
    opt::AdamW whole(StateShards(ts, StateShards::whole_model(ts), 1, 0).regions(g.data(), opt::GradType::fp32, nullptr), o);
    opt::AdamWOptions oz = o;
    oz.combine_sumsq = sumsq_over_ranks(*g_comm);
    opt::AdamW part(z.regions(gz.data(), opt::GradType::fp32, nullptr), oz);
    for (std::size_t k = 0; k < ts.size(); ++k) whole.load_state(k, w0.data() + ts[k].offset, nullptr, nullptr);
    for (std::size_t k = 0; k < z.slices().size(); ++k) {
      part.load_state(k, w0.data() + ts[z.slices()[k].tensor].offset + z.slices()[k].first, nullptr, nullptr);
    }
    auto compare = [&](const char* what) {
      std::vector<float> ww(p), mw(p), vw(p);
      for (std::size_t k = 0; k < ts.size(); ++k) {
        const std::size_t at = ts[k].offset;
        whole.save_state(k, ww.data() + at, mw.data() + at, vw.data() + at);
      }
      for (std::size_t k = 0; k < z.slices().size(); ++k) {
        const TensorSlice& x = z.slices()[k];
        std::vector<float> ws(x.n), ms(x.n), vs(x.n);
        part.save_state(k, ws.data(), ms.data(), vs.data());
        for (std::size_t e = 0; e < x.n; ++e) {
          const std::size_t i = ts[x.tensor].offset + x.first + e;
          ASSERT_EQ(ws[e], ww[i]) << what << ": master " << i << " on rank " << rank;
          ASSERT_EQ(ms[e], mw[i]) << what << ": m " << i;
          ASSERT_EQ(vs[e], vw[i]) << what << ": v " << i;
        }
      }
    };
    const opt::StepResult a = whole.step(1e-2), b = part.step(1e-2);
    ASSERT_TRUE(a.taken && b.taken);
    EXPECT_LT(a.clip_coef, 1.0);
    EXPECT_EQ(static_cast<float>(a.grad_norm), static_cast<float>(b.grad_norm));
    EXPECT_NEAR(a.clip_coef, b.clip_coef, 1e-15);
    compare(st == opt::StateType::bf16 ? "bf16 state, clipped step" : "fp32 state, clipped step");
    // A NaN in the last rank's part of the gradient: every rank skips, nothing changes.
    std::vector<float> before(z.owned());
    for (std::size_t k = 0, at = 0; k < z.slices().size(); at += z.slices()[k].n, ++k) part.save_state(k, before.data() + at, nullptr, nullptr);
    if (rank == n - 1) gz[p - 1] = std::numeric_limits<float>::quiet_NaN();
    const opt::StepResult c = part.step(1e-2);
    EXPECT_FALSE(c.taken) << "rank " << rank;
    EXPECT_EQ(part.stats().steps_skipped_nonfinite, 1);
    std::vector<float> after(z.owned());
    for (std::size_t k = 0, at = 0; k < z.slices().size(); at += z.slices()[k].n, ++k) part.save_state(k, after.data() + at, nullptr, nullptr);
    EXPECT_EQ(before, after);
  }
}

}  // namespace

int main(int argc, char** argv) { return ght::test::run_mpi_tests(argc, argv, g_comm); }
