#pragma once
/**
 * @file regions.hpp
 * @brief The MoE model as regions for the placement engine (tier/plan.hpp).
 *
 * Parameter groups: `embed` (tied: one table; untied: `embed` and `lm_head`), per layer
 * `layer<l>.attn` (q, k, v, o, q/k norms, router and the two RMSNorms) and
 * `layer<l>.expert<e>` (gate, up, down), and `final_norm`. Each group gives five regions:
 *   <group>.weight  bf16, 2 B/param. The GPU reads it in forward and backward of every
 *                   micro-batch (an expert's only when it receives a token); the optimizer writes
 *                   it once per step. HBM only: the trainer computes on weights in place.
 *   <group>.grad    fp32, 4 B/param in HBM (the CUDA trainer accumulates micro-batches in fp32;
 *                   2 B/param with GHT_GRAD_ACCUM=bf16, hbm_grad_type()).
 *                   On the host it is the fp32 accumulator (4 B/param), and the bf16 gradient of
 *                   one micro-batch stays in HBM (2 B/param): every micro-batch copies the bf16
 *                   gradient down (D2H) and the CPU adds it (reads 2 + 4 B, writes 4 B per param;
 *                   the first micro-batch only writes); the optimizer reads it (4 B) over the link.
 *                   The last micro-batch's copy and add can only hide behind the backward left
 *                   after the gradient is complete (none for the embedding: critical path).
 *   <group>.master, .adam_m, .adam_v   fp32, 4 B/param each (m and v: 2 B/param with
 *                   GHT_OPT_STATE=bf16, 260 B per 256 params with q8, optimizer::state_bytes). On the host, the gpu_link AdamW
 *                   reads and writes each in place once per step through kernel access. It can
 *                   hide behind the last micro-batch's backward and the next forward: a window of
 *                   1/grad_accum of the step (with GHT_OPT_DELAY, the share of the next step's
 *                   micro-batches that compute one update behind: all of them by default).
 * Per layer `layer<l>.activation` (HBM only): keep = the tensors saved for backward of one
 * micro-batch, recompute = the layer input only plus the layer's forward FLOPs again.
 * `workspace` (HBM only): the buffers every layer shares (backward scratch, the LM-head logits
 * chunk, loss read-back). Activation and workspace sizes are the CUDA model's own allocations.
 */
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "tier/plan.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {

/// routing[layer][expert]: share of tokens routed to the expert (each token picks top_k, so a
/// layer's shares sum to top_k). Empty = uniform top_k / experts.
using Routing = std::vector<std::vector<double>>;

/// The activation and workspace sizes model_regions() uses.
struct ActivationSizes {
  std::uint64_t keep_per_layer = 0;        ///< bytes saved for backward, one micro-batch
  std::uint64_t checkpoint_per_layer = 0;  ///< bytes kept when recomputing (the layer input)
  double recompute_flops_per_layer = 0;    ///< extra FLOPs per step when recomputing a layer
  std::uint64_t workspace = 0;             ///< logits, one layer in backward, dispatch buffers
  std::uint64_t recompute_scratch = 0;     ///< one layer's saved buffers, shared by recomputed layers
};
/// `lm_head_rows`: the rows of the LM-head chunk counted in the workspace; 0 =
/// default_ce_chunk_rows (plan_model() chooses it from free HBM for `ght train` and `ght plan`).
[[nodiscard]] ActivationSizes activation_sizes(const ModelConfig& cfg, std::int64_t lm_head_rows = 0);

/**
 * @brief The model's regions (see the file comment; m and v sized by GHT_OPT_STATE), as one rank
 * of `ranks` data-parallel ranks with sharded optimizer state (ZeRO-1, trainer/zero.hpp) holds
 * them: each group's master, m and v are ⌈params / ranks⌉ parameters (a rank's share, to within
 * ranks × 16 parameters per model unit), and so are the optimizer's reads and writes of them and
 * of the gradient and weight; weights, gradients and activations stay whole. With ranks > 1 the
 * gradients must stay in HBM (they are reduced there). ranks = 1: the whole model.
 * @throws ght::logic_error for an invalid config, a routing table of the wrong shape, ranks < 1
 */
[[nodiscard]] std::vector<tier::Region> model_regions(const ModelConfig& cfg, const Routing& routing = {},
                                                      int ranks = 1, std::int64_t lm_head_rows = 0);

/// The CUDA model's fixed buffer sizes, shared by the model (trainer/cuda/model_cuda.cpp) and
/// activation_sizes(): its loss read-back slots, and the rows of its LM-head/CE chunk when
/// CudaModelOptions::ce_chunk_rows is 0.
inline constexpr int kCudaLossSlots = 64;
[[nodiscard]] std::size_t cuda_loss_slot_bytes(int layers);

/// The most bytes of bf16 logits the automatic LM-head chunk holds (1.4% of an H200's HBM), and
/// the chunk it falls back to where HBM is short (256 MiB of logits, the first fixed chunk).
inline constexpr std::uint64_t kLmHeadLogitsBudget = std::uint64_t{2} << 30;
inline constexpr std::uint64_t kLmHeadSmallLogits = std::uint64_t{256} << 20;

/**
 * @brief Rows per LM-head/cross-entropy chunk of a micro-batch of `tokens` rows and a vocabulary
 * of `vocab` whose bf16 logits may take `logits_bytes`: the whole micro-batch when they fit, else
 * the fewest chunks that fit, of equal size rounded up to a multiple of 64 (never above the
 * budget's rows, themselves rounded down to a multiple of 64 where at least 64 fit).
 * @throws ght::logic_error when tokens or vocab is not positive
 */
[[nodiscard]] std::int64_t ce_chunk_rows_within(std::int64_t tokens, std::int64_t vocab,
                                                std::uint64_t logits_bytes);

/**
 * @brief The CUDA model's LM-head chunk when nothing chose one (CudaModelOptions::ce_chunk_rows
 * 0): GHT_LM_HEAD_ROWS when set (capped at `tokens`), else ce_chunk_rows_within(tokens, vocab,
 * kLmHeadLogitsBudget): the whole micro-batch at bench-h200's shape. Why whole: each chunk's dW
 * GEMM reads and writes the whole (vocab, d) gradient (8 B per element in fp32), which at
 * 832-row chunks costs as long as its math (bench/NOTES.md, "LM head"). Where the budget needs
 * several chunks, their count is rounded up to a power of two (equal chunks, rows a multiple of
 * 64): 16384 tokens at vocab 151,936 run as 4 x 4096 rows, not 3 x 5504, which cuBLAS tiles
 * worse (bench/NOTES.md, "LM head").
 */
[[nodiscard]] std::int64_t default_ce_chunk_rows(std::int64_t tokens, std::int64_t vocab);

/// A plan of the model's regions and the LM-head chunk rows it counts.
struct ModelPlan {
  tier::Plan plan;
  std::int64_t lm_head_rows = 0;  ///< what the CUDA model must run with (CudaModelOptions::ce_chunk_rows)
};

/// Rows per LM-head chunk of cfg's micro-batch as the CUDA model runs it: `lm_head_rows` (capped
/// at the micro-batch) when positive, else default_ce_chunk_rows.
[[nodiscard]] std::int64_t lm_head_chunk_rows(const ModelConfig& cfg, std::int64_t lm_head_rows = 0);

/// The share of the LM head's gradient accumulation that its dW GEMM leaves exposed. Each chunk's
/// dW GEMM reads and writes the whole (vocab, d_model) gradient: on the H200 (fp32 gradient),
/// 80 chunks of 832 rows per step against 16 of 4,096 cost 92 ms more (1.44 ms a chunk against the
/// 1.12 ms of that traffic at 4.43 TB/s); on the H100 (bf16 gradient, seed-21b's layers), 320
/// chunks against 64 cost 333 ms more (1.30 ms against 0.74 ms at 3.35 TB/s). The traffic is not
/// hidden; the rest is the smaller GEMMs' lower rate, which the plan does not count
/// (bench/NOTES.md, "The LM head's chunks in the plan").
inline constexpr double kLmHeadAccumulatorExposed = 1.0;

/**
 * @brief Plan cfg's regions (model_regions) as `ght train` runs them, with the LM-head chunk
 * chosen by the plan: default_ce_chunk_rows when planning with it decides every region as planning
 * with the small chunk (kLmHeadSmallLogits) does (its extra logits then come out of HBM that plan
 * leaves free), or when it predicts the shorter step although it moves regions (fewer chunks pass
 * over the head's gradient fewer times: model_regions counts each pass), else the small chunk.
 * GHT_LM_HEAD_ROWS, when set, is planned as it is.
 * `ght plan` and `ght train` both call it, so they plan and size alike; the plan's last note
 * says which chunk it counts and why.
 * @throws what tier::make_plan throws, for the small chunk's plan
 */
[[nodiscard]] ModelPlan plan_model(const ModelConfig& cfg, const tier::PlanOptions& options, int ranks = 1,
                                   const tier::Measurements* measured = nullptr);

/// The plan group of a parameter tensor ("model.layers.3.mlp.experts.7.up_proj.weight" ->
/// "layer3.expert7", "model.embed_tokens.weight" -> "embed"), and its region for a class
/// ("layer3.expert7.master"): how a tensor-named allocation finds its plan decision.
[[nodiscard]] std::string plan_group_of(std::string_view tensor);
[[nodiscard]] std::string plan_region_of(std::string_view tensor, ght::TensorClass cls);

/// The CUDA trainer's fixed HBM costs, set in `options`: delayed_update_hbm_bytes (always, when
/// GHT_OPT_DELAY is on), host_state_hbm_bytes (the optimizer's dma slots while any master/m/v region is on the host,
/// when GHT_OPT_LINK_MODE resolves to dma) and recompute_scratch_bytes (one layer's buffers while
/// any layer is recomputed), speculation_hbm_bytes (the undo arena while any master/m/v region is on
/// the host; `ranks` > 1: none), and FP8's copies (add_fp8_reservation); and, when GHT_PLACE is
/// empty and there is a GPU link, the state's
/// tier that an explicit GHT_OPTIMIZER path implies (gpu_link, cpu: host; device: HBM), since
/// AdamW places it there. `ght plan` and `ght train` both call it, so they plan alike.
void add_trainer_reservations(tier::PlanOptions& options, const ModelConfig& cfg, int ranks = 1);

/// The element type of the gradients the CUDA trainer accumulates in HBM (GHT_GRAD_ACCUM): what
/// the model allocates and what the plan counts.
[[nodiscard]] optimizer::GradType hbm_grad_type();

/// GHT_OPT_DELAY: the one-step-delayed update (trainer/README.md).
[[nodiscard]] bool delayed_update();
/// The backward's share of a micro-batch's layer compute, rho / (1 + rho) with rho the plan's
/// backward-over-forward ratio (GHT_ASSUMED_BWD_RATIO).
[[nodiscard]] double backward_share();
/// Whether either speculation arena is asked for (GHT_OPT_SPECULATE non-zero or empty, which is
/// auto, or GHT_OPT_SPECULATE_HOST non-zero): the exact update may then start during the last
/// backward.
[[nodiscard]] bool speculating_updates();
/// GHT_OPT_SPECULATE left empty: ght train sizes the HBM undo arena (auto_speculation_bytes).
[[nodiscard]] bool speculation_auto();
/**
 * @brief The HBM undo arena that GHT_OPT_SPECULATE's auto gives a run: the parameters whose
 * gpu_link update the last micro-batch's backward can hide, each at its undo bytes (master, m, v
 * and the bf16 weight: optimizer::state_bytes_per_param + 2). That backward lasts its share
 * (backward_ratio) of one micro-batch's layer compute at the assumed rate, plus the LM head's; the
 * link updates min(h2d, d2h) / state_bytes_per_param parameters a second (each parameter's state
 * crosses it both ways). A larger arena hides nothing more: it only starts launches earlier.
 * At most every parameter, and at most kAutoSpeculationShare of the HBM budget (over C2C the
 * last backward could hide more state than HBM holds); 0 without a GPU link. The plan weighs it
 * against placement (a GHT_OPT_SPECULATE=0 candidate beside it); the optimizer caps it at the HBM
 * left free.
 */
inline constexpr double kAutoSpeculationShare = 0.125;
[[nodiscard]] std::uint64_t auto_speculation_bytes(const ModelConfig& cfg, const tier::PlanOptions& options);
/// The HBM undo arena the plan counts while any master/m/v region is on the host
/// (PlanOptions::speculation_hbm_bytes): auto_speculation_bytes under auto, else GHT_OPT_SPECULATE
/// (a percentage of the HBM budget); 0 for several ranks, a delayed update or no GPU link.
[[nodiscard]] std::uint64_t speculation_hbm_bytes(const ModelConfig& cfg, const tier::PlanOptions& options,
                                                  int ranks);
/// The share of the step that the update can hide behind (tier::Access::window_fraction):
/// delayed, the next step's stale micro-batches (delay_stale_micro_batches / grad_accum); exact,
/// the next step's first forward (each unit's forward waits for that unit's update), plus the
/// last backward when speculating_updates().
[[nodiscard]] double update_window_fraction(int grad_accum);
/// GHT_OPT_DELAY_MICRO: how many of a step's `grad_accum` micro-batches compute one update
/// behind, in [1, grad_accum] (grad_accum: the whole step, also for 0, the default).
[[nodiscard]] int delay_stale_micro_batches(int grad_accum);
/// Whether only some of a step's micro-batches compute one update behind (the rest wait for the
/// update): GHT_OPT_DELAY on and delay_stale_micro_batches(grad_accum) < grad_accum.
[[nodiscard]] bool delay_partial(int grad_accum);
/// The delayed update's weight prediction (GHT_OPT_DELAY_PREDICT; optimizer::AdamWHyper::
/// weight_extrapolation): 0 without GHT_OPT_DELAY, and 0 for a partial delay (delay_partial:
/// the weights one update wrote serve the fresh micro-batches of the next step and the stale
/// ones of the step after, so they stay master's).
[[nodiscard]] double delay_weight_extrapolation(int grad_accum);
/// GHT_OPT_DELAY_WARMUP: the delayed update's exact steps before the delay starts.
[[nodiscard]] std::int64_t delay_warmup_steps();
/// Whether the step after `done` completed steps runs delayed: GHT_OPT_DELAY on and `done` past
/// delay_warmup_steps().
[[nodiscard]] bool delayed_at(std::int64_t done);
/// HBM the CUDA trainer's delayed update holds (a second bf16 weight buffer and a second
/// gradient buffer of hbm_grad_type()); 0 when GHT_OPT_DELAY is off.
[[nodiscard]] std::uint64_t delayed_update_hbm_bytes(const ModelConfig& cfg);

/// Training FLOPs per step: flops_per_token() * tokens_per_step().
[[nodiscard]] double model_step_flops(const ModelConfig& cfg);
/// FLOPs per step of the fused LM head and loss, forward and backward: 6 x vocab x d_model per
/// token (PlanOptions::head_flops); not in model_step_flops (the strict count leaves it out).
[[nodiscard]] double model_head_flops(const ModelConfig& cfg);

}  // namespace ght::trainer
