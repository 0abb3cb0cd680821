// GHT_OPT_STATE=bf16 and q8 through the training loop on the CPU backend: a checkpoint records the state
// type and holds m and v as F32 tensors of bf16 values; stopping and resuming matches an
// uninterrupted run bit for bit (every loss and every tensor file byte); a checkpoint of the other
// type loads with a note naming both types and the variable: fp32 -> bf16 rounds m and v to
// nearest, bf16 -> fp32 widens them (the conversions themselves: optimizer/adamw_bf16_state_test).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/registry.hpp"
#include "common/temp_dir.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/file_io.hpp"
#include "trainer/train.hpp"
#include "trainer/train_run_util.hpp"

using namespace ght::trainer;

namespace {

TrainConfig config(const std::string& data, const std::string& out) {
  return ght::trainer::test::tiny_cpu_run_config(data, out);
}

TrainRunOptions quiet(const std::string& resume = "", std::optional<std::int64_t> stop_at = std::nullopt) {
  TrainRunOptions r;
  r.quiet = true;
  r.resume = resume;
  r.stop_at = stop_at;
  return r;
}

std::uint32_t low_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u & 0xFFFFu;
}

// m and v of a checkpoint hold bf16 values only, and not only zeros.
void expect_bf16_moments(const CheckpointData& d) {
  std::size_t nonzero = 0, total = 0;
  for (const auto* group : {&d.adam_m, &d.adam_v}) {
    for (const CheckpointTensor& t : *group) {
      for (const float x : t.data) {
        ASSERT_EQ(low_bits(x), 0u) << t.name << ": not a bf16 value";
        nonzero += x != 0.0f;
        ++total;
      }
    }
  }
  EXPECT_GT(total, 0u);
  EXPECT_GT(nonzero, total / 2);
}

class OptStateResume : public ::testing::Test {
 protected:
  void SetUp() override { test::write_random_corpus(tmp_ / "data", 40000, 4000); }
  ght::test::TempDir tmp_{"ght_opt_state_test"};
};

// Stop at step 3 and resume to 6 with m and v of `type`: every loss and every tensor file byte
// equal to a straight run's.
void expect_exact_resume(const std::string& root, const char* type) {
  ght::test::ScopedFlag st("GHT_OPT_STATE", type);
  (void)train(config(root + "/data", root + "/straight"), quiet());
  const TrainConfig cfg = config(root + "/data", root + "/resumed");
  (void)train(cfg, quiet("", 3));
  ASSERT_EQ(list_checkpoints(cfg.out), std::vector<std::int64_t>{3});
  const CheckpointData at3 = load(cfg.out + "/ckpt_00000003");
  EXPECT_EQ(at3.optimizer.at("state_dtype"), type);
  if (std::string(type) == "bf16") expect_bf16_moments(at3);

  const TrainSummary s = train(cfg, quiet("auto"));
  EXPECT_EQ(s.first_step, 3);
  EXPECT_EQ(s.last_step, 6);
  const auto a = test::read_log(root + "/straight").loss, b = test::read_log(cfg.out).loss;
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;  // bit-identical
  for (const char* f : {"optimizer.master.safetensors", "optimizer.m.safetensors", "optimizer.v.safetensors",
                        "model.safetensors"}) {
    EXPECT_EQ(fileio::read_all(root + "/straight/ckpt_00000006/" + f), fileio::read_all(cfg.out + "/ckpt_00000006/" + f))
        << f << " differs between the straight and the resumed run";
  }
  if (std::string(type) == "bf16") expect_bf16_moments(load(cfg.out + "/ckpt_00000006"));
}

TEST_F(OptStateResume, Bf16StopAndResumeMatchesAStraightRunByteForByte) { expect_exact_resume(tmp_.str(), "bf16"); }

// q8: the checkpoint holds the dequantized m and v; loading them quantizes back to the same
// codes and scales (optimizer/adamw_q8_state_test), so the resumed run is the straight one.
TEST_F(OptStateResume, Q8StopAndResumeMatchesAStraightRunByteForByte) { expect_exact_resume(tmp_.str(), "q8"); }

TEST_F(OptStateResume, AnFp32CheckpointLoadsIntoQ8WithANote) {
  const std::string fp32_run = tmp_ / "fp32";
  (void)train(config(tmp_ / "data", fp32_run), quiet("", 3));
  ght::test::ScopedFlag q8("GHT_OPT_STATE", "q8");
  TrainRunOptions r;
  r.resume = fp32_run + "/ckpt_00000003";
  ::testing::internal::CaptureStdout();
  const TrainSummary s = train(config(tmp_ / "data", tmp_ / "q8"), r);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.first_step, 3);
  EXPECT_NE(out.find("holds fp32 AdamW m and v, this run keeps q8 (GHT_OPT_STATE): converted on load, quantized"),
            std::string::npos)
      << out;
  EXPECT_EQ(load(tmp_ / "q8/ckpt_00000006").optimizer.at("state_dtype"), "q8");
}

TEST_F(OptStateResume, ACheckpointOfTheOtherTypeConvertsWithANote) {
  const std::string fp32_run = tmp_ / "fp32", bf16_run = tmp_ / "bf16";
  (void)train(config(tmp_ / "data", fp32_run), quiet("", 3));
  EXPECT_EQ(load(fp32_run + "/ckpt_00000003").optimizer.at("state_dtype"), "fp32");
  {
    ght::test::ScopedFlag bf16("GHT_OPT_STATE", "bf16");
    TrainRunOptions r;
    r.resume = fp32_run + "/ckpt_00000003";
    r.stop_at = 4;
    ::testing::internal::CaptureStdout();
    const TrainSummary s = train(config(tmp_ / "data", bf16_run), r);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(s.first_step, 3);
    EXPECT_NE(out.find("holds fp32 AdamW m and v, this run keeps bf16 (GHT_OPT_STATE): converted on load, rounded"),
              std::string::npos)
        << out;
    const CheckpointData at4 = load(bf16_run + "/ckpt_00000004");
    EXPECT_EQ(at4.optimizer.at("state_dtype"), "bf16");
    expect_bf16_moments(at4);
  }
  TrainRunOptions r;
  r.resume = bf16_run + "/ckpt_00000004";
  ::testing::internal::CaptureStdout();
  const TrainSummary s = train(config(tmp_ / "data", tmp_ / "back"), r);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.first_step, 4);
  EXPECT_EQ(s.last_step, 6);
  EXPECT_NE(out.find("holds bf16 AdamW m and v, this run keeps fp32 (GHT_OPT_STATE): converted on load, exactly"),
            std::string::npos)
      << out;
  EXPECT_EQ(load(tmp_ / "back/ckpt_00000006").optimizer.at("state_dtype"), "fp32");
}

}  // namespace
