// GHT_OPT_DELAY=1, the one-step-delayed update, through the training loop on both backends:
//   - step k+1 computes with the weights after update k-1: the compute weights a checkpoint of
//     step k keeps are the master weights of the checkpoint of step k-1 (cpu: the same fp32
//     values; cuda: those rounded to bf16, as every compute weight is), and step 2 computes with
//     the initial weights, so its loss is that of an exact run whose first update changed nothing
//     (lr 1e-30);
//   - with the weight prediction (GHT_OPT_DELAY_PREDICT=x, default 1), those weights are master
//     after update k-1 extrapolated by x of that update, and the checkpoint also keeps the next
//     step's (master of step k extrapolated);
//   - step 1 is the exact run's step 1;
//   - stopping and resuming matches an uninterrupted delayed run bit for bit (losses and every
//     checkpoint file), and so does resuming from the checkpoint a step failing part-way writes
//     (a partial delay's step, after its switch to the fresh weights);
//   - checkpoints of one mode resume in the other with a note that says what happens;
//   - with an exact warm-up (GHT_OPT_DELAY_WARMUP=W) the first W steps and step W+1 are the exact
//     run's, and a stop and resume across the switch matches the straight run.
// Every test but the warm-up one sets GHT_OPT_DELAY_WARMUP=0 (the fixture).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/registry.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/data.hpp"
#include "trainer/file_io.hpp"
#include "trainer/train.hpp"
#include "trainer/train_run_util.hpp"

using namespace ght::trainer;

namespace {

constexpr const char* kComputeWeights = "delayed.compute_weights.safetensors";
constexpr const char* kNextComputeWeights = "delayed.next_compute_weights.safetensors";

TrainRunOptions quiet(const std::string& resume = "", std::optional<std::int64_t> stop_at = std::nullopt) {
  TrainRunOptions r;
  r.quiet = true;
  r.resume = resume;
  r.stop_at = stop_at;
  return r;
}

std::string ckpt(const std::string& run, std::int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "/ckpt_%08lld", static_cast<long long>(step));
  return run + b;
}

// Each of `files` is the same bytes in checkpoint `step` of both runs (EXPECT_TRUE: a failure
// names the file without dumping its bytes).
void expect_same_files(const std::string& run_a, const std::string& run_b, std::int64_t step,
                       const std::vector<const char*>& files) {
  for (const char* f : files) {
    EXPECT_TRUE(ght::trainer::fileio::read_all(ckpt(run_a, step) + "/" + f) ==
                ght::trainer::fileio::read_all(ckpt(run_b, step) + "/" + f))
        << "checkpoint " << step << ": " << f << " differs between " << run_a << " and " << run_b;
  }
}

// Round to the nearest bf16, ties to even (what the GPU's weights hold of a master value).
float bf16_round(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// A run whose updates move nothing: lr 1e-30 changes no weight of magnitude above ~1e-22 (fp32
// keeps 24 bits), and the init draws none that small, so every step computes with the initial
// weights.
TrainConfig frozen(TrainConfig c) {
  c.schedule.kind = ScheduleKind::constant;
  c.schedule.lr = 1e-30;
  c.schedule.min_lr = 1e-30;
  c.schedule.warmup_steps = 0;
  return c;
}

class DelayedUpdate : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "cuda") GHT_REQUIRE_GPU();
    test::write_random_corpus(tmp_ / "data", 40000, 4000);
  }
  [[nodiscard]] TrainConfig config(const std::string& name) const {
    TrainConfig c = test::tiny_cpu_run_config(tmp_ / "data", tmp_ / name);
    c.backend = GetParam();
    c.ckpt_every = 1;
    c.keep = 100;  // every checkpoint stays
    return c;
  }
  [[nodiscard]] bool gpu() const { return std::string(GetParam()) == "cuda"; }
  ght::test::TempDir tmp_{"ght_delayed_update_test"};
  std::optional<ght::test::ScopedFlag> no_warmup_{std::in_place, "GHT_OPT_DELAY_WARMUP", "0"};
};

TEST_P(DelayedUpdate, StepKPlusOneComputesWithTheWeightsAfterUpdateKMinusOne) {
  ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  ght::test::ScopedFlag plain("GHT_OPT_DELAY_PREDICT", "0");
  // The whole-step delay and a partial one (its first micro-batch of 2): either way the weights a
  // checkpoint keeps for the next step's stale micro-batches are master one update back.
  for (const char* micro : {"0", "1"}) {
    SCOPED_TRACE(std::string("GHT_OPT_DELAY_MICRO=") + micro);
    ght::test::ScopedFlag stale("GHT_OPT_DELAY_MICRO", micro);
    const TrainConfig cfg = config(std::string("delayed") + micro);
    (void)train(cfg, quiet());
    LoadOptions lo;
    lo.tensor_files = {kComputeWeights, kNextComputeWeights};
    for (std::int64_t k = 1; k <= cfg.steps; ++k) {
      const CheckpointData now = load(ckpt(cfg.out, k), lo);
      ASSERT_EQ(now.optimizer.value("delayed_update", false), true);
      ASSERT_EQ(now.tensor_files.count(kComputeWeights), 1u) << ckpt(cfg.out, k) << " has no " << kComputeWeights;
      const auto& w = now.tensor_files.at(kComputeWeights).tensors;
      // The compute weights of step k are master after update k-1; before step 2, the initial
      // weights (update 0 = none): step 1's checkpoint then holds its own master's predecessor,
      // which only an earlier checkpoint has, so k = 1 is compared with itself below.
      if (k == 1) continue;
      const CheckpointData before = load(ckpt(cfg.out, k - 1));
      ASSERT_EQ(w.size(), before.master.size());
      std::size_t differ = 0, total = 0;
      for (std::size_t r = 0; r < w.size(); ++r) {
        ASSERT_EQ(w[r].name, before.master[r].name);
        for (std::size_t i = 0; i < w[r].data.size(); ++i) {
          const float want = gpu() ? bf16_round(before.master[r].data[i]) : before.master[r].data[i];
          differ += std::memcmp(&w[r].data[i], &want, 4) != 0;
          ++total;
        }
      }
      EXPECT_EQ(differ, 0u) << "step " << k << ": " << differ << " of " << total
                            << " compute weights are not master of step " << k - 1;
      // ...and not master of step k (the update of step k is not applied yet).
      const CheckpointData& mine = now;
      std::size_t same = 0;
      for (std::size_t r = 0; r < w.size(); ++r) {
        for (std::size_t i = 0; i < w[r].data.size(); ++i) {
          const float m = gpu() ? bf16_round(mine.master[r].data[i]) : mine.master[r].data[i];
          same += std::memcmp(&w[r].data[i], &m, 4) == 0;
        }
      }
      EXPECT_LT(same, total) << "step " << k << ": the compute weights already are master of step " << k;
      EXPECT_EQ(now.tensor_files.count(kNextComputeWeights), 0u) << "without a prediction they are master's";
    }
  }
}

// p + x·(p − before), each fp32 operation rounded (the AdamW kernels' order), and for the GPU's
// weights rounded to bf16.
std::vector<float> predicted(const CheckpointTensor& p, const CheckpointTensor& before, float x, bool bf16) {
  std::vector<float> out(p.data.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const volatile float d = p.data[i] - before.data[i];
    const volatile float e = x * d;
    const float q = p.data[i] + e;
    out[i] = bf16 ? bf16_round(q) : q;
  }
  return out;
}

TEST_P(DelayedUpdate, WithThePredictionStepKPlusOneComputesWithMasterAfterKMinusOneExtrapolated) {
  ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  ght::test::ScopedFlag x("GHT_OPT_DELAY_PREDICT", "2");  // a power of 2: x·d is exact (no FMA question)
  const TrainConfig cfg = config("predicted");
  (void)train(cfg, quiet());
  LoadOptions lo;
  lo.tensor_files = {kComputeWeights, kNextComputeWeights};
  std::vector<CheckpointData> ck(static_cast<std::size_t>(cfg.steps) + 1);
  for (std::int64_t k = 1; k <= cfg.steps; ++k) ck[static_cast<std::size_t>(k)] = load(ckpt(cfg.out, k), lo);
  // Checkpoint k: the next step computes with master of k-1 extrapolated by update k-1 (k >= 3:
  // master of step 0 is in no checkpoint), the step after with master of k extrapolated by update k.
  for (std::int64_t k = 2; k <= cfg.steps; ++k) {
    const auto& now = ck[static_cast<std::size_t>(k)];
    const auto& prev = ck[static_cast<std::size_t>(k - 1)];
    ASSERT_EQ(now.tensor_files.count(kComputeWeights), 1u);
    ASSERT_EQ(now.tensor_files.count(kNextComputeWeights), 1u) << ckpt(cfg.out, k) << " has no " << kNextComputeWeights;
    struct Want {
      const char* file;
      const CheckpointData* p;
      const CheckpointData* before;
    };
    std::vector<Want> wants = {{kNextComputeWeights, &now, &prev}};
    if (k >= 3) wants.push_back({kComputeWeights, &prev, &ck[static_cast<std::size_t>(k - 2)]});
    for (const Want& want : wants) {
      const auto& w = now.tensor_files.at(want.file).tensors;
      ASSERT_EQ(w.size(), want.p->master.size());
      std::size_t differ = 0, moved = 0, total = 0;
      for (std::size_t r = 0; r < w.size(); ++r) {
        const std::vector<float> exp = predicted(want.p->master[r], want.before->master[r], 2.0f, gpu());
        for (std::size_t i = 0; i < exp.size(); ++i) {
          differ += std::memcmp(&w[r].data[i], &exp[i], 4) != 0;
          const float plain = gpu() ? bf16_round(want.p->master[r].data[i]) : want.p->master[r].data[i];
          moved += std::memcmp(&exp[i], &plain, 4) != 0;
          ++total;
        }
      }
      EXPECT_EQ(differ, 0u) << "checkpoint " << k << ", " << want.file << ": " << differ << " of " << total
                            << " weights are not the extrapolated master";
      EXPECT_GT(moved, total / 4) << "checkpoint " << k << ": the prediction hardly differs from master (a weak test)";
    }
  }
}

TEST_P(DelayedUpdate, StepOneIsExactAndStepTwoSeesTheInitialWeights) {
  const TrainConfig exact_cfg = config("exact");
  (void)train(exact_cfg, quiet("", 2));
  // The first update moves nothing, so step 2 computes with the initial weights.
  (void)train(frozen(config("lr0")), quiet("", 2));
  {
    ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
    (void)train(config("delayed"), quiet("", 2));
  }
  const auto exact = test::read_log(tmp_ / "exact").loss, lr0 = test::read_log(tmp_ / "lr0").loss,
             delayed = test::read_log(tmp_ / "delayed").loss;
  ASSERT_EQ(delayed.size(), 2u);
  EXPECT_EQ(delayed.at(1), exact.at(1));  // bit-identical
  EXPECT_EQ(delayed.at(2), lr0.at(2));
  EXPECT_NE(delayed.at(2), exact.at(2));  // the exact step 2 computes after update 1
}

TEST_P(DelayedUpdate, StopAndResumeMatchesAStraightRunByteForByte) {
  ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  // The whole-step delay with its prediction, and a partial delay (its first micro-batch of 2
  // stale; no prediction, so no second compute-weight file).
  for (const char* micro : {"0", "1"}) {
    SCOPED_TRACE(std::string("GHT_OPT_DELAY_MICRO=") + micro);
    ght::test::ScopedFlag stale("GHT_OPT_DELAY_MICRO", micro);
    const bool partial = std::string(micro) == "1";
    const TrainConfig straight = config(std::string("straight") + micro), cfg = config(std::string("resumed") + micro);
    (void)train(straight, quiet());
    (void)train(cfg, quiet("", 3));
    const TrainSummary s = train(cfg, quiet("auto"));
    EXPECT_EQ(s.first_step, 3);
    EXPECT_EQ(s.last_step, 6);
    const auto a = test::read_log(straight.out).loss, b = test::read_log(cfg.out).loss;
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;  // bit-identical
    std::vector<const char*> files = {"optimizer.master.safetensors", "optimizer.m.safetensors",
                                      "optimizer.v.safetensors", "model.safetensors", kComputeWeights};
    if (!partial) files.push_back(kNextComputeWeights);
    EXPECT_EQ(std::filesystem::exists(ckpt(straight.out, 6) + "/" + kNextComputeWeights), !partial);
    expect_same_files(straight.out, cfg.out, 6, files);
  }
}

// GHT_OPT_DELAY_MICRO=1 of 2 micro-batches: step 2's first micro-batch computes with the initial
// weights (update 1 is in flight), its second waits for update 1 and computes with master after
// it. On a corpus of one repeated token both micro-batches hold the same tokens, so step 2's loss
// is the mean of the exact run's (both micro-batches after update 1) and that of a run whose
// first update changed nothing (lr 1e-30: both at the initial weights).
TEST_P(DelayedUpdate, APartialDelayComputesItsFirstMicroBatchesStaleAndTheRestFresh) {
  const std::string same = tmp_ / "same";
  std::filesystem::create_directories(same);
  write_shard(same + "/train_000000.bin", std::vector<std::uint32_t>(40000, 7), TokenDtype::u16);
  write_shard(same + "/val_000000.bin", std::vector<std::uint32_t>(4000, 7), TokenDtype::u16);
  auto on_same = [&](const std::string& name) {
    TrainConfig c = config(name);
    c.data = same;
    return c;
  };
  ASSERT_EQ(on_same("x").model.grad_accum, 2);
  (void)train(on_same("exact"), quiet("", 2));
  (void)train(frozen(on_same("lr0")), quiet("", 2));
  {
    ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
    ght::test::ScopedFlag stale("GHT_OPT_DELAY_MICRO", "1");
    (void)train(on_same("partial"), quiet("", 2));
  }
  const auto exact = test::read_log(tmp_ / "exact").loss, lr0 = test::read_log(tmp_ / "lr0").loss,
             partial = test::read_log(tmp_ / "partial").loss;
  ASSERT_EQ(partial.size(), 2u);
  EXPECT_EQ(partial.at(1), exact.at(1));  // step 1: nothing in flight, both micro-batches fresh
  ASSERT_GT(std::abs(exact.at(2) - lr0.at(2)), 1e-3) << "update 1 hardly moves the loss: a weak test";
  const double want = 0.5 * (exact.at(2) + lr0.at(2));
  EXPECT_NEAR(partial.at(2), want, 1e-5 * want) << "exact " << exact.at(2) << ", initial weights " << lr0.at(2);
}

// A partial delay whose step fails part-way, after its switch to the fresh weights (its data
// cannot be read): the checkpoint written before the error is rethrown keeps the weights the
// step's stale micro-batches computed with, so the resumed run matches a straight one bit for bit.
TEST_P(DelayedUpdate, AStepThatFailsAfterItsSwitchResumesByteForByte) {
  ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  ght::test::ScopedFlag plain("GHT_OPT_DELAY_PREDICT", "0");
  ght::test::ScopedFlag stale("GHT_OPT_DELAY_MICRO", "1");
  auto three = [&](const std::string& name) {  // 1 of 3 micro-batches stale
    TrainConfig c = config(name);
    c.model.grad_accum = 3;
    return c;
  };
  const TrainConfig straight = three("straight");
  TrainConfig cfg = three("failed");
  cfg.ckpt_every = 100;  // the only checkpoint before the end is the one the failure writes
  (void)train(straight, quiet());
  // Steps 1-3 read 9 batches; step 4 reads 2 (micro-batch 2 computes after the switch), then fails.
  constexpr std::int64_t kDone = 3;
  fail_next_fill_after_for_testing(kDone * 3 + 2);
  std::string msg;
  try {
    (void)train(cfg, quiet());
  } catch (const ght::io_error& e) {
    msg = e.what();
  }
  fail_next_fill_after_for_testing(-1);
  ASSERT_NE(msg.find("injected read failure"), std::string::npos) << "the run did not fail where injected: " << msg;
  ASSERT_EQ(list_checkpoints(cfg.out), std::vector<std::int64_t>{kDone});
  const std::vector<const char*> files = {"optimizer.master.safetensors", "optimizer.m.safetensors",
                                          "optimizer.v.safetensors", "model.safetensors", kComputeWeights};
  for (const std::int64_t k : {kDone, cfg.steps}) {
    if (k == cfg.steps) {
      const TrainSummary s = train(cfg, quiet("auto"));
      EXPECT_EQ(s.first_step, kDone);
      EXPECT_EQ(s.last_step, cfg.steps);
    }
    expect_same_files(straight.out, cfg.out, k, files);
  }
  const auto a = test::read_log(straight.out).loss, b = test::read_log(cfg.out).loss;
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;  // bit-identical
}

TEST_P(DelayedUpdate, ACheckpointOfTheOtherModeResumesWithANote) {
  const TrainConfig exact = config("exact");
  (void)train(exact, quiet("", 2));
  {
    ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
    TrainRunOptions r = quiet(ckpt(exact.out, 2), 3);
    r.quiet = false;
    ::testing::internal::CaptureStdout();
    (void)train(config("to_delayed"), r);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find("was written without GHT_OPT_DELAY: the first step after the resume computes with its master"),
              std::string::npos)
        << out;
  }
  TrainRunOptions r = quiet(ckpt(tmp_ / "to_delayed", 3), 4);
  r.quiet = false;
  ::testing::internal::CaptureStdout();
  (void)train(config("back_to_exact"), r);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("was written with GHT_OPT_DELAY=1; this run updates exactly"), std::string::npos) << out;
}

TEST_P(DelayedUpdate, AnExactWarmUpRunsTheExactStepsAndResumesAcrossTheSwitch) {
  no_warmup_.reset();
  const TrainConfig exact = config("exact");
  (void)train(exact, quiet());
  ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  ght::test::ScopedFlag warm("GHT_OPT_DELAY_WARMUP", "3");
  const TrainConfig straight = config("straight"), cfg = config("resumed");
  (void)train(straight, quiet());
  const auto e = test::read_log(exact.out).loss, d = test::read_log(straight.out).loss;
  ASSERT_EQ(e.size(), 6u);
  ASSERT_EQ(d.size(), 6u);
  // Steps 1-3 update exactly; step 4 (the first delayed one) still computes after update 3.
  for (std::int64_t k = 1; k <= 4; ++k) EXPECT_EQ(d.at(k), e.at(k)) << "step " << k;  // bit-identical
  EXPECT_NE(d.at(5), e.at(5)) << "step 5 computes one update behind: it cannot be the exact step";
  // Stop in the warm-up, resume across the switch; stop after it, resume delayed.
  for (std::int64_t stop : {2, 4}) {
    SCOPED_TRACE("stop at " + std::to_string(stop));
    std::filesystem::remove_all(cfg.out);
    (void)train(cfg, quiet("", stop));
    (void)train(cfg, quiet("auto"));
    const auto r = test::read_log(cfg.out).loss;
    ASSERT_EQ(r.size(), 6u);
    for (const auto& [step, loss] : d) EXPECT_EQ(r.at(step), loss) << "step " << step;
    expect_same_files(straight.out, cfg.out, 6,
                      {"optimizer.master.safetensors", "model.safetensors", kComputeWeights, kNextComputeWeights});
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DelayedUpdate, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
