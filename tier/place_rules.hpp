#pragma once
/**
 * @file place_rules.hpp
 * @brief GHT_PLACE: static placement rules.
 *
 * Grammar (whitespace around rules and tokens is ignored):
 *
 *   GHT_PLACE := rule { ',' rule }
 *   rule      := selector '=' target
 *   selector  := 'class:' glob                 regions whose class matches glob
 *              | 'name:' glob                  regions whose name matches glob
 *              | 'experts[' set ']' '.' glob   expert regions (expert id >= 0) whose class matches
 *              | glob                          a class glob when it matches a class name,
 *                                              otherwise a region-name glob
 *   set       := 'hot:' N | 'cold:' N | '*'    the N most / least routed experts of each layer
 *                                              (by routing frequency; ties: lower id first), all
 *   glob      := text with '*' (any run) and '?' (any one character); class globs ignore case
 *   target    := hbm | host | keep | recompute | stream | accumulate
 *
 * Classes: weight, grad, master, adam_m, adam_v, activation, other. keep and recompute apply to
 * regions that can be recomputed (activations): both are HBM. stream (host) and accumulate (HBM)
 * apply to grad regions. Rules apply left to right; for a region matched by several rules the
 * last one wins. Example: "master=host,adam_*=host,grad=hbm,experts[hot:8].weight=hbm".
 *
 * Errors are ght::config_error naming the rule: its number, its text and its character offset.
 */
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tier/cost_model.hpp"
#include "tier/plan.hpp"

namespace ght::tier {

enum class RuleTarget { hbm, host, keep, recompute, stream, accumulate };
[[nodiscard]] std::string_view to_string(RuleTarget t) noexcept;

struct PlaceRule {
  enum class Kind { class_glob, name_glob, experts };
  enum class ExpertSet { all, hot, cold };

  std::string text;         ///< the rule as written (trimmed)
  int number = 0;           ///< 1-based position in GHT_PLACE
  std::size_t offset = 0;   ///< character offset of the rule in GHT_PLACE (0-based)
  Kind kind = Kind::class_glob;
  std::string glob;         ///< class glob (class_glob, experts) or name glob (name_glob)
  ExpertSet experts = ExpertSet::all;
  int count = 0;            ///< N of hot:N / cold:N
  RuleTarget target = RuleTarget::hbm;

  /// "GHT_PLACE rule 3 'grad=hbm'"
  [[nodiscard]] std::string describe() const;
};

/// Parse GHT_PLACE. An empty text gives no rules.
/// @throws ght::config_error naming the malformed rule, its number and its character offset.
[[nodiscard]] std::vector<PlaceRule> parse_place_rules(std::string_view text);

/// For each region, the index (into `rules`) of the last rule matching it, or -1.
/// @throws ght::config_error for a rule that matches no region at all.
[[nodiscard]] std::vector<int> match_place_rules(const std::vector<PlaceRule>& rules,
                                                 const std::vector<Region>& regions);

/// The placements of `r` a rule allows (a subset of placements(r), in the same order).
/// @throws ght::config_error when the rule's target does not apply to the region's class or
///         asks for a tier the region does not allow.
[[nodiscard]] std::vector<Placement> placements_allowed_by(const PlaceRule& rule, const Region& r);

/// Glob match with '*' and '?'; `ignore_case` for class names.
[[nodiscard]] bool glob_match(std::string_view pattern, std::string_view text,
                              bool ignore_case = false) noexcept;

}  // namespace ght::tier
