// Run-configuration hardening (issue 16): non-finite numbers and integers that would wrap or
// saturate are rejected in every input path with the key and its range; the built-in warmup is
// clamped for short runs; a directory given as the config file says so; model errors name the key;
// first_difference() names the field a resume disagrees on.
#include "trainer/train_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/model_config.hpp"
#include "trainer/model_config_toml.hpp"

namespace ght::trainer {
namespace {

namespace fs = std::filesystem;
using ght::test::error_of;

std::string override_error(const std::string& item) {
  return error_of<std::exception>([&] { (void)resolve_train_config("tiny", "", {item}); });
}

fs::path project_root() { return fs::path(GHT_SOURCE_DIR); }  // tests/CMakeLists.txt

TEST(TrainConfigNumbers, NonFiniteValuesAreRejectedWithTheKey) {
  for (const std::string key : {"optimizer.max_grad_norm", "optimizer.weight_decay", "optimizer.eps",
                                "optimizer.beta1", "model.rope_theta", "model.rms_eps",
                                "model.aux_loss_coef", "model.z_loss_coef", "schedule.lr",
                                "schedule.min_lr"}) {
    for (const std::string v : {"nan", "inf", "-inf"}) {
      SCOPED_TRACE(key + "=" + v);
      const std::string msg = override_error(key + "=" + v);
      EXPECT_CONTAINS(msg, key);
      EXPECT_CONTAINS(msg, "finite");
    }
  }
}

TEST(TrainConfigNumbers, NonFiniteInATomlFileIsRejected) {
  ght::test::TempDir dir("ght_train_config");
  const std::string path = dir / "run.toml";
  std::ofstream(path) << "[optimizer]\nmax_grad_norm = inf\n";
  const std::string msg = error_of<std::exception>([&] { (void)resolve_train_config("tiny", path, {}); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "optimizer.max_grad_norm");
  EXPECT_CONTAINS(msg, "finite");
}

TEST(TrainConfigNumbers, IntegersDoNotWrapOrSaturate) {
  struct Case {
    std::string item, key, range;
  };
  const std::vector<Case> cases = {
      {"model.d_model=4294967392", "model.d_model", "[1, 65536]"},
      {"model.layers=-1", "model.layers", "[1, 4096]"},
      {"train.seed=-1", "train.seed", "[0, 9223372036854775806]"},
      {"train.steps=99999999999999999999", "train.steps", "[1, 1000000000000]"},
      {"train.steps=0", "train.steps", "[1, 1000000000000]"},
      {"train.keep=4294967297", "train.keep", "[1, 1048576]"},
      {"schedule.warmup_steps=-5", "schedule.warmup_steps", "[0, 1000000000000]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.item);
    const std::string msg = override_error(c.item);
    EXPECT_CONTAINS(msg, c.key);
    EXPECT_CONTAINS(msg, c.range);
  }
  EXPECT_CONTAINS(override_error("train.steps=99999999999999999999"), "overflows");
}

TEST(TrainConfigNumbers, JsonPathIsCheckedToo) {
  nlohmann::json j = resolve_train_config("tiny", "", {}).to_json();
  j["model"]["d_model"] = 4294967392LL;
  EXPECT_CONTAINS(error_of<std::exception>([&] { (void)TrainConfig::from_json(j); }), "model.d_model");
}

TEST(TrainConfigNumbers, ValuesInRangeStillWork) {
  const TrainConfig c = resolve_train_config(
      "tiny", "", {"train.seed=0", "model.d_model=128", "optimizer.max_grad_norm=0", "train.steps=1000000"});
  EXPECT_EQ(c.seed, 0u);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.steps, 1000000);
}

TEST(TrainConfigWarmup, ShortRunsClampTheBuiltInWarmup) {
  const TrainConfig c = resolve_train_config("tiny", "", {"train.steps=5"});
  EXPECT_EQ(c.schedule.warmup_steps, 5);
  EXPECT_EQ(c.schedule.total_steps, 5);
  const TrainConfig d = resolve_train_config("tiny", "", {"train.steps=500"});
  EXPECT_EQ(d.schedule.warmup_steps, kDefaultWarmupSteps);
  // wsd: the warmup must end before the decay phase (the last 20% by default).
  const TrainConfig w = resolve_train_config("tiny", "", {"train.steps=10", "schedule.kind=wsd"});
  EXPECT_EQ(w.schedule.warmup_steps, 8);
}

TEST(TrainConfigWarmup, AnExplicitWarmupIsKeptAndTheErrorSaysWhichOverrideFixesIt) {
  EXPECT_EQ(resolve_train_config("tiny", "", {"train.steps=50", "schedule.warmup_steps=30"}).schedule.warmup_steps, 30);
  const std::string err = error_of<std::exception>(
      [] { (void)resolve_train_config("tiny", "", {"train.steps=5", "schedule.warmup_steps=20"}); });
  EXPECT_CONTAINS(err, "schedule.warmup_steps");
  EXPECT_CONTAINS(err, "-o schedule.warmup_steps=");
}

// [diloco]: parsed from overrides and TOML, printed by to_json, read back by from_json; every
// bad value is refused naming its key.
TEST(TrainConfigDiloco, KeysRoundTripAndBadValuesNameTheKey) {
  const TrainConfig off = resolve_train_config("tiny", "", {});
  EXPECT_FALSE(off.diloco.on());
  EXPECT_EQ(off.diloco.outer_lr, 0.7);
  EXPECT_EQ(off.diloco.outer_momentum, 0.9);
  const TrainConfig c = resolve_train_config(
      "tiny", "", {"diloco.inner_steps=50", "diloco.outer_lr=0.5", "diloco.outer_momentum=0.8",
                   "diloco.bf16_pseudo_grads=true", "train.eval_every=100"});
  EXPECT_EQ(c.diloco.inner_steps, 50);
  EXPECT_EQ(c.diloco.outer_lr, 0.5);
  EXPECT_EQ(c.diloco.outer_momentum, 0.8);
  EXPECT_TRUE(c.diloco.bf16_pseudo_grads);
  const auto j = c.to_json();
  EXPECT_EQ(j["diloco"]["inner_steps"], 50);
  const TrainConfig back = TrainConfig::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.diloco.inner_steps, 50);
  EXPECT_TRUE(back.diloco.bf16_pseudo_grads);

  ght::test::TempDir dir("ght_train_config");
  const std::string path = dir / "run.toml";
  std::ofstream(path) << "[diloco]\ninner_steps = 4\nouter_lr = 1.0\n[train]\neval_every = 8\n";
  EXPECT_EQ(resolve_train_config("tiny", path, {}).diloco.inner_steps, 4);

  EXPECT_CONTAINS(override_error("diloco.inner_steps=-1"), "diloco.inner_steps");
  EXPECT_CONTAINS(override_error("diloco.outer_lr=0"), "diloco.outer_lr must be in (0, 10]");
  EXPECT_CONTAINS(override_error("diloco.outer_lr=nan"), "diloco.outer_lr");
  EXPECT_CONTAINS(override_error("diloco.outer_momentum=1"), "diloco.outer_momentum must be in [0, 1)");
  EXPECT_CONTAINS(override_error("diloco.bf16_pseudo_grads=2"), "diloco.bf16_pseudo_grads");
  EXPECT_CONTAINS(override_error("diloco.windows=3"), "unknown key 'diloco.windows'");
  // An eval inside a window would mix the workers' models.
  const std::string msg = error_of<std::exception>(
      [&] { (void)resolve_train_config("tiny", "", {"diloco.inner_steps=3", "train.eval_every=100"}); });
  EXPECT_CONTAINS(msg, "train.eval_every (100) must be a multiple of diloco.inner_steps (3)");
}

TEST(TrainConfigFiles, ADirectorySaysSo) {
  ght::test::TempDir dir("ght_train_config_dir");
  const std::string msg = error_of<std::exception>([&] { (void)resolve_train_config("tiny", dir.str(), {}); });
  EXPECT_CONTAINS(msg, dir.str());
  EXPECT_CONTAINS(msg, "is a directory");
  EXPECT_CONTAINS(error_of<std::exception>([&] { (void)load_model_config(dir.str()); }), "is a directory");
}

TEST(ModelConfigErrors, NameTheOffendingKeyWithoutSourceLocation) {
  struct Case {
    std::string item, key;
  };
  for (const auto& c : std::vector<Case>{{"model.aux_loss_coef=-1", "aux_loss_coef"},
                                          {"model.z_loss_coef=-0.5", "z_loss_coef"},
                                          {"model.rms_eps=0", "rms_eps"},
                                          {"model.rope_theta=-1", "rope_theta"},
                                          {"model.kv_heads=3", "kv_heads"},
                                          {"model.top_k=9", "top_k"}}) {
    SCOPED_TRACE(c.item);
    const std::string msg = override_error(c.item);
    EXPECT_CONTAINS(msg, c.key);
    EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << msg;
  }
}

TEST(ModelConfigToml, RangesAndFiniteness) {
  ght::test::TempDir dir("ght_model_toml");
  const std::string a = dir / "a.toml", b = dir / "b.toml";
  std::ofstream(a) << "preset = \"tiny\"\nd_model = 4294967392\n";
  std::ofstream(b) << "preset = \"tiny\"\nrope_theta = inf\n";
  const std::string ma = error_of<std::exception>([&] { (void)load_model_config(a); });
  EXPECT_CONTAINS(ma, "d_model");
  EXPECT_CONTAINS(ma, "[1, 65536]");
  const std::string mb = error_of<std::exception>([&] { (void)load_model_config(b); });
  EXPECT_CONTAINS(mb, "rope_theta");
  EXPECT_CONTAINS(mb, "finite");
}

TEST(Presets, BenchH200IsTheModelOfConfigsBenchH200Toml) {
  const fs::path toml = project_root() / "configs" / "bench-h200.toml";
  ASSERT_TRUE(fs::exists(toml)) << toml;
  const TrainConfig c = resolve_train_config("tiny", toml.string(), {});
  const ModelConfig p = preset("bench-h200");
  EXPECT_EQ(c.model.name, "bench-h200");
  EXPECT_EQ(c.model.layers, p.layers);
  EXPECT_EQ(c.model.experts, p.experts);
  EXPECT_EQ(c.model.total_params(), p.total_params());
  EXPECT_EQ(preset("bench-h200-14l").layers, 14);
}

// The plan may choose the micro-batch only where the preset alone set it (plan_decide.hpp).
TEST(MicroBatch, AFileOrAnOverridePinsItAndThePresetDoesNot) {
  EXPECT_FALSE(resolve_train_config("bench-h200", "", {}).model.micro_batch_pinned);
  EXPECT_FALSE(resolve_train_config("bench-h200", "", {"model.grad_accum=16"}).model.micro_batch_pinned);
  const TrainConfig o = resolve_train_config("bench-h200", "", {"model.micro_batch=2"});
  EXPECT_TRUE(o.model.micro_batch_pinned);
  EXPECT_EQ(o.model.micro_batch, 2);
  ght::test::TempDir dir("ght_micro_batch_pin");
  const std::string run = dir / "run.toml", model = dir / "model.toml";
  std::ofstream(run) << "[model]\npreset = \"bench-h200\"\nmicro_batch = 1\n";
  std::ofstream(model) << "preset = \"bench-h200\"\nmicro_batch = 1\n";
  EXPECT_TRUE(resolve_train_config("tiny", run, {}).model.micro_batch_pinned);
  EXPECT_TRUE(load_model_config(model).micro_batch_pinned);
  // A preset named after an explicit micro_batch starts over from the preset.
  EXPECT_FALSE(resolve_train_config("tiny", "", {"model.micro_batch=2", "model.preset=small"}).model.micro_batch_pinned);
  // The configuration's JSON (config.json, checkpoints) does not carry it.
  EXPECT_FALSE(o.to_json()["model"].contains("micro_batch_pinned"));
}

TEST(FirstDifference, NamesTheDottedKeyPath) {
  const TrainConfig c = resolve_train_config("tiny", "", {});
  const nlohmann::json a = c.to_json();
  EXPECT_EQ(first_difference(a, a), "");
  nlohmann::json b = a;
  b["schedule"]["lr"] = 1e-3;
  EXPECT_EQ(first_difference(a, b), "schedule.lr");
  EXPECT_EQ(describe_difference(a, b), "schedule.lr: checkpoint has 0.002, this run has 0.001");
  b = a;
  b["train"]["steps"] = 5;
  b["model"]["layers"] = 3;
  EXPECT_EQ(first_difference(a, b), "model.layers");  // first in a's order
  b = a;
  b["train"].erase("keep");
  EXPECT_EQ(first_difference(a, b), "train.keep");
  b = a;
  b["extra"] = {{"x", 1}};
  EXPECT_EQ(first_difference(a, b), "extra");
  // 1 and 1.0 are the same setting.
  EXPECT_EQ(first_difference(nlohmann::json{{"o", {{"v", 1}}}}, nlohmann::json{{"o", {{"v", 1.0}}}}), "");
  EXPECT_EQ(first_difference(nlohmann::json{{"a", {1, 2}}}, nlohmann::json{{"a", {1, 3}}}), "a[1]");
}

}  // namespace
}  // namespace ght::trainer
