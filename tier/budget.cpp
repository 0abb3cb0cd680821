#include "tier/budget.hpp"
#include "tier/log.hpp"

#include <iostream>
#include <mutex>
#include <set>
#include <utility>

#include "tier/config.hpp"
#include "tier/topology.hpp"

namespace ght::tier {

namespace {

/// ght::log::warn (stderr), once per process per distinct message: the plan and the allocator
/// resolve the same budgets, sometimes more than once (auto re-plans), and one warning is enough.
void warn_once(const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  const std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(msg).second) log::warn(msg);
}

}  // namespace

Capacities machine_capacities() {
  const Topology& t = topology();
  Capacities c;
  c.origin = "this machine";
  c.hbm_total = t.capacity(TierKind::hbm);
  c.hbm_free = t.available(TierKind::hbm);
  c.host_total = t.capacity(TierKind::host);
  c.host_available = t.available(TierKind::host);
  return c;
}

std::optional<Capacities> nominal_capacities(std::string_view profile) {
  constexpr std::uint64_t MiB = 1ULL << 20, GiB = 1ULL << 30;
  if (profile == "gh200") {
    // GH200 96 GB HBM3: CUDA reports 97,871 MiB; 480 GB LPDDR5X on the Grace node.
    return Capacities{"gh200 nominal", 97871 * MiB, 97871 * MiB, 480'000'000'000ULL,
                      480'000'000'000ULL};
  }
  if (profile == "pcie5") {
    // The x86 + H200 machine of HARDWARE.md: 139.8 GiB HBM, 128 GiB host memory, one node.
    const auto hbm = static_cast<std::uint64_t>(139.8 * static_cast<double>(GiB));
    return Capacities{"pcie5 nominal (H200)", hbm, hbm, 128 * GiB, 128 * GiB};
  }
  return std::nullopt;
}

TierBudget resolve_budget(TierKind t, const Capacities& caps, const config::Registry& reg) {
  using config::Key;
  const bool hbm = t == TierKind::hbm;
  const Key budget_key = hbm ? Key::GHT_HBM_BUDGET : Key::GHT_HOST_BUDGET;
  const Key headroom_key = hbm ? Key::GHT_HBM_HEADROOM : Key::GHT_HOST_HEADROOM;
  const std::string_view budget_name = hbm ? "GHT_HBM_BUDGET" : "GHT_HOST_BUDGET";
  const std::string_view headroom_name = hbm ? "GHT_HBM_HEADROOM" : "GHT_HOST_HEADROOM";
  const std::string tier_name = hbm ? "HBM" : "host memory";
  const std::uint64_t capacity = hbm ? caps.hbm_total : caps.host_total;
  const std::uint64_t free_now = hbm ? caps.hbm_free : caps.host_available;
  auto origin_of = [&](Key k, std::string_view name) {
    return std::string(name) + "=" + reg.text(k) + " (" +
           std::string(config::to_string(reg.source(k))) + ")";
  };

  TierBudget b;
  if (!reg.is_empty(budget_key)) {
    const config::SizeValue v = reg.get_size(budget_key);
    b.bytes = v.resolve(capacity, budget_name);
    b.origin = origin_of(budget_key, budget_name);
    if (v.fraction) {
      b.origin +=
          " of " + config::format_bytes(capacity) + " " + tier_name + " (" + caps.origin + ")";
    }
    // Capacity 0 is a machine without the tier (or unknown): planning for another machine's
    // budget is legitimate there.
    if (capacity > 0 && b.bytes > capacity) {
      b.warning = b.origin + " is " + config::format_bytes(b.bytes) + " (" +
                  std::to_string(b.bytes) + " bytes), more than the " + tier_name +
                  " capacity of " + config::format_bytes(capacity) + " (" + caps.origin +
                  "); K/M/G/T are powers of 1024, KB/MB/GB/TB of 1000";
      warn_once(b.warning);
    }
  } else {
    const std::uint64_t head = reg.get_size(headroom_key).resolve(capacity, headroom_name);
    b.bytes = free_now > head ? free_now - head : 0;
    b.origin = (hbm ? "free HBM " : "available host memory ") + config::format_bytes(free_now) +
               " (" + caps.origin + ") minus " + origin_of(headroom_key, headroom_name);
  }
  return b;
}

Budgets resolve_budgets(const Capacities& caps, const config::Registry& reg) {
  TierBudget hbm = resolve_budget(TierKind::hbm, caps, reg);
  TierBudget host = resolve_budget(TierKind::host, caps, reg);
  return Budgets{hbm.bytes, host.bytes, std::move(hbm.origin), std::move(host.origin)};
}

}  // namespace ght::tier
