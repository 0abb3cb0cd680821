#pragma once
/**
 * @file train_config.hpp
 * @brief The resolved configuration of a training run, from a preset, a TOML file and overrides.
 *
 * TOML layout (files under configs/); every key is optional and unknown keys are errors:
 *   [model]      preset = "tiny" plus any ModelConfig field (d_model, layers, heads, kv_heads,
 *                head_dim, experts, top_k, expert_ffn, norm_topk_prob, rope_theta, vocab,
 *                tied_embeddings, rms_eps, aux_loss_coef, z_loss_coef, seq_len, micro_batch,
 *                grad_accum)
 *   [train]      data, out, steps, eval_every, eval_batches, ckpt_every, keep, seed, backend,
 *                log_every, threads
 *   [optimizer]  beta1, beta2, eps, weight_decay, max_grad_norm
 *   [schedule]   kind (cosine|linear|wsd|constant), lr, min_lr, warmup_steps, decay_fraction
 *   [diloco]     inner_steps, outer_lr, outer_momentum, bf16_pseudo_grads, fragments,
 *                overlap_steps, mix (trainer/diloco.hpp)
 *   [dist]       optimizer_state (sharded|replicated: ZeRO-1 or not, trainer/zero.hpp)
 * Overrides use the same names: "model.d_model=128", "train.steps=500", "schedule.lr=1e-3".
 *
 * Every integer is range-checked before it is narrowed (model fields: model_int_ranges(); train
 * counts: [1, 10^12]; train.seed: [0, 2^63-2]) and every number must be finite (inf/nan cannot be
 * stored in config.json). Errors name the section.key and the valid range. The built-in warmup
 * (20 steps) is clamped for runs shorter than it; an explicit schedule.warmup_steps is not.
 */
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "trainer/model_config.hpp"
#include "trainer/schedule.hpp"

namespace ght::trainer {

/// The schedule's warmup when neither the file nor an override sets schedule.warmup_steps. A
/// shorter run clamps it to train.steps (wsd: to the steps before the decay phase).
inline constexpr std::int64_t kDefaultWarmupSteps = 20;

/// DiLoCo (trainer/diloco.hpp): every rank a worker taking `inner_steps` local AdamW steps, then
/// an outer Nesterov SGD step on the rank-averaged pseudo-gradient. inner_steps 0: plain data
/// parallel. The defaults are the DiLoCo paper's (Douillard et al. 2023). With DiLoCo on,
/// train.eval_every must be a multiple of inner_steps (inside a window the ranks' weights differ).
struct DilocoConfig {
  std::int64_t inner_steps = 0;    ///< H; 0 = off
  double outer_lr = 0.7;           ///< in (0, 10]
  double outer_momentum = 0.9;     ///< Nesterov momentum, in [0, 1)
  bool bf16_pseudo_grads = false;  ///< round the pseudo-gradients to bf16 before the all-reduce
  /// Streaming DiLoCo (Douillard et al. 2025; trainer/diloco.hpp): the model's units split, by
  /// stride, into this many fragments, each synchronised once every H steps at its own offset;
  /// a divisor of H. 1: the whole model at once.
  std::int64_t fragments = 1;
  /// Streaming: inner steps a fragment's all-reduce overlaps before its outer step is applied
  /// (τ), in [0, H / fragments).
  std::int64_t overlap_steps = 0;
  /// Streaming: a synchronised fragment's local weights become mix·θ_local + (1 − mix)·θ_global
  /// (α, in [0, 1]; 0 replaces them, as plain DiLoCo does).
  double mix = 0;
  [[nodiscard]] bool on() const noexcept { return inner_steps > 0; }
  /// Any of the streaming options set: the fragment schedule instead of the whole-model step.
  [[nodiscard]] bool streaming() const noexcept { return on() && (fragments > 1 || overlap_steps > 0 || mix > 0); }
};

/// Several data-parallel processes (trainer/zero.hpp). One process ignores it.
struct DistConfig {
  /// "sharded": ZeRO-1, each of N > 1 ranks holds 1/N of master, m and v (gradients
  /// reduce-scattered, weights all-gathered); "replicated": every rank holds all of it (gradients
  /// all-reduced). DiLoCo's workers keep their own whole state either way.
  std::string optimizer_state = "sharded";
  [[nodiscard]] bool sharded() const noexcept { return optimizer_state == "sharded"; }
};

struct TrainConfig {
  ModelConfig model;
  ScheduleConfig schedule;     ///< total_steps follows `steps`
  optimizer::AdamWHyper adam;
  DilocoConfig diloco;
  DistConfig dist;
  std::string data = "build/data/demo";  ///< directory or glob of train_*/val_* shards
  std::string out = "runs/tiny";         ///< run directory: checkpoints, log.jsonl
  std::int64_t steps = 1000;
  std::int64_t eval_every = 100;         ///< 0: only at the end
  int eval_batches = 8;
  std::int64_t ckpt_every = 0;           ///< 0: only at the end (and on SIGTERM/SIGINT)
  int keep = 3;                          ///< committed checkpoints kept
  std::uint64_t seed = 1337;             ///< init and data order
  std::string backend = "auto";          ///< auto | cpu | cuda
  std::int64_t log_every = 1;
  int threads = 0;                       ///< OpenMP threads for the CPU backend; 0 = all

  /// Checks every field; throws ght::logic_error naming the section.key and the value.
  void validate() const;
  [[nodiscard]] nlohmann::ordered_json to_json() const;
  /// Inverse of to_json (checkpoints store the resolved config).
  static TrainConfig from_json(const nlohmann::json& j);
};

/**
 * @brief Resolve a run configuration.
 * @param preset model preset name, used when neither the file nor an override sets model.preset
 * @param toml_path optional TOML file (empty: none)
 * @param overrides "section.key=value" items; the value is parsed as a TOML value, and a bare
 *        word is taken as a string
 * @throws ght::logic_error / ght::io_error naming the file, key or override
 */
TrainConfig resolve_train_config(const std::string& preset, const std::string& toml_path,
                                 const std::vector<std::string>& overrides);

/**
 * @brief The dotted key path of the first difference between two configs (e.g. a checkpoint's
 *        stored config and the one requested for a resume), or "" when they are equal.
 *
 * Objects are compared key by key in a's order, then keys only b has; arrays by index
 * ("a.b[2]"); numbers by value (1 and 1.0 are equal). Example: "train.steps".
 */
[[nodiscard]] std::string first_difference(const nlohmann::json& a, const nlohmann::json& b);

/// first_difference() with both values, for a resume error:
/// "schedule.lr: checkpoint has 0.002, this run has 0.001"; "" when equal.
[[nodiscard]] std::string describe_difference(const nlohmann::json& saved,
                                              const nlohmann::json& requested);

}  // namespace ght::trainer
