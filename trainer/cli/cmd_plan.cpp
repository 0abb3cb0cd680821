// `ght plan`: where each region of a model's tensors should live (HBM or host), in which mode,
// what that predicts per step, and why. --json emits the plan the allocator and trainer consume;
// --from-json prints a saved plan again (and re-emits it byte for byte with --json).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <toml.hpp>
#include <vector>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/plan.hpp"
#include "tier/regions_json.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/model_config.hpp"
#include "trainer/model_config_toml.hpp"
#include "trainer/plan_decide.hpp"
#include "trainer/regions.hpp"
#include "trainer/train_config.hpp"

namespace {

struct PlanArgs {
  std::string model, config, profile, hbm, host, policy, place, regions, measurements, from_json, out;
  std::vector<std::string> overrides;
  bool json = false;
  bool search_json = false;
  bool explain = false;
  int ranks = 1;
  std::int64_t tokens_per_step = 0;  ///< 0: the model's own grad_accum
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ght::io_error(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !(out << text) || !out.flush()) throw ght::io_error(path + ": cannot write the plan");
}

bool is_preset(const std::string& name) {
  for (const auto& n : ght::trainer::preset_names()) {
    if (n == name) return true;
  }
  return false;
}

// A run configuration (`ght train --config`) has [train], [optimizer] or [schedule] tables beside
// [model]; a model file (model_config_toml.hpp) has only model keys.
bool is_run_config(const std::string& path) {
  toml::value doc;
  try {
    doc = toml::parse(path);
  } catch (const std::exception&) {
    return false;  // load_model_config reports the parse error with the file name
  }
  if (!doc.is_table()) return false;
  for (const char* section : {"train", "optimizer", "schedule"}) {
    if (doc.as_table().contains(section)) return true;
  }
  return false;
}

// --tokens-per-step N: the gradient-accumulation steps that make N tokens a step, exactly.
ght::trainer::ModelConfig with_tokens_per_step(ght::trainer::ModelConfig cfg, std::int64_t tokens) {
  if (tokens == 0) return cfg;
  const std::int64_t per = static_cast<std::int64_t>(cfg.seq_len) * cfg.micro_batch;
  if (tokens < per || tokens % per != 0) {
    throw ght::config_error("--tokens-per-step " + std::to_string(tokens) + " is not a multiple of seq_len x " +
                            "micro_batch = " + std::to_string(cfg.seq_len) + " x " + std::to_string(cfg.micro_batch) +
                            " = " + std::to_string(per) + " tokens (the model's micro-batch)");
  }
  cfg.grad_accum = static_cast<int>(tokens / per);
  cfg.validate();
  return cfg;
}

// --model PRESET|FILE, --config FILE and -o overrides, read the way `ght train` reads them.
ght::trainer::ModelConfig model_config(const PlanArgs& a) {
  std::string preset_name;
  std::string run_config = a.config;
  if (!a.model.empty()) {
    if (is_preset(a.model)) {
      preset_name = a.model;
    } else if (std::error_code ec; std::filesystem::is_directory(a.model, ec)) {
      throw ght::io_error("--model " + a.model + ": is a directory, expected a preset or a TOML file");
    } else if (std::filesystem::exists(a.model)) {
      if (!run_config.empty()) {
        throw ght::config_error("--model " + a.model + " is a file; with --config, --model must be a preset");
      }
      if (!is_run_config(a.model)) {
        if (!a.overrides.empty()) {
          throw ght::config_error("-o applies to presets and run configurations; " + a.model +
                                  " is a model file: edit its keys instead");
        }
        return ght::trainer::load_model_config(a.model);
      }
      run_config = a.model;
    } else {
      std::string names;
      for (const auto& n : ght::trainer::preset_names()) names += (names.empty() ? "" : ", ") + n;
      throw ght::config_error("--model '" + a.model + "' is neither a preset (" + names +
                              ") nor an existing TOML file");
    }
  }
  return ght::trainer::resolve_train_config(preset_name, run_config, a.overrides).model;
}

void emit(const ght::tier::Plan& plan, const PlanArgs& a, const std::string& header) {
  const std::string json = (a.json || !a.out.empty()) ? plan.to_json() : std::string();
  if (!a.out.empty()) write_text(a.out, json);
  if (a.json) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::fputs(header.c_str(), stdout);
    std::fputs(plan.format_table(a.explain).c_str(), stdout);
    if (!a.out.empty()) std::printf("plan written to %s\n", a.out.c_str());
  }
}

// --profile must name a built-in profile or a file: "h200" would otherwise be read as a path.
void check_profile(const std::string& p) {
  if (p.empty() || p == "gh200" || p == "pcie5" || p == "measured" || p == "none") return;
  if (std::error_code ec; std::filesystem::is_regular_file(p, ec)) return;
  throw ght::config_error("--profile " + p +
                          ": neither a built-in profile (gh200: Grace Hopper over NVLink-C2C; pcie5: an H100/H200 "
                          "over PCIe 5, such as an H200 in an x86 server; measured; none) nor a JSON file");
}

void run(const PlanArgs& a) {
  using ght::cli::set_config_flag;
  if (!a.from_json.empty()) {
    if (!a.model.empty() || !a.config.empty() || !a.regions.empty()) {
      throw ght::config_error(
          "--from-json prints a saved plan; it cannot be combined with --model, --config or --regions");
    }
    emit(ght::tier::Plan::from_json(read_text(a.from_json), a.from_json), a,
         "saved plan " + a.from_json + "\n");
    return;
  }
  if (a.model.empty() && a.config.empty() && a.regions.empty()) {
    throw ght::config_error(
        "ght plan needs --model PRESET|file.toml, --config run.toml or --regions file.json (or --from-json)");
  }
  // Flags are config values with source "flag": budgets and errors name them as such.
  check_profile(a.profile);
  if (!a.profile.empty()) set_config_flag("GHT_LINK_PROFILE", a.profile);
  if (!a.hbm.empty()) set_config_flag("GHT_HBM_BUDGET", a.hbm);
  if (!a.host.empty()) set_config_flag("GHT_HOST_BUDGET", a.host);
  if (!a.policy.empty()) set_config_flag("GHT_POLICY", a.policy);
  // Measurements are the auto policy's input: given without a policy, they ask for it.
  if (!a.measurements.empty() && a.policy.empty()) set_config_flag("GHT_POLICY", "auto");
  if (!a.place.empty()) set_config_flag("GHT_PLACE", a.place);
  auto& reg = ght::config::cfg();

  std::string header;
  std::vector<ght::tier::Region> regions;
  double step_flops = 0, head_flops = 0;  // the layers' FLOPs per step, the LM head's
  std::optional<ght::trainer::ModelConfig> trainer_cfg;
  if (a.tokens_per_step > 0 && a.model.empty() && a.config.empty()) {
    throw ght::config_error("--tokens-per-step needs a model: add --model PRESET|FILE or --config FILE");
  }
  if (!a.model.empty() || !a.config.empty()) {
    const auto cfg = with_tokens_per_step(model_config(a), a.tokens_per_step);
    step_flops = ght::trainer::model_step_flops(cfg);
    head_flops = ght::trainer::model_head_flops(cfg);
    auto count = [](std::int64_t n) {
      char b[32];
      const double x = static_cast<double>(n);
      if (x >= 1e9) {
        std::snprintf(b, sizeof b, "%.2fB", x / 1e9);
      } else {
        std::snprintf(b, sizeof b, "%.2fM", x / 1e6);
      }
      return std::string(b);
    };
    char line[256];
    std::snprintf(line, sizeof line,
                  "model: %s: %s params (%s active), %d layers x %d experts (top-%d), "
                  "%lld tokens per step (seq %d x micro-batch %d x grad_accum %d)\n",
                  cfg.name.c_str(), count(cfg.total_params()).c_str(),
                  count(cfg.active_params()).c_str(), cfg.layers, cfg.experts, cfg.top_k,
                  static_cast<long long>(cfg.tokens_per_step()), cfg.seq_len, cfg.micro_batch,
                  cfg.grad_accum);
    header = line;
    if (a.ranks > 1) {
      header += "ranks: " + std::to_string(a.ranks) +
                " data-parallel ranks with sharded optimizer state (ZeRO-1): the plan of one rank, whose master, "
                "m and v are 1/" + std::to_string(a.ranks) +
                " of each group's; weights, gradients (in HBM) and activations whole\n";
    }
    if (a.regions.empty()) trainer_cfg = cfg;  // planned below as `ght train` plans it
  }
  if (!a.regions.empty()) {
    if (a.ranks > 1) throw ght::config_error("--ranks applies to a model (--model, --config), not to --regions");
    auto set = ght::tier::load_regions_file(a.regions);
    regions = std::move(set.regions);
    if (set.step_flops > 0) {  // the file's own step size wins; it counts no LM head
      step_flops = set.step_flops;
      head_flops = 0;
    }
    header += "regions: " + a.regions + "\n";
  }
  const ght::tier::LinkNumbers link = ght::tier::resolve_link_numbers();
  if (link.kind == ght::LinkKind::none && a.profile.empty() && !a.json && !a.search_json) {
    header += "note: no GPU here (link none), so this plans for the CPU; --profile gh200|pcie5 plans for a GPU machine\n";
  }
  // A built-in profile plans for that machine: its nominal memory, unless budgets are given.
  const auto nominal = ght::tier::nominal_capacities(reg.get_string(ght::config::Key::GHT_LINK_PROFILE));
  const ght::tier::Capacities caps = nominal ? *nominal : ght::tier::machine_capacities();
  auto options = ght::tier::plan_options_from_config(reg, link, caps, step_flops, head_flops);
  std::optional<ght::tier::Measurements> measured;
  if (!a.measurements.empty()) {
    measured = ght::tier::load_measurements_file(a.measurements);
  } else {
    measured = ght::tier::configured_measurements();  // GHT_PLAN_MEASUREMENTS
  }
  if (!trainer_cfg) {
    emit(ght::tier::make_plan(std::move(regions), options, measured ? &*measured : nullptr), a, header);
    return;
  }
  // As `ght train` plans: the search over precision and schedule, each candidate with the
  // trainer's fixed HBM costs and the LM-head chunk from free HBM (a note of the plan says which).
  // FP8 is searched where this machine runs it; a --profile plans for another machine, where the
  // user pins GHT_FP8 to see it.
  const ght::trainer::PlanScope scope =
      a.profile.empty() ? ght::trainer::local_plan_scope(*trainer_cfg, a.ranks, true)
                        : ght::trainer::PlanScope{a.ranks, true, false,
                                                  "--profile plans for another machine; set GHT_FP8=experts to plan "
                                                  "with them"};
  const ght::tier::Measurements* m = measured ? &*measured : nullptr;
  if (a.search_json) {
    const auto s = ght::trainer::search_model_plans(*trainer_cfg, options, scope, m);
    std::fputs(ght::tier::search_to_json(s, static_cast<double>(trainer_cfg->tokens_per_step()),
                                         ght::trainer::plan_peak_flops()).c_str(), stdout);
    return;
  }
  try {
    const auto d = ght::trainer::decide_plan(*trainer_cfg, options, scope, m);
    emit(d.model.plan, a, a.json ? header : header + d.table(*trainer_cfg));
  } catch (const ght::tier::plan_refused&) {
    const auto s = ght::trainer::search_model_plans(*trainer_cfg, options, scope, m);
    std::fputs((header + ght::tier::format_search(s, static_cast<double>(trainer_cfg->tokens_per_step()),
                                                  ght::trainer::plan_peak_flops())).c_str(), stdout);
    std::fflush(stdout);  // the table before the error that follows on stderr
    throw;
  }
}


void setup(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = app.add_subcommand(
      "plan", "Choose precision, schedule and placement for a model, predict the step, explain why");
  c->add_option("--model", a->model,
                "Model: a preset (tiny, small, bench-h200, bench-h200-14l, seed-21b), a model TOML file, "
                "or a run configuration (the files `ght train --config` reads)")
      ->type_name("PRESET|FILE");
  c->add_option("--config", a->config,
                "Run configuration, as for `ght train --config` (its [model] table is planned; --model "
                "then names the preset it starts from)")
      ->type_name("FILE");
  c->add_option("-o,--override", a->overrides, "Override a key as for `ght train`: model.layers=10")
      ->type_name("KEY=VALUE");
  c->add_option("--profile", a->profile,
                "Link numbers: gh200 | pcie5 | measured | none | file.json (sets GHT_LINK_PROFILE); "
                "a built-in profile plans for that machine's nominal memory")
      ->type_name("PROFILE");
  c->add_option("--hbm", a->hbm, "HBM budget, e.g. 96G or 80% (sets GHT_HBM_BUDGET)")->type_name("SIZE");
  c->add_option("--host", a->host, "Host-memory budget, e.g. 480G (sets GHT_HOST_BUDGET)")->type_name("SIZE");
  c->add_option("--policy", a->policy, "static | greedy | auto (sets GHT_POLICY)")->type_name("POLICY");
  c->add_option("--place", a->place, "Placement rules, e.g. master=host,grad=hbm (sets GHT_PLACE)")
      ->type_name("RULES");
  c->add_option("--regions", a->regions, "Plan the regions of this JSON file (tier/regions_json.hpp)")
      ->type_name("FILE");
  c->add_option("--measurements", a->measurements,
                "Plan on measurements (sets --policy auto unless given): a run directory's measurements.json, or "
                "JSON with step_tokens, expert_tokens, link_bytes, phases (overrides GHT_PLAN_MEASUREMENTS)")
      ->type_name("FILE");
  c->add_option("--from-json", a->from_json, "Print a plan saved with --json instead of planning")
      ->type_name("FILE");
  c->add_option("--out", a->out, "Also write the plan as JSON to FILE")->type_name("FILE");
  c->add_option("--ranks", a->ranks,
                "Plan one of N data-parallel ranks with sharded optimizer state (ZeRO-1, `mpirun -np N ght "
                "train`): master, m and v 1/N per rank")
      ->type_name("N")
      ->check(CLI::Range(1, 65536));
  c->add_option("--tokens-per-step", a->tokens_per_step,
                "Tokens per optimizer step: sets grad_accum to N / (seq_len x micro_batch), which must divide")
      ->type_name("N")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  c->add_flag("--json", a->json, "Print the plan as JSON (the format the allocator and trainer read)");
  c->add_flag("--search-json", a->search_json,
              "Print the search as JSON: every combination of the searched options, its fit, price and prediction");
  // A common first guess: say which flag it is rather than "arguments were not expected".
  c->add_option_function<std::string>(
       "--preset", [](const std::string& v) -> void {
         throw ght::config_error("ght plan has no --preset; a preset is given with --model, e.g. --model " + v);
       })
      ->group("");
  c->add_flag("--explain", a->explain, "Add one reason line per decision and the planner's notes");
  c->callback([a] { run(*a); });
}

}  // namespace

GHT_REGISTER_COMMAND(plan, setup);
