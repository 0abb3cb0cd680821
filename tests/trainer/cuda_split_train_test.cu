// The CUDA backend with both update paths at once (GHT_OPTIMIZER=split) and with cpu-path updates
// during the last backward (GHT_OPT_SPECULATE_HOST), in exact and in delayed mode: the same
// losses as the all-gpu_link run (the updates are byte-equal per region, tests/optimizer/
// adamw_split_test.cu; the losses still differ by cuDNN's atomic dQ accumulation), fewer link
// bytes per step, and speculation kept on unclipped steps and undone on a clipped one. And a
// partial delay's stale micro-batches leave SMs free for the update (GHT_OPT_SM_RESERVE).
// Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "common/gpu.hpp"
#include "common/registry.hpp"
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

struct Profile {
  std::map<std::int64_t, std::size_t> speculated;
  std::map<std::int64_t, int> reserved;  // micro_batches_beside_update
  int sm_budget = -1;                     // sm_budget_beside_update (every step's is the same)
  std::map<std::int64_t, bool> undone;
  double link_gb_h2d = 0;
};

Profile read_profile(const std::string& run_dir) {
  Profile p;
  std::ifstream in(run_dir + "/profile.json");
  EXPECT_TRUE(in.good()) << run_dir << "/profile.json is missing";
  if (!in.good()) return p;
  const auto j = nlohmann::json::parse(in);
  for (const auto& st : j.at("steps")) {
    const auto step = st.at("step").get<std::int64_t>();
    p.speculated[step] = st.at("speculated_params").get<std::size_t>();
    p.undone[step] = st.at("speculation_undone").get<bool>();
    p.reserved[step] = st.at("micro_batches_beside_update").get<int>();
    p.sm_budget = st.at("sm_budget_beside_update").get<int>();
  }
  p.link_gb_h2d = j.at("median_excluding_first_step").at("link_gb_h2d").get<double>();
  return p;
}

class CudaTrainSplit : public ::testing::TestWithParam<bool> {};  // GHT_OPT_DELAY

TEST_P(CudaTrainSplit, BothPathsAndCpuSpeculationLearnLikeTheLinkPathAlone) {
  GHT_REQUIRE_GPU();
  const bool delay = GetParam();
  const TempDir tmp("ght_cuda_split");
  write_random_corpus(tmp / "data");
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 6;
  const ScopedFlag delayed("GHT_OPT_DELAY", delay ? "on" : "off");
  const ScopedFlag no_warmup("GHT_OPT_DELAY_WARMUP", "0");  // delayed from step 1
  const ScopedFlag host_state("GHT_PLACE", "master=host,adam_*=host");  // split follows the plan
  auto train_with = [&](const std::string& name, const std::string& path, const std::string& share,
                        const std::string& host_arena, double max_norm) {
    const ScopedFlag choice("GHT_OPTIMIZER", path);
    const ScopedFlag cpu_share("GHT_OPT_CPU_SHARE", share);
    const ScopedFlag arena("GHT_OPT_SPECULATE_HOST", host_arena);
    TrainConfig c = small_run_config(tmp / "data", tmp / name);
    c.backend = "cuda";
    c.adam.max_grad_norm = max_norm;
    (void)train_cuda(c, run);
    return read_log(tmp / name);
  };
  const RunLog link = train_with("link", "gpu_link", "-1", "0", 0.0);
  const RunLog split = train_with("split", "split", "0.5", "0", 0.0);
  const RunLog spec = train_with("spec", "split", "0.5", "64MiB", 0.0);
  const RunLog clipped = train_with("clipped", "split", "0.5", "64MiB", 1e-3);

  ASSERT_EQ(link.loss.size(), 6u);
  for (const RunLog* other : {&split, &spec}) {
    ASSERT_EQ(other->loss.size(), 6u);
    for (const auto& [step, loss] : link.loss) {
      EXPECT_NEAR(other->loss.at(step), loss, 1e-3 * loss) << "step " << step;
    }
  }
  // The cpu half moves its gradients down and weights up (2 B up per parameter), not its state.
  EXPECT_LT(read_profile(tmp / "split").link_gb_h2d, read_profile(tmp / "link").link_gb_h2d);
  const Profile sp = read_profile(tmp / "spec"), plain = read_profile(tmp / "split");
  const Profile cl = read_profile(tmp / "clipped");
  for (std::int64_t step = 1; step <= 6; ++step) {
    EXPECT_EQ(plain.speculated.at(step), 0u) << "step " << step << ": speculated with no arena";
    if (delay) {
      EXPECT_EQ(sp.speculated.at(step), 0u) << "step " << step << ": the delayed mode does not speculate";
      continue;
    }
    EXPECT_GT(sp.speculated.at(step), 0u) << "step " << step << ": nothing was speculated";
    EXPECT_FALSE(sp.undone.at(step)) << "step " << step << ": an unclipped step undid its speculation";
  }
  if (!delay) {
    EXPECT_GT(cl.speculated.at(1), 0u);
    EXPECT_TRUE(cl.undone.at(1)) << "a clipped step kept its speculation";
    for (std::int64_t step = 2; step <= 6; ++step) EXPECT_EQ(cl.speculated.at(step), 0u) << "step " << step;
  }
  EXPECT_LT(clipped.loss.at(6), clipped.loss.at(1));  // it still learns
}

// GHT_OPT_SM_RESERVE: a partial delay's stale micro-batches (beside the gpu_link update that the
// next micro-batch waits for) plan their GEMMs for fewer SMs; the fresh ones, exact mode and the
// whole-step delay keep every SM; and the run learns as with every SM throughout.
TEST(CudaTrainSmReserve, APartialDelaysStaleMicroBatchesLeaveSmsFree) {
  GHT_REQUIRE_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const TempDir tmp("ght_cuda_sm_reserve");
  write_random_corpus(tmp / "data");
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 6;
  const ScopedFlag host_state("GHT_PLACE", "master=host,adam_*=host");
  const ScopedFlag link("GHT_OPTIMIZER", "gpu_link");
  const ScopedFlag dma("GHT_OPT_LINK_MODE", "dma");
  const ScopedFlag no_warmup("GHT_OPT_DELAY_WARMUP", "0");
  constexpr int kA = 4;
  auto train_with = [&](const std::string& name, const std::string& reserve, const std::string& delay,
                        const std::string& micro) {
    const ScopedFlag r("GHT_OPT_SM_RESERVE", reserve);
    const ScopedFlag d("GHT_OPT_DELAY", delay);
    const ScopedFlag j("GHT_OPT_DELAY_MICRO", micro);
    TrainConfig c = small_run_config(tmp / "data", tmp / name);
    c.backend = "cuda";
    c.model.micro_batch = 2;
    c.model.grad_accum = kA;
    (void)train_cuda(c, run);
    return std::make_pair(read_log(tmp / name), read_profile(tmp / name));
  };
  const auto [all_log, all] = train_with("all", "0", "on", "2");
  const auto [partial_log, partial] = train_with("partial", "8", "on", "2");
  const auto [whole_log, whole] = train_with("whole", "8", "on", "0");
  const auto [exact_log, exact] = train_with("exact", "8", "off", "0");

  EXPECT_EQ(all.sm_budget, 0);
  for (const Profile* p : {&partial, &whole, &exact}) EXPECT_EQ(p->sm_budget, prop.multiProcessorCount - 8);
  ASSERT_EQ(partial_log.loss.size(), 6u);
  for (std::int64_t step = 1; step <= 6; ++step) {
    EXPECT_EQ(all.reserved.at(step), 0) << "step " << step << ": GHT_OPT_SM_RESERVE=0";
    EXPECT_EQ(partial.reserved.at(step), 2) << "step " << step << ": the 2 stale micro-batches of 4";
    EXPECT_EQ(whole.reserved.at(step), 0) << "step " << step << ": the whole-step delay";
    EXPECT_EQ(exact.reserved.at(step), 0) << "step " << step << ": exact mode";
    EXPECT_NEAR(partial_log.loss.at(step), all_log.loss.at(step), 1e-3 * all_log.loss.at(step)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaTrainSplit, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("delayed") : std::string("exact"); });

}  // namespace
}  // namespace ght::trainer
