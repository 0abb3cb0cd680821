// GHT_CUDA_GRAPHS in the CUDA training step (trainer/cuda/train_cuda.cpp): micro-batches whose
// hooks are idle replay one captured graph, and the run is bit for bit the eager one: the same
// losses (train and eval), and the same final weights, master, m and v in the last checkpoint;
// with several micro-batches, with clipping, in delayed mode across its exact warm-up, with
// updates speculated during the last backward, and across a resume. Every "on" run must have
// replayed micro-batches (the exact count where it is known), so none of this passes vacuously.
// Attention is the deterministic fallback (cuDNN's dQ uses atomics, which would differ between
// any two runs). Skips without a GPU; the CPU side is graph_choice_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/registry.hpp"
#include "kernels/cuda/expert_gemm.hpp"
#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/cuda/train_cuda.hpp"
#include "trainer/train_run_util.hpp"

namespace ght::trainer {
namespace {

using ght::test::ScopedFlag;
using ght::test::TempDir;
using test::read_log;
using test::RunLog;
using test::small_run_config;
using test::write_random_corpus;

// The profile records of a run's log.jsonl: graph launches summed over the steps, and whether
// every step's forward/backward split was positive.
struct GraphProfile {
  std::int64_t launches = 0;
  std::int64_t steps = 0;
  bool split_positive = true;
};

GraphProfile read_graph_profile(const std::string& run_dir) {
  GraphProfile g;
  std::ifstream in(run_dir + "/log.jsonl");
  EXPECT_TRUE(in.good()) << run_dir << "/log.jsonl is missing";
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") != "profile") continue;
    ++g.steps;
    g.launches += j.at("cuda_graph_launches").get<std::int64_t>();
    g.split_positive = g.split_positive && j.at("forward_ms").get<double>() > 0 && j.at("backward_ms").get<double>() > 0;
  }
  return g;
}

void expect_same_tensors(const std::vector<CheckpointTensor>& a, const std::vector<CheckpointTensor>& b,
                         const char* what) {
  ASSERT_FALSE(a.empty()) << what << ": the checkpoint holds none (a vacuous comparison)";
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name) << what;
    ASSERT_EQ(a[i].data.size(), b[i].data.size()) << what << " " << a[i].name;
    EXPECT_EQ(std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)), 0)
        << what << " " << a[i].name << " differs";
  }
}

// The newest checkpoints of two runs: the same step, weights, master, m, v and optimizer scalars.
void expect_same_final_state(const std::string& a_dir, const std::string& b_dir) {
  const auto a = load_latest(a_dir), b = load_latest(b_dir);
  ASSERT_TRUE(a.has_value()) << "no checkpoint under " << a_dir;
  ASSERT_TRUE(b.has_value()) << "no checkpoint under " << b_dir;
  EXPECT_EQ(a->data.step, b->data.step);
  expect_same_tensors(a->data.weights, b->data.weights, "weights");
  expect_same_tensors(a->data.master, b->data.master, "master");
  expect_same_tensors(a->data.adam_m, b->data.adam_m, "adam_m");
  expect_same_tensors(a->data.adam_v, b->data.adam_v, "adam_v");
  EXPECT_EQ(a->data.optimizer, b->data.optimizer);
}

void expect_same_losses(const RunLog& a, const RunLog& b) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (const auto& [step, loss] : a.loss) {
    ASSERT_TRUE(b.loss.count(step)) << "step " << step;
    EXPECT_EQ(b.loss.at(step), loss) << "step " << step;
  }
  ASSERT_EQ(a.eval.size(), b.eval.size());
  for (const auto& [step, loss] : a.eval) EXPECT_EQ(b.eval.at(step), loss) << "eval at step " << step;
}

// Device-side expert offsets (a graph cannot hold the cuBLASLt variants' host sync).
const char* graph_expert_gemm() { return kernels::cuda::cutlass_available() ? "cutlass" : "custom"; }

struct GraphCase {
  const char* name;
  int grad_accum;
  double max_norm;     // > 0: clipping (1e-3 clips every step)
  bool delay;          // GHT_OPT_DELAY=1 with a 2-step exact warm-up
  bool speculate;      // gpu_link state with GHT_OPT_SPECULATE: the last micro-batch runs eagerly
  int stale;           // GHT_OPT_DELAY_MICRO (0: the whole step)
  int keys;            // graph keys (weights, gradients) the run's replayable micro-batches use
};

void PrintTo(const GraphCase& c, std::ostream* os) { *os << c.name; }  // the test's name in ctest

class CudaGraphsTrain : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudaGraphsTrain, OnAndOffAreBitIdentical) {
  GHT_REQUIRE_GPU();
  const GraphCase gc = GetParam();
  const TempDir tmp("ght_cuda_graphs");
  write_random_corpus(tmp / "data");
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 6;
  const ScopedFlag attention("GHT_ATTENTION", "fallback");
  const ScopedFlag gemm("GHT_EXPERT_GEMM", graph_expert_gemm());
  const ScopedFlag delayed("GHT_OPT_DELAY", gc.delay ? "on" : "off");
  const ScopedFlag warmup("GHT_OPT_DELAY_WARMUP", "2");
  const ScopedFlag stale("GHT_OPT_DELAY_MICRO", std::to_string(gc.stale));
  const ScopedFlag path("GHT_OPTIMIZER", gc.speculate ? "gpu_link" : "auto");
  const ScopedFlag arena("GHT_OPT_SPECULATE", gc.speculate ? "64MiB" : "0");
  auto train_with = [&](const std::string& graphs) {
    const ScopedFlag flag("GHT_CUDA_GRAPHS", graphs);
    TrainConfig c = small_run_config(tmp / "data", tmp / graphs);
    c.backend = "cuda";
    c.model.grad_accum = gc.grad_accum;
    c.adam.max_grad_norm = gc.max_norm;
    (void)train_cuda(c, run);
    return read_log(tmp / graphs);
  };
  const RunLog off = train_with("off"), on = train_with("on");
  ASSERT_EQ(off.loss.size(), 6u);
  expect_same_losses(off, on);
  expect_same_final_state(tmp / "off", tmp / "on");

  const GraphProfile p_on = read_graph_profile(tmp / "on"), p_off = read_graph_profile(tmp / "off");
  ASSERT_EQ(p_on.steps, 6);
  EXPECT_EQ(p_off.launches, 0) << "GHT_CUDA_GRAPHS=off replayed micro-batches";
  EXPECT_TRUE(p_on.split_positive) << "the forward/backward split is not measured in graph replays";
  EXPECT_TRUE(p_off.split_positive);
  // Micro-batch 0 of each step runs eagerly, and so does the last while it speculates; the first
  // replayable micro-batch of each graph key runs eagerly once. One key (weights, gradients)
  // for the run, two in delayed mode (its alternating pairs, each kept in its own graph), four
  // with a partial delay (the weights switch within the step: both weights with both gradients).
  const std::int64_t replayable = 6 * (gc.grad_accum - 1 - (gc.speculate ? 1 : 0));
  EXPECT_EQ(p_on.launches, replayable - gc.keys);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaGraphsTrain,
                         ::testing::Values(GraphCase{"accum2", 2, 0.0, false, false, 0, 1},
                                           GraphCase{"accum3_clipped", 3, 1e-3, false, false, 0, 1},
                                           GraphCase{"accum4_delayed", 4, 0.0, true, false, 0, 2},
                                           GraphCase{"accum4_partial_delay", 4, 0.0, true, false, 2, 4},
                                           GraphCase{"accum3_speculated", 3, 0.0, false, true, 0, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

// Stop at step 3 with graphs on, resume to 6: the same losses and final state as the
// uninterrupted run, bit for bit (the resumed process captures its graphs afresh).
TEST(CudaGraphsTrainResume, ResumeWithGraphsOnIsExact) {
  GHT_REQUIRE_GPU();
  const TempDir tmp("ght_cuda_graphs_resume");
  write_random_corpus(tmp / "data");
  const ScopedFlag attention("GHT_ATTENTION", "fallback");
  const ScopedFlag gemm("GHT_EXPERT_GEMM", graph_expert_gemm());
  const ScopedFlag graphs("GHT_CUDA_GRAPHS", "on");
  auto config = [&](const std::string& name) {
    TrainConfig c = small_run_config(tmp / "data", tmp / name);
    c.backend = "cuda";
    c.model.grad_accum = 3;
    return c;
  };
  TrainRunOptions quiet;
  quiet.quiet = true;
  quiet.profile_steps = 6;
  (void)train_cuda(config("full"), quiet);
  TrainRunOptions first = quiet;
  first.stop_at = 3;
  (void)train_cuda(config("resumed"), first);
  TrainRunOptions second = quiet;
  second.resume = "auto";
  const TrainSummary s = train_cuda(config("resumed"), second);
  EXPECT_EQ(s.first_step, 3);
  EXPECT_EQ(s.last_step, 6);
  expect_same_losses(read_log(tmp / "full"), read_log(tmp / "resumed"));
  expect_same_final_state(tmp / "full", tmp / "resumed");
  // Both legs replayed: 3 steps x 2 replayable micro-batches, less one warm-up run, per process.
  EXPECT_EQ(read_graph_profile(tmp / "resumed").launches, 2 * (3 * 2 - 1));
  EXPECT_EQ(read_graph_profile(tmp / "full").launches, 6 * 2 - 1);
}

// GHT_OPT_LAUNCH_THREAD: exact mode's update launched from a thread of its own, the next forward
// queued unit by unit as the launches reach it, is bit for bit the update launched on the training
// thread: losses (train and eval) and the final checkpoint, with the state on the host over the
// link (dma: launches that block), with speculation during the last backward (its units' updates
// launched from threads too, one after the other; with one micro-batch, right behind the update
// thread's), and with both paths at once (cpu regions on the worker).
struct LaunchCase {
  const char* name;
  const char* path;  // GHT_OPTIMIZER
  int grad_accum;
  bool speculate;         // GHT_OPT_SPECULATE, no clipping
  const char* cpu_share;  // GHT_OPT_CPU_SHARE (split: half the state on the CPU; -1: the default)
};

void PrintTo(const LaunchCase& c, std::ostream* os) { *os << c.name; }

class CudaLaunchThread : public ::testing::TestWithParam<LaunchCase> {};

TEST_P(CudaLaunchThread, OnAndOffAreBitIdentical) {
  GHT_REQUIRE_GPU();
  const LaunchCase lc = GetParam();
  const TempDir tmp("ght_cuda_launch_thread");
  write_random_corpus(tmp / "data");
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 6;
  const ScopedFlag attention("GHT_ATTENTION", "fallback");
  const ScopedFlag host_state("GHT_PLACE", "master=host,adam_*=host");
  const ScopedFlag path("GHT_OPTIMIZER", lc.path);
  const ScopedFlag dma("GHT_OPT_LINK_MODE", "dma");
  const ScopedFlag arena("GHT_OPT_SPECULATE", lc.speculate ? "64MiB" : "0");
  const ScopedFlag share("GHT_OPT_CPU_SHARE", lc.cpu_share);
  auto train_with = [&](const std::string& flag) {
    const ScopedFlag launch("GHT_OPT_LAUNCH_THREAD", flag);
    TrainConfig c = small_run_config(tmp / "data", tmp / flag);
    c.backend = "cuda";
    c.model.grad_accum = lc.grad_accum;
    if (lc.speculate) c.adam.max_grad_norm = 0;  // a clipped step turns speculation off
    (void)train_cuda(c, run);
    return read_log(tmp / flag);
  };
  const RunLog off = train_with("off"), on = train_with("on");
  ASSERT_EQ(off.loss.size(), 6u);
  expect_same_losses(off, on);
  expect_same_final_state(tmp / "off", tmp / "on");
  // Not vacuous: every "on" step launched on the thread, no "off" step did.
  for (const char* flag : {"off", "on"}) {
    std::ifstream in(tmp / (std::string(flag) + "/profile.json"));
    ASSERT_TRUE(in.good()) << flag << ": profile.json is missing";
    const auto j = nlohmann::json::parse(in);
    ASSERT_EQ(j.at("steps").size(), 6u) << flag;
    std::size_t speculated = 0;
    for (const auto& st : j.at("steps")) {
      EXPECT_EQ(st.at("update_launched_on_thread").get<bool>(), std::string(flag) == "on")
          << flag << ", step " << st.at("step");
      speculated += st.at("speculated_params").get<std::size_t>();
    }
    if (lc.speculate) EXPECT_GT(speculated, 0u) << flag << ": nothing was speculated";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaLaunchThread,
                         ::testing::Values(LaunchCase{"dma_accum3", "gpu_link", 3, false, "-1"},
                                           LaunchCase{"dma_accum1_speculated", "gpu_link", 1, true, "-1"},
                                           LaunchCase{"dma_accum3_speculated", "gpu_link", 3, true, "-1"},
                                           LaunchCase{"split_accum2", "split", 2, false, "0.5"}),
                         [](const auto& info) { return std::string(info.param.name); });

// GHT_CUDA_GRAPHS=on where no micro-batch could replay is an error naming why; auto runs eagerly.
TEST(CudaGraphsTrainChoice, OnRefusesARunThatCannotReplayAndAutoRunsEagerly) {
  GHT_REQUIRE_GPU();
  const TempDir tmp("ght_cuda_graphs_choice");
  write_random_corpus(tmp / "data");
  TrainRunOptions quiet;
  quiet.quiet = true;
  quiet.profile_steps = 2;
  auto config = [&](const std::string& name) {
    TrainConfig c = small_run_config(tmp / "data", tmp / name);
    c.backend = "cuda";
    c.model.grad_accum = 1;  // its only micro-batch waits for the previous update
    c.steps = 2;
    c.eval_every = 0;
    c.schedule.total_steps = 2;
    return c;
  };
  {
    const ScopedFlag graphs("GHT_CUDA_GRAPHS", "on");
    try {
      (void)train_cuda(config("on"), quiet);
      ADD_FAILURE() << "GHT_CUDA_GRAPHS=on trained a run with grad_accum 1";
    } catch (const config_error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("GHT_CUDA_GRAPHS=on"), std::string::npos) << w;
      EXPECT_NE(w.find("grad_accum is 1"), std::string::npos) << w;
    }
  }
  const ScopedFlag graphs("GHT_CUDA_GRAPHS", "auto");
  const TrainSummary s = train_cuda(config("auto"), quiet);
  EXPECT_EQ(s.last_step, 2);
  EXPECT_EQ(read_graph_profile(tmp / "auto").launches, 0);
}

}  // namespace
}  // namespace ght::trainer
