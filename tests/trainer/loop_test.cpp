// The shared training loop on the CPU backend: a previous run in the run directory needs
// --resume or --overwrite; every record carries the invocation's run_id; bad data fails before
// step 1; a step that throws leaves a checkpoint of the last completed step (data position
// rewound), from which a resume matches an uninterrupted run bit for bit; --resume accepts a run
// directory; a checkpoint directory named for another step is refused.
#include "trainer/loop.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "optimizer/adamw.hpp"
#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/data.hpp"
#include "trainer/metrics_log.hpp"
#include "trainer/train.hpp"
#include "trainer/train_run_util.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;
using ght::test::error_of;

namespace {

void write_corpus(const std::string& dir, std::uint32_t bad_val_token = 0) {
  ght::trainer::test::write_random_corpus(dir, 40000, 4000, bad_val_token);
}

TrainConfig small_config(const std::string& data, const std::string& out) {
  return ght::trainer::test::tiny_cpu_run_config(data, out);
}

TrainRunOptions quiet() {
  TrainRunOptions r;
  r.quiet = true;
  return r;
}

std::vector<nlohmann::json> records(const std::string& run) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run + "/log.jsonl");
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Loop, PreviousRunNeedsResumeOrOverwriteAndRecordsCarryTheRunId) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  TrainConfig cfg = small_config(tmp / "data", tmp / "run");
  cfg.steps = cfg.schedule.total_steps = 2;
  (void)train(cfg, quiet());
  std::set<std::string> ids;
  for (const auto& r : records(tmp / "run")) ids.insert(r.value("run_id", ""));
  ASSERT_EQ(ids.size(), 1u);
  ASSERT_FALSE(ids.begin()->empty()) << "records without a run_id";
  const std::string first_id = *ids.begin();
  std::ifstream resolved(tmp / "run/config.json");
  ASSERT_TRUE(resolved.good()) << "no <out>/config.json";
  EXPECT_EQ(nlohmann::json::parse(resolved).at("train").at("steps"), 2);

  const std::string msg = error_of<ght::logic_error>([&] { (void)train(cfg, quiet()); });
  EXPECT_NE(msg.find("--resume auto"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  EXPECT_EQ(ght::trainer::test::read_log(tmp / "run").loss.size(), 2u) << "a refused run wrote to the log";

  TrainRunOptions over = quiet();
  over.overwrite = true;
  (void)train(cfg, over);
  ids.clear();
  for (const auto& r : records(tmp / "run")) ids.insert(r.value("run_id", ""));
  ASSERT_EQ(ids.size(), 1u) << "the old run's records survived --overwrite";
  EXPECT_NE(*ids.begin(), first_id);
  EXPECT_EQ(list_checkpoints(tmp / "run"), std::vector<std::int64_t>{2});
}

TEST(Loop, WarnsWhenTheDataWouldRepeat) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");  // 40000 training tokens; 128 tokens per step
  TrainConfig cfg = small_config(tmp / "data", tmp / "run");
  testing::internal::CaptureStderr();
  { TrainSession fits(cfg, quiet()); }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  cfg.steps = cfg.schedule.total_steps = 1000;  // 128000 tokens: 3.2 passes
  testing::internal::CaptureStderr();
  { TrainSession repeats(cfg, quiet()); }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("3.20 passes"), std::string::npos) << err;
  EXPECT_NE(err.find("repeats"), std::string::npos) << err;
}

TEST(Loop, BadDataFailsBeforeStepOne) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data", /*bad_val_token=*/300);  // vocab is 256; read only at eval time
  TrainConfig cfg = small_config(tmp / "data", tmp / "run");
  const std::string msg = error_of<ght::io_error>([&] { (void)train(cfg, quiet()); });
  EXPECT_NE(msg.find("val_000000.bin"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "run/log.jsonl"));

  // A truncated training shard (header count beyond the file) too.
  write_corpus(tmp / "data2");
  const std::string shard = tmp / "data2/train_000000.bin";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  cfg.data = tmp / "data2";
  const std::string msg2 = error_of<ght::io_error>([&] { (void)train(cfg, quiet()); });
  EXPECT_NE(msg2.find("train_000000.bin"), std::string::npos) << msg2;
  EXPECT_FALSE(fs::exists(tmp / "run/log.jsonl"));
}

// The CPU backend, failing part-way through step `fail_at` (0-based) after reading a batch.
class FailingBackend final : public TrainBackend {
 public:
  FailingBackend(const TrainSession& s, std::int64_t fail_at) : inner_(make_cpu_backend(s)), fail_at_(fail_at) {}
  std::string name() const override { return inner_->name(); }
  const std::vector<NamedTensor>& tensors() const override { return inner_->tensors(); }
  ght::optimizer::AdamW& optimizer() override { return inner_->optimizer(); }
  void init_weights(std::uint64_t seed) override { inner_->init_weights(seed); }
  void load_weights(std::size_t r, std::span<const float> w) override { inner_->load_weights(r, w); }
  StepOutcome step(std::int64_t step, double lr, DataLoader& data) override {
    if (step == fail_at_) {
      Batch b;
      data.next(b);
      throw std::runtime_error("injected failure");
    }
    return inner_->step(step, lr, data);
  }
  double eval_loss(const Batch& b) override { return inner_->eval_loss(b); }

 private:
  std::unique_ptr<TrainBackend> inner_;
  std::int64_t fail_at_;
};

TEST(Loop, FailedStepCheckpointsTheLastCompletedStepAndResumesExactly) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  (void)train(small_config(tmp / "data", tmp / "straight"), quiet());

  const TrainConfig cfg = small_config(tmp / "data", tmp / "failed");
  {
    TrainSession s(cfg, quiet());
    FailingBackend be(s, /*fail_at=*/3);
    const std::string msg = error_of<std::runtime_error>([&] { (void)run_training(be, s); });
    EXPECT_EQ(msg, "injected failure");
    EXPECT_EQ(s.summary.last_checkpoint, (fs::path(cfg.out) / "ckpt_00000003").string());
  }
  ASSERT_EQ(list_checkpoints(cfg.out), std::vector<std::int64_t>{3});
  EXPECT_TRUE(verify(cfg.out + "/ckpt_00000003").empty());

  TrainRunOptions resume = quiet();
  resume.resume = "auto";
  const TrainSummary sum = train(cfg, resume);
  EXPECT_EQ(sum.first_step, 3);
  EXPECT_EQ(sum.last_step, 6);
  const auto a = ght::trainer::test::read_log(tmp / "straight").loss, b = ght::trainer::test::read_log(cfg.out).loss;
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;  // bit-identical
}

TEST(Loop, FailureInTheFirstStepWritesNoCheckpoint) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  const TrainConfig cfg = small_config(tmp / "data", tmp / "run");
  TrainSession s(cfg, quiet());
  FailingBackend be(s, /*fail_at=*/0);
  EXPECT_THROW((void)run_training(be, s), std::runtime_error);
  EXPECT_TRUE(list_checkpoints(cfg.out).empty());  // step 0 is the seed's init: nothing to keep
}

TEST(Loop, ResumeFromARunDirectoryAndANoOpRerun) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  TrainConfig cfg = small_config(tmp / "data", tmp / "a");
  cfg.ckpt_every = 2;
  cfg.steps = cfg.schedule.total_steps = 4;
  (void)train(cfg, quiet());

  TrainConfig next = cfg;
  next.out = tmp / "b";
  next.steps = next.schedule.total_steps = 6;
  TrainRunOptions r = quiet();
  r.resume = tmp / "a";  // the run directory: its newest checkpoint, step 4
  const TrainSummary s = train(next, r);
  EXPECT_EQ(s.first_step, 4);
  EXPECT_EQ(s.last_step, 6);

  r.resume = "auto";
  const TrainSummary again = train(next, r);  // already at step 6
  EXPECT_EQ(again.first_step, 6);
  EXPECT_EQ(again.last_step, 6);

  // An empty run directory is an error, not a fresh start.
  fs::create_directories(tmp / "empty/ckpt_00000001");
  r.resume = tmp / "empty";
  EXPECT_THROW((void)train(next, r), ght::io_error);
}

TEST(Checkpoint, DirectoryNamedForAnotherStepIsRefused) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  TrainConfig cfg = small_config(tmp / "data", tmp / "run");
  cfg.steps = cfg.schedule.total_steps = 4;
  (void)train(cfg, quiet());
  fs::rename(tmp / "run/ckpt_00000004", tmp / "run/ckpt_00000009");
  const std::string msg = error_of<ght::io_error>([&] { (void)load(tmp / "run/ckpt_00000009"); });
  EXPECT_NE(msg.find("step 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ckpt_00000009"), std::string::npos) << msg;
  EXPECT_FALSE(verify(tmp / "run/ckpt_00000009").empty());
  EXPECT_FALSE(load_latest(tmp / "run").has_value());
  // A name that claims no step (a copy kept by hand) is fine.
  fs::rename(tmp / "run/ckpt_00000009", tmp / "run/best");
  EXPECT_EQ(load(tmp / "run/best").step, 4);
}

}  // namespace

// TrainSession::reshape (the plan's micro-batch, trainer/plan_decide.hpp): the tokens per step stay,
// the training loader takes the new micro-batch, the held-out loader keeps the configured one (the
// same eval tokens), config.json says what trains, and a checkpoint of that shape resumed at the
// configured one names the override that resumes it.
TEST(Loop, AReshapedSessionKeepsTheTokensAndTheHeldOutBatchesAndAResumeNamesTheMicroBatch) {
  ght::test::TempDir tmp("ght_loop_test");
  write_corpus(tmp / "data");
  TrainConfig cfg = small_config(tmp / "data", tmp / "four");  // 2 x 32 tokens, 2 per step
  cfg.steps = cfg.schedule.total_steps = 2;
  {
    TrainSession s(cfg, quiet());
    const std::string bad = error_of<ght::logic_error>([&] { s.reshape(3, 1); });
    EXPECT_NE(bad.find("does not keep the step's 128 tokens"), std::string::npos) << bad;
    s.reshape(4, 1);
    EXPECT_EQ(s.cfg.model.micro_batch, 4);
    EXPECT_EQ(s.cfg.model.grad_accum, 1);
    EXPECT_EQ(s.tokens_per_step(), 128);
    Batch b;
    s.loader->next(b);
    EXPECT_EQ(b.batch, 4);
    ASSERT_TRUE(s.val_loader != nullptr);
    s.val_loader->next(b);
    EXPECT_EQ(b.batch, 2);
    std::ifstream f(cfg.out + "/config.json");
    const auto saved = nlohmann::json::parse(f).at("model");
    EXPECT_EQ(saved.at("micro_batch"), 4);
    EXPECT_EQ(saved.at("grad_accum"), 1);
  }
  TrainRunOptions overwrite = quiet();
  overwrite.overwrite = true;
  {
    TrainSession s(cfg, overwrite);
    s.reshape(4, 1);
    const auto be = make_cpu_backend(s);
    const TrainSummary sum = run_training(*be, s);
    EXPECT_EQ(sum.last_step, 2);
    EXPECT_TRUE(sum.eval_loss.has_value());
  }
  TrainConfig more = cfg;
  more.steps = more.schedule.total_steps = 3;
  TrainRunOptions resume = quiet();
  resume.resume = "auto";
  const std::string msg = error_of<ght::logic_error>([&] { (void)train(more, resume); });
  EXPECT_NE(msg.find("model.micro_batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("add -o model.micro_batch=4"), std::string::npos) << msg;
}
