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
 *                   where the caller allows it);
 *   GHT_OPT_SPECULATE  the undo arena of updates during the last backward, sized or none;
 *   GHT_FP8         the FP8 expert GEMMs, where they can run (fp8_menu in plan_decide.cpp);
 *   micro-batch     (model.micro_batch, a GPU machine, one process: a data-parallel run keeps the
 *                   configured one on every rank) the configured micro-batch or 2, 4
 *                   or 8 times it with as many fewer accumulation steps, at the same tokens per
 *                   step: exact. Each accumulation step reads and writes every HBM gradient once,
 *                   so fewer, larger micro-batches spend less of the backward on that traffic
 *                   (Access::backward_hbm_bytes), at the price of their activations' HBM. Only
 *                   micro-batches of at most kMaxPlannedMicroBatchTokens are tried, and another
 *                   than the configured one is taken only where it is predicted faster by more
 *                   than kPreferConfiguredMicroBatchWithin (Dimension::prefer_first_within).
 * An option the user set pins its dimension; model.micro_batch set in a file or an override pins
 * the micro-batch (ModelConfig::micro_batch_pinned). The chosen GHT_* values are applied to the
 * registry with source `plan` (config::Registry::set_planned), so that the allocator, the model
 * and the optimizer run exactly what was planned, and `ght config` shows where each value came
 * from; the chosen micro-batch is DecidedPlan::shape, which the run trains with.
 *
 * Not searched (the cost model cannot price them yet, so they keep their settings): the split
 * update (GHT_OPTIMIZER=split, whose share the plan already predicts), the partial delay. The step
 * model assumes one sustained TFLOP/s at every micro-batch, so that a larger micro-batch's faster
 * GEMMs are not counted for it (bench-h200 on the H200, 2026-12-02: micro-batch 4 x 4 ran 1.067x
 * micro-batch 1 x 16, most of it the weight gradients' accumulation).
 */
#include <cstdint>
#include <string>
#include <vector>

#include "tier/plan.hpp"
#include "tier/plan_search.hpp"
#include "trainer/model_config.hpp"
#include "trainer/regions.hpp"

namespace ght::trainer {

/// The search's name for the micro-batch dimension: the override that pins it.
inline constexpr const char* kMicroBatchOption = "model.micro_batch";
/// The largest micro-batch the search tries, in tokens: the largest measured on the seed's layer
/// shapes (bench-h200, 4 x 4096 tokens, 2026-12-02).
inline constexpr std::int64_t kMaxPlannedMicroBatchTokens = 16384;

/// Another micro-batch than the configured one is chosen only where it is predicted faster by more
/// than this share. The step model's prediction of a micro-batch change, measured against the
/// configured micro-batch in one call each (H100, 2026-12-07,
/// bench/results/2026-12-07-h100-plan-micro-batch.md): bench-h200 at 64k, 1 -> 4 sequences,
/// predicted 2.7% faster, measured 5.2%; seed-21b's layers at 262k, 1 -> 2, predicted 2.1% faster,
/// measured 1.9% slower. 2.5% keeps the gain measured and leaves the loss.
inline constexpr double kPreferConfiguredMicroBatchWithin = 0.025;

/// `cfg` with the micro-batch of `settings` (kMicroBatchOption) and the accumulation steps that
/// keep its tokens per step; `cfg` itself where the settings do not set it.
/// @throws ght::logic_error when the micro-batch does not divide the tokens per step
[[nodiscard]] ModelConfig with_planned_shape(const ModelConfig& cfg, const tier::Settings& settings);

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

/// The dimensions searched for `cfg` under `options` (link kind) and `scope`, pinned by the
/// registry's user-set values and cfg.micro_batch_pinned (all values searched with `honour_pins`
/// false).
[[nodiscard]] std::vector<tier::Dimension> plan_dimensions(const ModelConfig& cfg, const tier::PlanOptions& options,
                                                           const PlanScope& scope, bool honour_pins = true);

/// The decision: the search and the chosen plan (planned again under the applied settings, with
/// its LM-head chunk).
struct DecidedPlan {
  tier::SearchResult search;
  ModelPlan model;
  /// The model configuration the plan is for: the caller's, with the chosen micro-batch and
  /// accumulation steps (with_planned_shape). The run trains with this micro-batch.
  ModelConfig shape;
  /// "micro-batch chosen: ..." where the shape differs from the caller's (also among the plan's
  /// notes); empty otherwise.
  std::string reshaped;
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
