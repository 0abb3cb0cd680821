#pragma once
// Shared by the GoogleTest executables that run under mpirun (tests/CMakeLists.txt): their
// main() (one communicator per process: MPI is initialised once, in `comm`; every rank runs
// every test; a failure on any rank fails the job on every rank), a run directory all ranks
// share, and a backend wrapper that records around each step.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "common/temp_dir.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/loop.hpp"
#include "trainer/train_run_util.hpp"

namespace ght::test {

/// Rank 0's temporary directory, with a random corpus in data/, named to every rank (`root`).
struct SharedRunDir {
  SharedRunDir(dist::Communicator& comm, const std::string& prefix) {
    char dir[256] = {};
    if (comm.rank() == 0) {
      tmp = std::make_unique<TempDir>(prefix);
      trainer::test::write_random_corpus(*tmp / "data", 40000, 4000);
      tmp->str().copy(dir, sizeof dir - 1);
    }
    comm.broadcast(dir, sizeof dir, 0);
    root = dir;
  }
  std::unique_ptr<TempDir> tmp;  // rank 0 only; every rank must be done before it goes
  std::string root;
};

/// A backend that forwards everything to another, calling `around_step` with the wrapped step.
class StepHook final : public trainer::TrainBackend {
 public:
  using Step = std::function<trainer::StepOutcome(trainer::TrainBackend& inner, std::int64_t step, double lr,
                                                  trainer::DataLoader& data)>;
  StepHook(std::unique_ptr<trainer::TrainBackend> be, Step around_step) : be_(std::move(be)), step_(std::move(around_step)) {}
  [[nodiscard]] std::string name() const override { return be_->name(); }
  [[nodiscard]] const std::vector<trainer::NamedTensor>& tensors() const override { return be_->tensors(); }
  [[nodiscard]] optimizer::AdamW& optimizer() override { return be_->optimizer(); }
  [[nodiscard]] const trainer::StateShards* state_shards() const override { return be_->state_shards(); }
  void init_weights(std::uint64_t seed) override { be_->init_weights(seed); }
  void load_weights(std::size_t r, std::span<const float> w) override { be_->load_weights(r, w); }
  double eval_loss(const trainer::Batch& b) override { return be_->eval_loss(b); }
  trainer::StepOutcome step(std::int64_t step, double lr, trainer::DataLoader& data) override {
    return step_(*be_, step, lr, data);
  }

 private:
  std::unique_ptr<trainer::TrainBackend> be_;
  Step step_;
};

inline int run_mpi_tests(int argc, char** argv, std::shared_ptr<dist::Communicator>& comm) {
  ::testing::InitGoogleTest(&argc, argv);
  comm = dist::make_communicator(dist::detect_launch(dist::process_env()));
  const int rc = RUN_ALL_TESTS();
  int flag = rc, any = 0;
  MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  comm.reset();  // MPI_Finalize
  return any;
}

}  // namespace ght::test
