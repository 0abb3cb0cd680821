#pragma once
/**
 * @file plan_decide.hpp
 * @brief The plan decides: the model's search dimensions, the search, and the settings it applies
 * (tier/plan_search.hpp).
 *
 * For a model, a machine (the PlanOptions' link numbers and budgets) and tokens/step, the search
 * chooses together with the region placement (make_plan: each region's tier, keep or recompute,
 * accumulate or stream, the LM-head chunk):
 *   GHT_OPT_STATE   m and v in fp32 (exact), bf16 or q8;
 *   GHT_GRAD_ACCUM  HBM gradient accumulation in fp32 (exact) or bf16 (a GPU machine only);
 *   GHT_OPT_DELAY   the one-step-delayed update, off (exact) or on (a GPU machine, one rank,
 *                   where the caller allows it).
 * An option the user set pins its dimension. The chosen values are applied to the registry with
 * source `plan` (config::Registry::set_planned), so that the allocator, the model and the
 * optimizer run exactly what was planned, and `ght config` shows where each value came from.
 *
 * Not searched (the cost model cannot price them yet, so they keep their settings): micro-batch
 * size (the step model assumes one sustained TFLOP/s), speculation arenas, the split update
 * (GHT_OPTIMIZER=split, whose share the plan already predicts), the partial delay.
 */
#include <string>
#include <vector>

#include "tier/plan.hpp"
#include "tier/plan_search.hpp"
#include "trainer/model_config.hpp"
#include "trainer/regions.hpp"

namespace ght::trainer {

/// What the caller allows the search to choose besides precision.
struct PlanScope {
  int ranks = 1;             ///< data-parallel ranks sharding the optimizer state (ZeRO-1)
  bool allow_delay = true;   ///< false where the run cannot delay its update (DiLoCo, CPU backend)
  /// The FP8 expert GEMMs can run where this plan trains, on this model (fp8_unavailable_here() and
  /// fp8_shape_refusal() both empty): only then does the search try GHT_FP8 unless the user set it.
  bool fp8 = false;
  /// Why fp8 is false, for the plan's table where the ledger would otherwise put FP8 on the menu
  /// (empty: nothing said).
  std::string fp8_why_not{};
};

/// The scope of a run of `cfg` in this process: `ranks` as given, the delay allowed where asked, and
/// FP8 where this process and the model's shapes can run it.
[[nodiscard]] PlanScope local_plan_scope(const ModelConfig& cfg, int ranks, bool allow_delay);

/// The dimensions searched under `options` (link kind) and `scope`, pinned by the registry's
/// user-set values (all values searched with `honour_pins` false).
[[nodiscard]] std::vector<tier::Dimension> plan_dimensions(const tier::PlanOptions& options, const PlanScope& scope,
                                                           bool honour_pins = true);

/// The decision: the search and the chosen plan (planned again under the applied settings, with
/// its LM-head chunk).
struct DecidedPlan {
  tier::SearchResult search;
  ModelPlan model;
  /// "inexact choice taken: <what and its price>", one per inexact setting of the choice (also
  /// among the plan's notes): the run's log says them.
  std::vector<std::string> taken;
  /// What the search left out and why ("FP8 experts not searched ...": scope.fp8_why_not), also
  /// among the plan's notes.
  std::vector<std::string> left_out;
  /// The search's table (format_search) and the inexact choices taken, for ght plan and the
  /// run's log.
  [[nodiscard]] std::string table(const ModelConfig& cfg) const;
};

/**
 * @brief Search, choose, apply the choice to the registry (source plan) and plan it.
 * `base` is the plan's options before the trainer's reservations (add_trainer_reservations runs
 * for every candidate, since they depend on the settings searched).
 * @throws tier::plan_refused when no plan within GHT_PLAN_TOLERANCE fits, listing the nearest
 *         plans that fit with their settings (where none fits with the options the user set,
 *         those that would fit with other values of them); config_error for a bad GHT_PLAN_TOLERANCE; what
 *         make_plan throws besides infeasible_plan
 */
[[nodiscard]] DecidedPlan decide_plan(const ModelConfig& cfg, const tier::PlanOptions& base, const PlanScope& scope,
                                      const tier::Measurements* measured = nullptr);

/// Search without applying anything (ght plan --json and tests): the registry is as it was after.
[[nodiscard]] tier::SearchResult search_model_plans(const ModelConfig& cfg, const tier::PlanOptions& base,
                                                    const PlanScope& scope, const tier::Measurements* measured = nullptr);

/// The peak the MFU columns divide by: the H100/H200 SXM dense bf16 datasheet figure.
[[nodiscard]] double plan_peak_flops();

}  // namespace ght::trainer
