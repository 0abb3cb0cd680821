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
// With H=1, outer lr 1 and momentum 0 the new θ_global must also be the mean of the ranks'
// θ_local (model averaging); it is NOT the data-parallel step, since each worker's AdamW
// normalises its own gradient (tests/cli/train_diloco_test.sh shows the losses part at step 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/bf16.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"
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

// The CPU backend, recording θ_global at each window's start and θ_local at its end.
class Recording final : public TrainBackend {
 public:
  Recording(std::unique_ptr<TrainBackend> be, std::int64_t h) : be_(std::move(be)), h_(h) {}
  [[nodiscard]] std::string name() const override { return be_->name(); }
  [[nodiscard]] const std::vector<NamedTensor>& tensors() const override { return be_->tensors(); }
  [[nodiscard]] ght::optimizer::AdamW& optimizer() override { return be_->optimizer(); }
  void init_weights(std::uint64_t seed) override { be_->init_weights(seed); }
  void load_weights(std::size_t r, std::span<const float> w) override { be_->load_weights(r, w); }
  double eval_loss(const Batch& b) override { return be_->eval_loss(b); }
  StepOutcome step(std::int64_t step, double lr, DataLoader& data) override {
    if (step % h_ == 0) starts.push_back(master_of(*be_));
    StepOutcome o = be_->step(step, lr, data);
    if ((step + 1) % h_ == 0) locals.push_back(master_of(*be_));
    return o;
  }
  std::vector<std::vector<float>> starts, locals;

 private:
  std::unique_ptr<TrainBackend> be_;
  std::int64_t h_;
};

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
  // One directory for all ranks: rank 0's, broadcast.
  std::unique_ptr<ght::test::TempDir> tmp;
  char dir[256] = {};
  if (rank == 0) {
    tmp = std::make_unique<ght::test::TempDir>("ght_diloco_mpi");
    test::write_random_corpus(*tmp / "data", 40000, 4000);
    tmp->str().copy(dir, sizeof dir - 1);
  }
  g_comm->broadcast(dir, sizeof dir, 0);
  const std::string root = dir;
  TrainConfig cfg = test::tiny_cpu_run_config(root + "/data", root + "/run");
  cfg.model.grad_accum = 1;
  cfg.threads = 1;
  cfg.steps = cfg.schedule.total_steps = k.h * k.windows;
  cfg.diloco = {k.h, k.lr, k.momentum, k.bf16};
  TrainRunOptions run;
  run.quiet = true;
  {
    TrainSession s(cfg, run, g_comm);
    Recording be(make_cpu_backend(s), k.h);
    (void)run_training(be, s);
    be.starts.push_back(master_of(be));  // after the last outer step: θ_local = θ_global
    ASSERT_EQ(be.starts.size(), static_cast<std::size_t>(k.windows + 1));
    ASSERT_EQ(be.locals.size(), static_cast<std::size_t>(k.windows));

    const std::size_t p = be.starts[0].size();
    std::vector<float> buf(p, 0.0f);
    double worst = 0, worst_mean = 0;
    for (int w = 0; w < k.windows; ++w) {
      // Every rank's θ_local of this window: each fills its slot, a sum over ranks gathers them.
      std::vector<float> all(p * static_cast<std::size_t>(n), 0.0f);
      std::copy(be.locals[w].begin(), be.locals[w].end(), all.begin() + static_cast<std::ptrdiff_t>(p) * rank);
      g_comm->allreduce_sum(all.data(), all.size());
      const std::vector<float>& g = be.starts[w];
      const auto lr = static_cast<float>(k.lr), mu = static_cast<float>(k.momentum);
      for (std::size_t i = 0; i < p; ++i) {
        float sum = 0, mean_local = 0;
        for (int r = 0; r < n; ++r) {
          float delta = g[i] - all[static_cast<std::size_t>(r) * p + i];
          if (k.bf16) delta = ght::optimizer::bf16_bits_to_float(ght::optimizer::float_to_bf16_bits(delta));
          sum += delta;
          mean_local += all[static_cast<std::size_t>(r) * p + i] / static_cast<float>(n);
        }
        const float delta = sum / static_cast<float>(n);
        buf[i] = mu * buf[i] + delta;
        const float want = g[i] - lr * (delta + mu * buf[i]);
        const float got = be.starts[w + 1][i];
        worst = std::max(worst, static_cast<double>(std::abs(got - want)));
        ASSERT_NEAR(got, want, 1e-6) << "window " << w << " parameter " << i << " on rank " << rank;
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

}  // namespace

int main(int argc, char** argv) { return ght::test::run_mpi_tests(argc, argv, g_comm); }
