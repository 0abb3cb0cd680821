// `ght info`: what the machine is (topology), what each tier holds and may use (budgets), what a
// byte costs to move (link numbers and their source), and the effective configuration.
// `--probe` measures the link first and sets each figure beside the built-in profile of the same
// kind.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "tier/budget.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/topology.hpp"
#include "trainer/cli/command.hpp"

namespace {

using ght::LinkKind;
using ght::TierKind;
using ojson = nlohmann::ordered_json;

struct InfoArgs {
  bool probe = false;
  bool json = false;
};

struct TierRow {
  TierKind tier;
  std::uint64_t capacity = 0;
  std::uint64_t available = 0;
  std::optional<std::uint64_t> budget;  ///< empty when the tier does not exist (no GPU)
  std::string budget_rule;              ///< how the budget was derived
  std::string warning;                  ///< e.g. a budget above the tier's capacity
};

/// The tier's row; its budget follows the one rule of tier/budget.hpp.
TierRow tier_row(const ght::tier::Topology& topo, TierKind t) {
  TierRow r{t, topo.capacity(t), topo.available(t), std::nullopt, "", ""};
  if (r.capacity == 0) {
    r.budget_rule = "no such tier on this machine";
    return r;
  }
  ght::tier::TierBudget b =
      ght::tier::resolve_budget(t, ght::tier::machine_capacities(), ght::config::cfg());
  r.budget = b.bytes;
  r.budget_rule = std::move(b.origin);
  r.warning = std::move(b.warning);
  return r;
}

struct Figure {
  const char* key;
  double ght::tier::LinkNumbers::*member;
  const char* label;
};
constexpr Figure kFigures[] = {
    {"h2d_bps", &ght::tier::LinkNumbers::h2d_bps, "memcpy H2D (pinned)"},
    {"d2h_bps", &ght::tier::LinkNumbers::d2h_bps, "memcpy D2H (pinned)"},
    {"bidir_bps", &ght::tier::LinkNumbers::bidir_bps, "memcpy both ways (sum)"},
    {"kernel_read_bps", &ght::tier::LinkNumbers::kernel_read_bps, "GPU kernel reads host"},
    {"kernel_write_bps", &ght::tier::LinkNumbers::kernel_write_bps, "GPU kernel writes host"},
    {"host_triad_bps", &ght::tier::LinkNumbers::host_triad_bps, "host memory triad"},
    {"hbm_bps", &ght::tier::LinkNumbers::hbm_bps, "GPU kernel reads HBM"},
};

double ratio(double measured, double reference) {
  return reference > 0 ? measured / reference : 0.0;
}

std::string gbps(double bps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB/s", bps / 1e9);
  return buf;
}

std::string probe_text(const ght::tier::LinkNumbers& m, const ght::tier::LinkNumbers& ref,
                       const std::string& cache) {
  std::ostringstream o;
  o << "probe         measured now, cached in " << cache << "\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-26s %14s %14s %8s\n", "", "measured",
                ("builtin " + ref.name).c_str(), "ratio");
  o << line;
  for (const Figure& f : kFigures) {
    const double a = m.*f.member;
    const double b = ref.*f.member;
    char r[16];
    std::snprintf(r, sizeof r, "%.2f", ratio(a, b));
    std::snprintf(line, sizeof line, "  %-26s %14s %14s %8s\n", f.label, gbps(a).c_str(),
                  b > 0 ? gbps(b).c_str() : "-", b > 0 ? r : "-");
    o << line;
  }
  return o.str();
}

void run_info(const InfoArgs& args) {
  namespace tier = ght::tier;
  std::optional<tier::LinkNumbers> probed;
  std::string cache_path;
  if (args.probe) {
    probed = tier::probe_and_cache();
    cache_path = tier::probe_cache_path();
  }
  const tier::Topology& topo = tier::topology(/*refresh=*/args.probe);  // free memory after probe
  const tier::LinkNumbers link = tier::resolve_link_numbers();
  const TierRow rows[] = {tier_row(topo, TierKind::hbm), tier_row(topo, TierKind::host)};
  auto& c = ght::config::cfg();

  if (args.json) {
    ojson j;
    j["topology"] = ojson::parse(topo.format_json());
    j["tiers"] = ojson::array();
    for (const TierRow& r : rows) {
      ojson t;
      t["tier"] = std::string(ght::to_string(r.tier));
      t["capacity_bytes"] = r.capacity;
      t["available_bytes"] = r.available;
      t["budget_bytes"] = r.budget ? ojson(*r.budget) : ojson(nullptr);
      t["budget_rule"] = r.budget_rule;
      if (!r.warning.empty()) t["warning"] = r.warning;
      if (r.tier == TierKind::host) t["numa_node"] = topo.host_numa_node;
      j["tiers"].push_back(t);
    }
    j["link"] = ojson::parse(link.to_json());
    if (probed) {
      const tier::LinkNumbers ref = tier::builtin_profile_for(probed->kind);
      ojson p = ojson::parse(probed->to_json());
      p["cache"] = cache_path;
      p["reference_profile"] = ref.name;
      ojson ratios;
      for (const Figure& f : kFigures) {
        ratios[f.key] = (ref.*f.member > 0) ? ojson(ratio(probed.value().*f.member, ref.*f.member))
                                            : ojson(nullptr);
      }
      p["ratio_to_reference"] = ratios;
      j["probe"] = p;
    } else {
      j["probe"] = nullptr;
    }
    j["config"] = ojson::parse(c.format_json());
    const std::string out = j.dump(2) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
  }

  std::ostringstream o;
  o << "== machine ==\n" << topo.format_text() << "\n== tiers ==\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-14s %12s %12s %12s  %s\n", "tier", "capacity",
                "available", "budget", "budget rule");
  o << line;
  for (const TierRow& r : rows) {
    const std::string name =
        r.tier == TierKind::host ? "host (node " + std::to_string(topo.host_numa_node) + ")"
                                 : std::string(ght::to_string(r.tier));
    std::snprintf(line, sizeof line, "  %-14s %12s %12s %12s  %s\n", name.c_str(),
                  ght::config::format_bytes(r.capacity).c_str(),
                  ght::config::format_bytes(r.available).c_str(),
                  r.budget ? ght::config::format_bytes(*r.budget).c_str() : "-",
                  r.budget_rule.c_str());
    o << line;
    if (!r.warning.empty()) o << "  warning: " << r.warning << "\n";
  }
  o << "\n== link ==\n" << "link kind     " << ght::to_string(topo.link) << "\n"
    << link.format_text();
  if (probed) {
    o << "\n" << probe_text(*probed, tier::builtin_profile_for(probed->kind), cache_path);
  }
  o << "\n== configuration ==\n" << c.format_table();
  const std::string out = o.str();
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void setup(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  auto* c = app.add_subcommand(
      "info", "Show the machine: topology, tiers and budgets, link numbers, configuration");
  c->add_flag("--probe", args->probe,
              "Measure the link first (GHT_PROBE_SECONDS), cache it, and compare with the built-in "
              "profile of the same kind");
  c->add_flag("--json", args->json, "Print one JSON object with everything");
  c->callback([args] { run_info(*args); });
}

}  // namespace

GHT_REGISTER_COMMAND(info, setup);
