#pragma once
// Helpers for tests that run the training loop: a random token corpus, a small run config, and a
// run's losses read back from log.jsonl (temporary directories: common/temp_dir.hpp).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "trainer/data.hpp"
#include "trainer/model_config.hpp"
#include "trainer/train_config.hpp"

namespace ght::trainer::test {

// step -> loss and step -> eval loss of a run's log.jsonl.
struct RunLog {
  std::map<std::int64_t, double> loss, eval;
};
inline RunLog read_log(const std::string& run_dir) {
  RunLog r;
  std::ifstream in(run_dir + "/log.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "step") r.loss[j.at("step").get<std::int64_t>()] = j.at("loss").get<double>();
    if (j.at("type") == "eval") r.eval[j.at("step").get<std::int64_t>()] = j.at("eval_loss").get<double>();
  }
  return r;
}

inline TrainConfig small_run_config(const std::string& data, const std::string& out) {
  TrainConfig c;
  c.model = preset("tiny");
  c.model.seq_len = 64;
  c.model.micro_batch = 4;
  c.model.grad_accum = 2;  // exercises accumulation and the per-unit gradient zeroing
  c.model.micro_batch_pinned = true;  // the plan keeps these 2 micro-batches (plan_decide.hpp)
  c.data = data;
  c.out = out;
  c.steps = 6;
  c.eval_every = 3;
  c.eval_batches = 2;
  c.log_every = 1;
  c.schedule.lr = 2e-3;
  c.schedule.min_lr = 2e-4;
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = c.steps;
  return c;
}

/// A 6-step CPU run of `tiny` with 2 micro-batches of 2×32 tokens, no eval: the loop tests' run.
inline TrainConfig tiny_cpu_run_config(const std::string& data, const std::string& out) {
  TrainConfig c;
  c.model = preset("tiny");
  c.model.seq_len = 32;
  c.model.micro_batch = 2;
  c.model.grad_accum = 2;
  c.model.micro_batch_pinned = true;  // on the cuda backend too: the schedules under test are per micro-batch
  c.data = data;
  c.out = out;
  c.steps = 6;
  c.eval_every = 0;
  c.eval_batches = 2;
  c.backend = "cpu";
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = c.steps;
  return c;
}

/// One train and one val shard of byte tokens with a skewed distribution, so that a few steps
/// visibly lower the loss. A non-zero `bad_val_token` is planted in the val shard.
inline void write_random_corpus(const std::string& dir, std::size_t train_tokens = 200000,
                                std::size_t val_tokens = 20000, std::uint32_t bad_val_token = 0) {
  std::filesystem::create_directories(dir);
  std::mt19937 gen(5);
  std::geometric_distribution<int> tok(0.05);
  auto make = [&](std::size_t n) {
    std::vector<std::uint32_t> v(n);
    for (auto& x : v) x = static_cast<std::uint32_t>(std::min(tok(gen), 255));
    return v;
  };
  write_shard(dir + "/train_000000.bin", make(train_tokens), TokenDtype::u16);
  auto val = make(val_tokens);
  if (bad_val_token != 0) val[val.size() / 2] = bad_val_token;
  write_shard(dir + "/val_000000.bin", val, TokenDtype::u16);
}

}  // namespace ght::trainer::test
