#pragma once
/**
 * @file plan.hpp
 * @brief The placement policy engine: regions in, a plan out (DESIGN.md, "The plan").
 *
 * A *region* is a named group of tensors of one class with a size and the accesses one training
 * step makes to it. The engine gives every region a tier (hbm or host) and a mode:
 *   activation: keep | recompute | offload (host)      grad: accumulate (HBM) | stream (host)
 * and predicts HBM and host bytes, link bytes and seconds in each direction, host-memory traffic,
 * the compute window and the exposed seconds per step (see cost_model.hpp for the model).
 *
 * Policies (GHT_POLICY):
 *   static  GHT_PLACE rules fix the tier (and mode) of the regions they match; a region no rule
 *           matches goes to HBM (host when HBM is not allowed for it). No cost-based choice.
 *   greedy  Starts with every region at its smallest HBM footprint (host where allowed) and moves
 *           regions into HBM in order of time saved per HBM byte. It builds a few candidate orders
 *           (all seconds; critical-path seconds first; seconds that cannot hide behind compute
 *           first), evaluates every prefix of every order with the full cost model and keeps the
 *           fastest prefix that fits both budgets. The candidate set only grows with the budgets,
 *           so a larger budget never predicts a slower step. GHT_PLACE rules, when given, pin the
 *           regions they match.
 *   auto    greedy, re-run on counts measured in a warm-up step (Measurements).
 *
 * The plan is data: Plan::to_json() / Plan::from_json() round-trip exactly; the allocator asks
 * Plan::tier_for() where a tensor goes.
 */
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tier/budget.hpp"  // Capacities, Budgets, resolve_budgets
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/types.hpp"

namespace ght::config {
class Registry;
}

namespace ght::tier {

/// How the GPU reaches a host-resident region: memcpy (h2d_bps / d2h_bps) or a kernel
/// dereferencing host memory (kernel_read_bps / kernel_write_bps).
enum class GpuPath { copy, kernel };

/// What a placement does with a region besides where it lives.
enum class Mode {
  none,        ///< plain residence
  keep,        ///< activations kept in HBM for backward
  recompute,   ///< only a checkpoint kept in HBM; the rest recomputed in backward
  offload,     ///< activations written to the host in forward, read back in backward
  accumulate,  ///< gradients accumulated in HBM across micro-batches
  stream,      ///< gradients copied to the host every micro-batch, added there into fp32
};

enum class Policy { static_rules, greedy, auto_replan };

[[nodiscard]] std::string_view to_string(GpuPath p) noexcept;
[[nodiscard]] std::string_view to_string(Mode m) noexcept;
[[nodiscard]] std::string_view to_string(Policy p) noexcept;  ///< "static", "greedy", "auto"
[[nodiscard]] std::optional<GpuPath> parse_gpu_path(std::string_view s) noexcept;
[[nodiscard]] std::optional<Mode> parse_mode(std::string_view s) noexcept;
[[nodiscard]] std::optional<Policy> parse_policy(std::string_view s) noexcept;

/// One kind of access a training step makes to a region. Bytes are per occurrence.
struct Access {
  std::string what = "compute";  ///< purpose tag ("compute", "optimizer", "grad_stream", ...)
  double gpu_read_bytes = 0;
  double gpu_write_bytes = 0;
  double cpu_read_bytes = 0;
  double cpu_write_bytes = 0;
  double times_per_step = 1;   ///< e.g. grad_accum for per-micro-batch accesses
  bool overlappable = true;    ///< false: on the critical path
  double window_fraction = 1;  ///< share of the step's compute window it can hide behind (0..1]
  GpuPath gpu_path = GpuPath::copy;
  /// > 0: the access happens only when the region's expert receives at least one of this many
  /// tokens; its bytes are scaled by 1 - (1 - routing_frequency)^routing_tokens.
  double routing_tokens = 0;
  /// A memory-bound pass of its own (the optimizer update): on HBM its GPU bytes cost time at
  /// hbm_pass_share of the link profile's hbm_bps, on the critical path (it shares the SMs and
  /// HBM with the compute). Other accesses of an HBM region are part of the compute that the
  /// FLOPs time.
  bool hbm_pass = false;
  /// The share of hbm_bps at which the pass moves its bytes (its kernel's measured efficiency:
  /// GHT_ASSUMED_HBM_UPDATE), in (0, 1].
  double hbm_pass_share = 1;
  /// > 0: the pass is compute-bound and moves its bytes at no more than this many per second,
  /// whatever the HBM's bandwidth (the q8 update: GHT_ASSUMED_Q8_UPDATE parameters per second
  /// times its bytes per parameter). The slower of the two rates counts.
  double hbm_pass_bps = 0;
  /// HBM bytes the access moves inside the backward, per occurrence, whatever the region's tier:
  /// the gradient accumulator's read-modify-write in the weight-gradient GEMMs' epilogues, or a
  /// streamed gradient's write and its copy's read. backward_exposed of their time at hbm_bps is not
  /// hidden by the GEMMs and lengthens the backward (GHT_ASSUMED_ACC_EXPOSED).
  double backward_hbm_bytes = 0;
  double backward_exposed = 0;
  bool operator==(const Access&) const = default;
};

/// A named group of tensors of one class (DESIGN.md, "The plan").
struct Region {
  std::string name;
  TensorClass cls = TensorClass::other;
  std::string group;                         ///< row of the plan table; empty = class name
  std::uint64_t bytes = 0;                   ///< size in HBM
  std::optional<std::uint64_t> host_bytes;   ///< size on the host (default: bytes)
  /// HBM the region still holds while it lives on the host: a streamed gradient keeps its
  /// per-micro-batch buffer in HBM. Counted in the HBM prediction and budget.
  std::uint64_t hbm_bytes_on_host = 0;
  std::vector<Access> access;                ///< accesses per step (either tier)
  std::optional<std::vector<Access>> host_access;  ///< replaces `access` when on the host
  bool hbm_allowed = true;
  bool host_allowed = true;
  std::optional<std::uint64_t> recompute_bytes;  ///< HBM bytes kept when recomputing; unset = no
  double recompute_flops = 0;                ///< extra FLOPs per step when recomputing
  int layer = -1;                            ///< -1 = not per layer
  int expert = -1;                           ///< -1 = not an expert's region
  double routing_frequency = 0;              ///< share of tokens routed to this expert (0..1)

  /// Bytes the region occupies on `t` in its default mode (recompute uses recompute_bytes).
  [[nodiscard]] std::uint64_t bytes_on(TierKind t) const {
    return t == TierKind::hbm ? bytes : host_bytes.value_or(bytes);
  }
  [[nodiscard]] std::string_view group_name() const;
  bool operator==(const Region&) const = default;
};

/// Check names (non-empty, unique), sizes and access numbers.
/// @throws ght::logic_error naming the region and the field.
void validate_regions(const std::vector<Region>& regions);

/// Everything the engine needs besides the regions.
struct PlanOptions {
  Policy policy = Policy::greedy;
  std::string place;        ///< GHT_PLACE rules (place_rules.hpp)
  /// Where `place` came from, when not GHT_PLACE (e.g. "GHT_OPTIMIZER=gpu_link"): display only.
  std::string place_origin;
  Budgets budgets;
  LinkNumbers link;
  double step_flops = 0;    ///< the layers' training FLOPs per step (sizes the overlap window)
  /// The layers' sustained rate (GHT_ASSUMED_TFLOPS). This default, backward_ratio's and
  /// head_tflops' are the registry's (config_options.inc; tests/tier/plan_test.cpp checks them).
  double assumed_tflops = 500;
  /// Backward compute time over forward compute time of the layers (recompute and the LM head
  /// excluded): how step_flops' time splits into the forward and backward phases a run measures
  /// (GHT_ASSUMED_BWD_RATIO; FLOPs alone give 2).
  double backward_ratio = 2.25;
  /// FLOPs per step of the fused LM head and loss, forward and backward (6·V·d per token), which
  /// run in the backward phase at their own rate (GHT_ASSUMED_HEAD_TFLOPS); 0 = none counted.
  double head_flops = 0;
  double head_tflops = 760;
  /// Seconds of the LM head and loss per step: head_flops at head_tflops.
  [[nodiscard]] double head_seconds() const { return head_flops / (head_tflops * 1e12); }
  /// Double-buffered pinned staging the gradient stream needs, reserved in host memory while
  /// any gradient region streams (2 x GHT_STAGING_BYTES).
  std::uint64_t stream_staging_bytes = 0;
  /// HBM the optimizer reserves while any master/m/v region lives on the host: the copy
  /// engines' slots of the gpu_link path (the trainer sets it; 0 = none).
  std::uint64_t host_state_hbm_bytes = 0;
  /// HBM the trainer needs once while any layer's activations are recomputed: the buffers one
  /// recomputed layer's forward fills, shared by every recomputed layer (0 = none).
  std::uint64_t recompute_scratch_bytes = 0;
  /// HBM the trainer holds whatever the placement, on a GPU machine: the second bf16 weight and
  /// gradient buffers of the one-step-delayed update (GHT_OPT_DELAY=1; the trainer sets it).
  std::uint64_t delayed_update_hbm_bytes = 0;
  /// HBM the optimizer reserves while any master/m/v region lives on the host: the undo arena of
  /// the updates launched during the last backward (GHT_OPT_SPECULATE; the trainer sets it).
  std::uint64_t speculation_hbm_bytes = 0;
  /// HBM the trainer holds whatever the placement for FP8 GEMMs (GHT_FP8): the weights' FP8
  /// copies and the activations' codes, with their scales (the trainer sets it; 0 = none).
  std::uint64_t fp8_hbm_bytes = 0;
  /// Forward seconds per step that FP8 GEMMs save, net of quantising their weights (the trainer
  /// sets it from GHT_ASSUMED_FP8_GEMM; 0 = bf16 only). The layers' compute is step_flops at
  /// assumed_tflops less this, all of it taken from the forward phase.
  double fp8_saved_seconds = 0;
  /// step_flops less the FLOPs at assumed_tflops that fp8_saved_seconds stands for: what the
  /// compute phases are timed by. The strict FLOP count (MFU) stays step_flops.
  [[nodiscard]] double timed_step_flops() const { return step_flops - fp8_saved_seconds * assumed_tflops * 1e12; }
};

/// Options from the registry (GHT_POLICY, GHT_PLACE, budgets, GHT_ASSUMED_*,
/// GHT_STAGING_BYTES) plus the caller's link numbers, capacities, the layers' step FLOPs and the
/// LM head's (PlanOptions::head_flops).
[[nodiscard]] PlanOptions plan_options_from_config(const config::Registry& reg,
                                                   const LinkNumbers& link,
                                                   const Capacities& caps, double step_flops,
                                                   double head_flops = 0);

/// Counts measured in a warm-up step, for the auto policy.
struct ExpertTokens {
  int layer = -1;
  int expert = -1;
  double tokens = 0;  ///< tokens routed to this expert in the warm-up step
};
struct RegionLinkBytes {
  std::string region;
  double h2d_bytes = 0;  ///< bytes moved host -> device per step while it lived on the host
  double d2h_bytes = 0;
};
/// A run's compute phases per step (medians after its warm-up step), which calibrate the plan's
/// compute rates: the step FLOPs and recompute FLOPs of the plan it ran, and the forward and
/// backward seconds measured (recompute included in the backward).
struct MeasuredPhases {
  double step_flops = 0;
  double recompute_flops = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double head_flops = 0;  ///< the LM head's, timed in the backward (PlanOptions::head_flops)
  [[nodiscard]] bool present() const { return forward_seconds > 0 || backward_seconds > 0; }
};
struct Measurements {
  double step_tokens = 0;  ///< tokens in the warm-up step (routing frequency = tokens / this)
  std::vector<ExpertTokens> expert_tokens;
  std::vector<RegionLinkBytes> link_bytes;
  MeasuredPhases phases;   ///< none when !phases.present()
};

/// The compute rates that reproduce measured phases under the cost model's own assumptions:
/// with F step FLOPs, R recompute FLOPs, forward f and backward b seconds, and h the LM head's
/// seconds (head FLOPs at `head_tflops`), the model predicts f = F / (S (1 + rho)) and
/// b = rho f + R / S + h, so
///   rho = (b - h - (R/F) f) / (f (1 + R/F)),   S = F / (f (1 + rho)).
struct ComputeCalibration {
  double tflops = 0;          ///< S / 1e12: the sustained rate (PlanOptions::assumed_tflops)
  double backward_ratio = 0;  ///< rho (PlanOptions::backward_ratio)
};
/// @throws ght::config_error naming the field when the phases are not finite and positive, or the
/// backward is shorter than its recompute and LM head
/// `accumulate_seconds`: the backward's gradient accumulation the model adds (Prediction::
/// accumulate_seconds), taken off the measured backward with the LM head.
[[nodiscard]] ComputeCalibration calibrate_compute(const MeasuredPhases& m, double head_tflops,
                                                   double accumulate_seconds = 0);

/// Regions updated by measurements: routing frequencies from expert token counts, and the
/// host-side GPU accesses of each measured region scaled so that its predicted link bytes per
/// direction equal the measured ones. @throws ght::logic_error naming an unknown region/expert.
[[nodiscard]] std::vector<Region> apply_measurements(std::vector<Region> regions,
                                                     const Measurements& m);

/// The engine's choice for one region (aligned with Plan::regions()).
struct Decision {
  TierKind tier = TierKind::hbm;
  Mode mode = Mode::none;
  std::string reason;           ///< one line; identical for regions decided alike
  double gain_ms_per_gib = 0;   ///< ms per step its HBM bytes save, per GiB (0 when n/a)
  int rule = 0;                 ///< 1-based GHT_PLACE rule that fixed it; 0 = none
  bool operator==(const Decision&) const = default;
};

/// Per-step predictions of a placement.
struct Prediction {
  std::uint64_t hbm_bytes = 0;
  std::uint64_t host_bytes = 0;
  double h2d_bytes = 0;           ///< link, host -> device
  double d2h_bytes = 0;           ///< link, device -> host
  double h2d_seconds = 0;         ///< each direction alone
  double d2h_seconds = 0;
  double link_seconds = 0;        ///< both directions sharing the link (bidir limit)
  double host_traffic_bytes = 0;  ///< CPU reads + writes of host memory
  double host_seconds = 0;
  double compute_seconds = 0;     ///< step FLOPs at GHT_ASSUMED_TFLOPS + head_seconds + accumulate_seconds, recompute excluded
  double head_seconds = 0;        ///< the LM head's part of compute_seconds (in the backward)
  /// The gradient accumulators' exposed HBM traffic, part of compute_seconds (in the backward;
  /// Access::backward_exposed)
  double accumulate_seconds = 0;
  double forward_seconds = 0;     ///< the layers' forward part of compute_seconds (backward_ratio)
  double recompute_seconds = 0;
  double window_seconds = 0;      ///< compute + recompute: what transfers can hide behind
  double hbm_pass_seconds = 0;    ///< passes over HBM besides the compute (the device update)
  double exposed_seconds = 0;     ///< recompute + HBM passes + transfers that do not hide
  double step_seconds = 0;        ///< compute + exposed
  double optimizer_link_seconds = 0;  ///< link time of the "optimizer" accesses alone
  bool operator==(const Prediction&) const = default;
};

/// A plan does not fit: `tier` is the budget to raise, by at least missing_bytes().
class infeasible_plan : public ght::out_of_memory {
 public:
  infeasible_plan(std::string msg, TierKind tier, std::uint64_t needed, std::uint64_t budget)
      : out_of_memory(std::move(msg)), tier_(tier), needed_(needed), budget_(budget) {}
  [[nodiscard]] TierKind tier() const noexcept { return tier_; }
  [[nodiscard]] std::uint64_t needed_bytes() const noexcept { return needed_; }
  [[nodiscard]] std::uint64_t budget_bytes() const noexcept { return budget_; }
  [[nodiscard]] std::uint64_t missing_bytes() const noexcept { return needed_ - budget_; }

 private:
  TierKind tier_;
  std::uint64_t needed_, budget_;
};

/// The result of make_plan(): immutable data.
class Plan {
 public:
  Plan() = default;
  Plan(PlanOptions options, std::vector<Region> regions, std::vector<Decision> decisions,
       Prediction prediction, std::vector<std::string> notes);

  [[nodiscard]] const PlanOptions& options() const { return options_; }
  [[nodiscard]] const std::vector<Region>& regions() const { return regions_; }
  [[nodiscard]] const std::vector<Decision>& decisions() const { return decisions_; }
  [[nodiscard]] const Prediction& prediction() const { return prediction_; }
  [[nodiscard]] const std::vector<std::string>& notes() const { return notes_; }

  /// The decision for a region by name; nullptr when unknown.
  [[nodiscard]] const Decision* find(std::string_view region) const;
  /// Tier for an allocation: the region's tier when the plan knows the name, else the tier
  /// holding most bytes of `cls` in this plan, else hbm. Thread-safe.
  [[nodiscard]] TierKind tier_for(std::string_view region, TensorClass cls) const;
  /// "accumulate" / "stream" / "keep" / ... when every region of `cls` has that mode,
  /// "mixed" when they differ, "-" when the plan has no region of `cls`.
  [[nodiscard]] std::string mode_summary(TensorClass cls) const;

  /// The plan as JSON (regions with their decisions, options, predictions, notes).
  [[nodiscard]] std::string to_json() const;
  /// Parse to_json() output. @throws ght::io_error naming `origin` and the offending field.
  static Plan from_json(const std::string& text, const std::string& origin);

  /// Table of region groups (tier, mode, bytes), totals against budgets, per-step predictions;
  /// `explain` adds one reason line per decision row and the plan's notes.
  [[nodiscard]] std::string format_table(bool explain) const;

  bool operator==(const Plan& o) const;

 private:
  PlanOptions options_;
  std::vector<Region> regions_;
  std::vector<Decision> decisions_;
  Prediction prediction_;
  std::vector<std::string> notes_;
  std::unordered_map<std::string, std::size_t> index_;
  std::array<TierKind, kNumTensorClasses> class_tier_{};
};

/// Plan `regions` under `options` (policy, rules, budgets, link numbers, step FLOPs).
/// `measured` feeds the auto policy (ignored by the others): expert token counts set routing
/// frequencies, link bytes scale the regions' host-side accesses, and measured phases set the
/// compute rates (calibrate_compute: GHT_ASSUMED_TFLOPS and GHT_ASSUMED_BWD_RATIO as measured).
/// @throws ght::config_error for a malformed or inapplicable GHT_PLACE rule (naming it);
///         infeasible_plan when no placement fits the budgets (naming the budget to raise);
///         ght::logic_error for invalid regions.
[[nodiscard]] Plan make_plan(std::vector<Region> regions, const PlanOptions& options,
                             const Measurements* measured = nullptr);

/**
 * @brief The update split's assignment (GHT_OPTIMIZER=split): which host-state regions the cpu
 * path updates, so that a share `cpu_fraction` of their parameters goes to the host cores.
 * @param params parameters of each host-state region, in the order the optimizer updates them
 *        (the forward's order, so the next forward's first units are done first)
 * @return per region, true for the cpu path. Error diffusion: walking the list, a region goes
 * to the cpu path when that brings the cpu share of the prefix so far closer to `cpu_fraction`
 * (ties: gpu_link). Both paths then advance through the list together, so the next forward's
 * unit u waits for about the same fraction of each path's work; the share reached over the
 * whole list is within half the largest region of the target. 0 gives none, 1 every region.
 * @throws ght::logic_error when cpu_fraction is outside [0, 1]
 */
[[nodiscard]] std::vector<bool> assign_update_split(const std::vector<std::uint64_t>& params,
                                                    double cpu_fraction);

/// Predictions for an explicit placement (one decision per region; reasons ignored).
[[nodiscard]] Prediction predict(const std::vector<Region>& regions,
                                 const std::vector<Decision>& decisions,
                                 const PlanOptions& options);

}  // namespace ght::tier
