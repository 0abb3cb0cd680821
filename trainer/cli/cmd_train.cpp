// ght train: train the MoE model (see trainer/train.hpp and trainer/train_config.hpp).
#include <iostream>

#include "tier/config.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/train.hpp"

namespace {

struct TrainArgs {
  std::string preset = "tiny";
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  std::int64_t stop_at = -1;
  std::int64_t profile_steps = 0;
  // Shorthands for the most used overrides.
  std::string data, out, backend;
  std::int64_t steps = -1;
  double lr = -1;
  bool print_config = false;
};

void setup(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* c = app.add_subcommand("train", "Train the MoE model (on the GPU when there is one, else the CPU backend)");
  c->add_option("--model", args->preset, "Model preset: tiny, small, bench-h200, seed-21b")->capture_default_str();
  c->add_option("--config", args->config, "TOML run configuration ([model], [train], [optimizer], [schedule])");
  c->add_option("-o,--override", args->overrides, "Override a key: section.key=value (e.g. train.steps=500)");
  c->add_option("--data", args->data, "Shard directory or pattern (train.data)");
  c->add_option("--out", args->out, "Run directory for checkpoints and log.jsonl (train.out)");
  c->add_option("--steps", args->steps, "Optimizer steps (train.steps)");
  c->add_option("--lr", args->lr, "Peak learning rate (schedule.lr)");
  c->add_option("--backend", args->backend, "auto | cpu | cuda (train.backend)");
  c->add_option("--resume", args->resume, "auto (newest good checkpoint in the run directory) or a checkpoint directory");
  c->add_option("--stop-at", args->stop_at, "Stop after this step with a checkpoint; the schedule still spans --steps");
  c->add_option("--profile-steps", args->profile_steps,
                "cuda backend: write the forward/backward/exposed-optimizer/link breakdown of the first N "
                "steps to <out>/profile.json (0: off)")
      ->check(CLI::Validator(
          [](const std::string& v) {
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be a step count, 0 or more (got " + v + ")";
          },
          "N"));
  c->add_flag("--print-config", args->print_config, "Print the resolved configuration as JSON and exit");
  c->callback([args] {
    std::vector<std::string> ov = args->overrides;
    if (!args->data.empty()) ov.push_back("train.data=\"" + args->data + "\"");
    if (!args->out.empty()) ov.push_back("train.out=\"" + args->out + "\"");
    if (!args->backend.empty()) ov.push_back("train.backend=\"" + args->backend + "\"");
    if (args->steps >= 0) ov.push_back("train.steps=" + std::to_string(args->steps));
    if (args->lr >= 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "schedule.lr=%.17g", args->lr);
      ov.push_back(buf);
    }
    const auto cfg = ght::trainer::resolve_train_config(args->preset, args->config, ov);
    if (args->print_config) {
      std::cout << cfg.to_json().dump(2) << "\n";
      return;
    }
    std::cout << "resolved configuration:\n" << cfg.to_json().dump(2) << "\n";
    ght::trainer::TrainRunOptions run;
    run.resume = args->resume;
    if (args->stop_at >= 0) run.stop_at = args->stop_at;
    run.profile_steps = args->profile_steps;
    const auto s = ght::trainer::train(cfg, run);
    std::cout << "done: steps " << s.first_step << " -> " << s.last_step << ", last loss " << s.last_loss;
    if (s.eval_loss) std::cout << ", eval loss " << *s.eval_loss << " nats/token";
    std::cout << (s.stopped_by_signal ? " (stopped by signal)" : "") << "\n";
  });
}

}  // namespace

GHT_REGISTER_COMMAND(train, setup);
