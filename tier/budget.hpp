#pragma once
/**
 * @file budget.hpp
 * @brief The one budget rule: how many bytes of each tier ghtier may use.
 *
 * For each tier (hbm, host):
 *   GHT_<TIER>_BUDGET set    a size, or NN% of the tier's capacity;
 *   GHT_<TIER>_BUDGET empty  what is free now minus GHT_<TIER>_HEADROOM (a size or NN%).
 * A configured budget larger than the tier's capacity is kept as given, and warned about on
 * stderr once per process: "96G" means 96 GiB, more than a GH200's 95.58 GiB of HBM
 * (tier/README.md lists the size units). The plan (plan.hpp), the default tiered allocator
 * (alloc/tiered.hpp) and `ght info` all resolve budgets here.
 */
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tier/types.hpp"

namespace ght::config {
class Registry;
}

namespace ght::tier {

/// Memory a plan may draw on, of this machine or of a profile's nominal machine.
struct Capacities {
  std::string origin;  ///< "this machine" or e.g. "gh200 nominal"
  std::uint64_t hbm_total = 0;
  std::uint64_t hbm_free = 0;
  std::uint64_t host_total = 0;
  std::uint64_t host_available = 0;
};

/// Capacities of this machine (topology: HBM of the selected GPU, host NUMA node).
[[nodiscard]] Capacities machine_capacities();
/// Nominal capacities of the machine behind a built-in profile: "gh200" (96 GB HBM3, 480 GB
/// LPDDR5X) and "pcie5" (H200 141 GB, 128 GiB host, as in HARDWARE.md); nullopt otherwise.
[[nodiscard]] std::optional<Capacities> nominal_capacities(std::string_view profile);

/// One tier's budget and where it came from.
struct TierBudget {
  std::uint64_t bytes = 0;
  /// e.g. "GHT_HBM_BUDGET=96G (flag)", or "free HBM 93.10 GiB (this machine) minus
  /// GHT_HBM_HEADROOM=2GiB (default)"
  std::string origin;
  /// Non-empty when a configured budget exceeds the tier's (known, non-zero) capacity.
  std::string warning;
};

/// The budgets a plan must respect, with where each came from (used in error messages).
struct Budgets {
  std::uint64_t hbm = 0;
  std::uint64_t host = 0;
  std::string hbm_origin;   ///< e.g. "GHT_HBM_BUDGET=96G (flag)"
  std::string host_origin;
  bool operator==(const Budgets&) const = default;
};

/**
 * @brief The budget of tier `t` under the rule above; prints its warning, if any, to stderr
 * (each distinct warning once per process).
 * @throws ght::config_error for a percentage of an unknown (0) capacity
 */
[[nodiscard]] TierBudget resolve_budget(TierKind t, const Capacities& caps,
                                        const config::Registry& reg);

/// Both tiers' budgets (resolve_budget for hbm and host).
/// @throws ght::config_error for a percentage of an unknown (0) capacity.
[[nodiscard]] Budgets resolve_budgets(const Capacities& caps, const config::Registry& reg);

}  // namespace ght::tier
