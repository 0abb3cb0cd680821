// ght train: train the MoE model (see trainer/train.hpp and trainer/train_config.hpp).
#include <cmath>
#include <iostream>
#include <optional>
#include <toml.hpp>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/train.hpp"

namespace {

struct TrainArgs {
  std::string preset = "tiny";
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool overwrite = false;
  std::optional<std::int64_t> stop_at;
  std::int64_t profile_steps = 0;
  bool trace_kernels = false;
  // Shorthands for the most used overrides.
  std::string data, out, backend;
  std::optional<std::int64_t> steps;
  std::optional<double> lr;
  bool print_config = false;
  bool verbose = false;
};

// An integer flag's range, checked before anything runs; CLI11 prefixes the flag's name.
CLI::Validator int_at_least(std::int64_t lo, const char* what) {
  return CLI::Validator(
      [lo, what](const std::string& v) -> std::string {
        std::int64_t x = 0;
        std::size_t used = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == v.size() && !v.empty() && x >= lo) return {};
        return std::string("must be ") + what + ", an integer >= " + std::to_string(lo) + " (got " + v + ")";
      },
      "INT>=" + std::to_string(lo));
}

constexpr const char* kFooter =
    "Each step line shows: loss = training cross-entropy (nats/token; ln 256 = 5.55 is uniform over "
    "bytes), aux = the router's load-balance loss (unweighted; about 1.0 when experts are used "
    "evenly, larger when a few take most tokens), gnorm = global gradient norm before clipping, "
    "lr, tok/s, and on the GPU mfu and link GB. Records also go to <out>/log.jsonl.";

void setup(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* c = app.add_subcommand("train", "Train the MoE model (on the GPU when there is one, else the CPU backend)");
  c->footer(kFooter);
  auto* model = c->add_option("--model", args->preset,
                               "Model preset: tiny, small, bench-h200, bench-h200-14l, seed-21b; with --config it "
                               "replaces the file's [model] table (-o model.KEY=VALUE still refines it)")
                    ->capture_default_str();
  c->add_option("--config", args->config, "TOML run configuration ([model], [train], [optimizer], [schedule])");
  c->add_option("-o,--override", args->overrides, "Override a key: section.key=value (e.g. train.steps=500)");
  c->add_option("--data", args->data, "Shard directory or pattern (train.data); required unless the config sets it");
  c->add_option("--out", args->out, "Run directory for checkpoints and log.jsonl (train.out)");
  c->add_option("--steps", args->steps, "Optimizer steps (train.steps)")->check(int_at_least(1, "a step count"));
  c->add_option("--lr", args->lr, "Peak learning rate (schedule.lr)")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            double x = 0;
            std::size_t used = 0;
            try {
              x = std::stod(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used == v.size() && !v.empty() && x > 0 && std::isfinite(x)) return {};
            return "must be a learning rate > 0 (got " + v + ")";
          },
          "LR>0"));
  c->add_option("--backend", args->backend, "auto | cpu | cuda (train.backend)");
  auto* resume = c->add_option("--resume", args->resume,
                "auto (newest good checkpoint in the run directory), a run directory (its newest good "
                "checkpoint) or a checkpoint directory");
  c->add_flag("--overwrite", args->overwrite,
              "Start over in a run directory that holds a previous run: delete its checkpoints and log first")
      ->excludes(resume);
  c->add_option("--stop-at", args->stop_at, "Stop after this step with a checkpoint; the schedule still spans --steps")
      ->check(int_at_least(1, "a step number"));
  c->add_option("--profile-steps", args->profile_steps,
                "cuda backend: write the forward/backward/exposed-optimizer/link breakdown of the first N "
                "steps to <out>/profile.json (0: off)")
      ->check(int_at_least(0, "a step count, 0 or more"));
  c->add_flag("--trace-kernels", args->trace_kernels,
              "cuda backend: trace the last profiled step's kernels (CUPTI) and write the per-op GPU time, "
              "TFLOP/s and GB/s to <out>/kernel_breakdown.{md,json}; needs --profile-steps N");
  c->add_flag("--print-config", args->print_config, "Print the resolved configuration as JSON and exit");
  c->add_flag("-v,--verbose", args->verbose, "Also print the resolved configuration before training");
  c->callback([args, model] {
    std::vector<std::string> ov;
    // An explicit --model wins over the file's [model] table, as every flag wins over the file.
    if (model->count() > 0 && !args->config.empty()) ov.push_back("model.preset=\"" + args->preset + "\"");
    ov.insert(ov.end(), args->overrides.begin(), args->overrides.end());
    if (!args->data.empty()) ov.push_back("train.data=\"" + args->data + "\"");
    if (!args->out.empty()) ov.push_back("train.out=\"" + args->out + "\"");
    if (!args->backend.empty()) ov.push_back("train.backend=\"" + args->backend + "\"");
    if (args->steps) ov.push_back("train.steps=" + std::to_string(*args->steps));
    if (args->lr) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "schedule.lr=%.17g", *args->lr);
      ov.push_back(buf);
    }
    if (args->trace_kernels && args->profile_steps < 1) {
      throw ght::logic_error("--trace-kernels traces the last of the --profile-steps N steps: add --profile-steps N "
                             "(N >= 1)");
    }
    const auto cfg = ght::trainer::resolve_train_config(args->preset, args->config, ov);
    if (args->print_config) {
      std::cout << cfg.to_json().dump(2) << "\n";
      return;
    }
    // The built-in default names no real dataset: training on it by accident must not happen.
    bool data_given = !args->data.empty();
    for (const auto& o : ov) data_given = data_given || o.rfind("train.data", 0) == 0;
    if (!data_given && !args->config.empty()) {
      const toml::value file = toml::parse(args->config);  // resolve_train_config read it already
      data_given = file.contains("train") && file.at("train").is_table() && file.at("train").contains("data");
    }
    if (!data_given) {
      throw ght::logic_error("ght train needs --data <shard directory or pattern> (or train.data in --config / -o); "
                             "make shards with `ght prep`");
    }
    if (args->verbose) std::cout << "resolved configuration:\n" << cfg.to_json().dump(2) << "\n";
    ght::trainer::TrainRunOptions run;
    run.resume = args->resume;
    run.overwrite = args->overwrite;
    run.stop_at = args->stop_at;
    run.profile_steps = args->profile_steps;
    run.trace_kernels = args->trace_kernels;
    const auto s = ght::trainer::train(cfg, run);
    if (s.rank != 0) return;  // rank 0 reports for a run of several processes
    if (s.last_step == s.first_step) {
      std::cout << "done: nothing to do, the run is already at step " << s.last_step << " of " << cfg.steps << "\n";
      return;
    }
    std::cout << "done: steps " << s.first_step << " -> " << s.last_step << ", last loss " << s.last_loss;
    if (s.eval_loss) std::cout << ", eval loss " << *s.eval_loss << " nats/token";
    std::cout << (s.stopped_by_signal ? " (stopped by signal)" : "") << "\n";
  });
}

}  // namespace

GHT_REGISTER_COMMAND(train, setup);
