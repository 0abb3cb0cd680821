#pragma once
/**
 * @file plan_search.hpp
 * @brief The plan's search: every choice that trades memory for time, made together
 * (DESIGN.md, "Search").
 *
 * A *dimension* is one GHT_* option the search may set (the m/v precision, the gradient
 * accumulation type, the delayed update, ...), with its values, each exact or not. An option the
 * user set pins its dimension to that value. The search enumerates every combination of the
 * unpinned values, asks the caller to plan each one (region placement with the full cost model:
 * make_plan), drops what cannot fit, prices the inexact choices with the accuracy ledger under the
 * user's tolerance, and ranks what is left by predicted step time. Combinations the tolerance
 * refuses are planned only when no admitted one fits (to list the nearest plans that do):
 *   - the chosen plan is the fastest admitted one, except that a dimension with
 *     prefer_first_within keeps its first value (the configured micro-batch) where the fastest
 *     admitted plan that keeps it is within that share; then, where an admitted plan with fewer
 *     inexact choices (and the same values of those dimensions) is within kPreferExactWithin of
 *     the choice, that one is chosen instead (an inexact choice must be faster, or needed to fit);
 *   - when no admitted plan fits, the search refuses (plan_refused), and the message lists the
 *     nearest plans that fit, each with the exact settings to use and its price.
 *
 * Tolerance (GHT_PLAN_TOLERANCE):
 *   exact   no inexact choice;
 *   noise   (default) an inexact choice only where its ledger verdict lies inside the exact run's
 *           own seed-to-seed noise; a choice without a verdict is outside;
 *   <x>     the relative eval-loss cost accepted, summed over the inexact choices taken (each
 *           needs a verdict), e.g. 0.01.
 */
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tier/accuracy_ledger.hpp"
#include "tier/error.hpp"
#include "tier/plan.hpp"

namespace ght::config {
class Registry;
}

namespace ght::tier {

/// An admitted plan with fewer inexact choices wins when it is at most this much slower.
inline constexpr double kPreferExactWithin = 0.01;

struct DimensionValue {
  std::string value;
  bool exact = true;
};

/// One GHT_* option the search may set.
struct Dimension {
  std::string option;                  ///< e.g. "GHT_OPT_STATE"
  std::string what;                    ///< table label, e.g. "m/v"
  std::vector<DimensionValue> values;  ///< the exact default first
  std::optional<std::string> pinned;   ///< the user's value: the only one searched
  /// > 0: an exact dimension whose first value is the configuration's own (the micro-batch). The
  /// chosen plan keeps that value unless leaving it is predicted faster by more than this share
  /// (the step model's measured error for this dimension).
  double prefer_first_within = 0;
};

/// A dimension's values as the registry pins them: `values` when the user left `option` unset
/// (or only the plan set it), else the user's value alone (with its exactness from `values`,
/// exact when not listed). `honour_pins` false searches every value (to list what would fit
/// without the user's settings).
[[nodiscard]] Dimension make_dimension(const config::Registry& reg, std::string option, std::string what,
                                       std::vector<DimensionValue> values, bool honour_pins = true);

/// One value per dimension, in the dimensions' order: (option, value).
using Settings = std::vector<std::pair<std::string, std::string>>;

struct Tolerance {
  enum class Kind { exact, noise, cost };
  Kind kind = Kind::noise;
  double cost = 0;  ///< Kind::cost: relative eval-loss cost accepted
  [[nodiscard]] std::string describe() const;  ///< "exact", "noise", "0.01"
};
/// Parse GHT_PLAN_TOLERANCE's text. @throws config_error naming the option and the value.
[[nodiscard]] Tolerance parse_tolerance(std::string_view text);

/// One inexact setting of a candidate and what the ledger says of it.
struct Price {
  std::string option, value, what;
  std::optional<Verdict> verdict;  ///< none: no ledger verdict
  [[nodiscard]] std::string describe() const;  ///< the verdict, or "<what>: no ledger verdict"
};

/// One combination of the dimensions' values, planned.
struct Candidate {
  Settings settings;
  std::optional<Plan> plan;     ///< set when it fits
  std::string infeasible;       ///< why it does not fit (no plan)
  std::uint64_t missing_bytes = 0;  ///< what it lacks of the tightest budget (no plan)
  bool planned = false;         ///< evaluated (see search_plans: refused ones only on a refusal)
  std::vector<Price> inexact;   ///< its inexact settings, priced
  bool admitted = false;        ///< within the tolerance
  std::string refused;          ///< why it is not admitted (tolerance)
  [[nodiscard]] double step_seconds() const;  ///< +inf without a plan
  /// What the search ranks by: step_seconds() without the update of state in HBM
  /// (Prediction::hbm_pass_seconds). Per byte, q8 or bf16 m/v would update faster in HBM than fp32;
  /// measured, they do not (bench-h200 on the H100: q8's update 79 ms for 5.85B parameters, fp32's
  /// about 70 ms scaled from seed-21b's layers), so the HBM update does not pick the precision.
  [[nodiscard]] double rank_seconds() const;
  /// "GHT_OPT_STATE=q8 GHT_GRAD_ACCUM=bf16 -o model.micro_batch=4": the settings that differ from
  /// the defaults (the first value of each dimension), GHT_* options as environment settings and
  /// the others as `ght` overrides, or "(defaults)".
  [[nodiscard]] std::string changes(const std::vector<Dimension>& dims) const;
};

struct SearchResult {
  std::vector<Dimension> dimensions;
  Tolerance tolerance;
  std::vector<Candidate> candidates;  ///< ranked: admitted first, then fitting, then the rest
  std::optional<std::size_t> chosen;  ///< index into candidates; none: refused
  double search_seconds = 0;          ///< wall time of the search
  [[nodiscard]] const Candidate& best() const;  ///< @throws ght::logic_error when refused
};

/// Plans one combination; throws infeasible_plan when it does not fit.
using PlanCandidate = std::function<Plan(const Settings&)>;

/// The search (see the file comment). Never throws for a refusal: check `chosen`.
[[nodiscard]] SearchResult search_plans(const std::vector<Dimension>& dims, const PlanCandidate& plan_one,
                                        const Ledger& ledger, const Tolerance& tolerance);

/// What ght plan and ght train print: the chosen plan and up to `alternatives` next best, one row
/// each (HBM and host bytes, predicted forward / backward / exposed update, link bytes, step,
/// tokens/s, MFU against `peak_flops`, what each gives up), then the inexact choices taken with
/// their prices. A refusal says so in one line: refusal_message() lists the nearest plans.
[[nodiscard]] std::string format_search(const SearchResult& r, double tokens_per_step, double peak_flops,
                                        std::size_t alternatives = 4);
/// The same as JSON (for tools): {"tolerance", "chosen", "candidates": [...]} with each
/// candidate's settings, fit, admission, prices and predicted phases.
[[nodiscard]] std::string search_to_json(const SearchResult& r, double tokens_per_step, double peak_flops);

/// A refusal: no plan within the tolerance fits. what() lists the nearest plans that fit.
class plan_refused : public ght::out_of_memory {
 public:
  using out_of_memory::out_of_memory;
};
/// The refusal's message (the nearest plans that fit, with their settings and prices; or, when
/// nothing fits at all, the missing bytes of the nearest plan).
[[nodiscard]] std::string refusal_message(const SearchResult& r, double tokens_per_step);

/// Predicted phases of a plan (forward = its share of compute, Prediction::forward_seconds;
/// backward = the rest plus recompute; exposed update = exposed seconds less recompute).
struct Phases {
  double forward = 0, backward = 0, exposed_update = 0, step = 0;
};
[[nodiscard]] Phases predicted_phases(const Prediction& p);
/// Measured phases (seconds) against predicted ones: one line with both for each phase and the
/// step, ending, where a phase or the step differs by more than `tolerance` (relative to the
/// prediction), in "off by more than 10%: backward +23%". Exposed updates under 2% of the step
/// are compared against 2% of the step, so that a few milliseconds do not count as 100%.
[[nodiscard]] std::string compare_phases(const Phases& predicted, const Phases& measured, double tolerance = 0.10);

}  // namespace ght::tier
