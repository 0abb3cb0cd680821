#pragma once
/**
 * @file model.hpp
 * @brief The Qwen3-MoE decoder on the CPU backend: parameters with Hugging Face names, forward,
 * backward and logits.
 *
 * Architecture (HF Qwen3MoeForCausalLM, every layer MoE):
 *   h = embed(tokens)
 *   per layer: a = attn(rmsnorm(h; input_layernorm)); h += a
 *              m = moe(rmsnorm(h; post_attention_layernorm)); h += m
 *   logits = rmsnorm(h; norm)·W^T, W = lm_head.weight, or embed_tokens.weight when tied
 * attn: q/k/v/o projections, QK-RMSNorm per head, RoPE (rotate_half), causal GQA softmax.
 * moe:  router softmax (fp32), top-k, optional renormalisation, SwiGLU experts, weighted sum.
 *
 * Loss (returned by forward, differentiated by backward):
 *   total = ce + aux_loss_coef · sum_layers(aux_l) + z_loss_coef · sum_layers(z_l)
 * where ce is the mean token cross-entropy (targets == kIgnoreIndex (−100) skipped), aux_l is
 * HF's load_balancing_loss_func applied to layer l alone (E·sum_e f_e·P_e, uniform = top_k) and
 * z_l = mean_t logsumexp(router_logits_t)². Note: HF instead concatenates the router logits of
 * all layers and computes ONE aux over L·N rows; for a single layer the two are identical, for
 * several layers HF's value is not the sum of per-layer values (it pools counts and probabilities
 * across layers). We use the per-layer sum (as Megatron-LM and Switch do); `Loss::aux` reports
 * that sum, so HF's number for L layers is not comparable beyond L = 1.
 *
 * Each forward() is one micro-batch: ce is its token mean and aux/z are over its B·T tokens
 * (ignored targets still route, so they count in aux and z). With gradient accumulation call
 * backward(1/accum) per micro-batch so grads() hold the mean over micro-batches.
 *
 * Parameters live in one flat array (fp32 for MoEModel<float>), one contiguous slice per tensor,
 * in the order listed by tensors(); grads() mirrors it element for element.
 */
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/lm_head_ce.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {

/// Targets equal to this are skipped by the cross-entropy (HF / PyTorch convention).
inline constexpr std::int32_t kIgnoreIndex = kernels::cpu::kIgnoreIndex;

/// One parameter tensor, a slice [offset, offset + numel) of the flat parameter array.
struct NamedTensor {
  std::string name;              ///< exact Hugging Face name, e.g. "model.layers.0.mlp.gate.weight"
  std::vector<std::int64_t> shape;  ///< HF shape, e.g. (out, in) for projections
  std::size_t offset = 0;        ///< elements from the start of params()
  std::size_t numel = 0;
  bool decay = true;             ///< false for norm weights (no weight decay)
};

/// Losses of one forward pass (see the file comment for the formula of `total`).
struct Loss {
  double ce = 0;     ///< mean cross-entropy over non-ignored targets (nats/token)
  double aux = 0;    ///< sum over layers of the per-layer load-balance loss
  double z = 0;      ///< sum over layers of the per-layer router z-loss
  double total = 0;  ///< ce + aux_loss_coef·aux + z_loss_coef·z
  std::int64_t tokens = 0;  ///< targets counted by ce (not kIgnoreIndex)
};

/// Behaviour that is not part of the HF config.
struct ModelOptions {
  /// With doc_ids, restart position ids at 0 at each document start (attention is masked to the
  /// document either way). HF uses plain 0..T-1 positions unless position_ids are passed.
  bool reset_positions_at_doc = false;
  std::int64_t ce_chunk_rows = 256;  ///< rows per LM-head/cross-entropy chunk
};

/// Bytes of host memory available for new allocations (MemAvailable of /proc/meminfo, else free
/// physical pages); 0 when unknown.
[[nodiscard]] std::uint64_t host_available_bytes();

/**
 * @brief Refuse an allocation that cannot fit, before std::bad_alloc (or the OOM killer) would.
 * @param what  what is being allocated, e.g. "CPU model 'seed-21b': parameters and gradients"
 * @param bytes bytes it needs
 * @param available bytes available (host_available_bytes()); 0 = unknown, no check
 * @throws ght::out_of_memory naming `what`, the bytes asked and the bytes available
 */
void check_host_fits(const std::string& what, std::uint64_t bytes, std::uint64_t available);

namespace detail {
template <class T>
struct Workspace;  // activations kept for the backward (model.cpp)
}  // namespace detail

/**
 * @brief Qwen3-MoE model on the CPU backend, scalar type Real (float: the trainer; double: tests).
 *
 * Typical use:
 *   MoEModel<float> m(cfg); m.init(seed);
 *   m.zero_grad();
 *   for (micro-batch) { auto l = m.forward(tok, tgt, B, T); m.backward(1.0f / accum); }
 *   optimizer.step(m.params(), m.grads());
 */
template <class Real>
class MoEModel {
 public:
  /// @throws ght::logic_error when cfg.validate() fails
  explicit MoEModel(ModelConfig cfg, ModelOptions opts = {});
  ~MoEModel();
  MoEModel(MoEModel&&) noexcept;
  MoEModel& operator=(MoEModel&&) noexcept;
  MoEModel(const MoEModel&) = delete;
  MoEModel& operator=(const MoEModel&) = delete;

  [[nodiscard]] const ModelConfig& config() const { return cfg_; }
  [[nodiscard]] const ModelOptions& options() const { return opts_; }

  /// HF-like init, deterministic in seed: N(0, 0.02) for every matrix (embeddings, projections,
  /// router, experts, untied lm_head), ones for norm weights. Also zeroes the gradients.
  void init(std::uint64_t seed);

  /// The flat parameter / gradient arrays (same layout).
  [[nodiscard]] std::span<Real> params() { return params_; }
  [[nodiscard]] std::span<const Real> params() const { return params_; }
  [[nodiscard]] std::span<Real> grads() { return grads_; }
  [[nodiscard]] std::span<const Real> grads() const { return grads_; }
  /// Every parameter tensor in flat-array order (HF module order).
  [[nodiscard]] const std::vector<NamedTensor>& tensors() const { return tensors_; }
  /// @throws ght::logic_error naming `name` when no such tensor exists
  [[nodiscard]] const NamedTensor& tensor(std::string_view name) const;
  [[nodiscard]] std::span<Real> param(std::string_view name);
  [[nodiscard]] std::span<Real> grad(std::string_view name);

  /**
   * @brief Forward pass; keeps the activations needed by backward().
   * @param tokens (B, T) int32 ids in [0, vocab)
   * @param targets (B, T) ids in [0, vocab) or kIgnoreIndex (−100)
   * @param doc_ids (B, T) or nullptr: a token attends only to earlier tokens
   *        with the same doc id (packed documents)
   * @throws ght::logic_error for an out-of-range id or a non-positive B or T
   */
  Loss forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
               const std::int32_t* doc_ids = nullptr);

  /**
   * @brief Backward of the last forward(): grads() += loss_scale · d(total)/d(params).
   * Accumulates, so micro-batches add up; clear with zero_grad().
   * @throws ght::logic_error without a preceding forward()
   */
  void backward(Real loss_scale = Real(1));

  void zero_grad();

  /**
   * @brief Logits in fp32 (no loss). Reuses the activation buffers, so a following backward()
   * needs a new forward() first.
   * @param out (B, V) when last_only (the last position of each row), else (B, T, V)
   */
  void logits(float* out, const std::int32_t* tokens, int B, int T, bool last_only = true,
              const std::int32_t* doc_ids = nullptr);

  /// Routing of the last forward()/logits() in `layer`: (B·T, top_k) expert ids, descending
  /// router probability (for expert-load statistics). Empty before any forward.
  [[nodiscard]] std::span<const std::int32_t> topk_indices(int layer) const;

 private:
  ModelConfig cfg_;
  ModelOptions opts_;
  std::vector<NamedTensor> tensors_;
  std::vector<Real> params_;
  std::vector<Real> grads_;
  std::unique_ptr<detail::Workspace<Real>> ws_;
};

extern template class MoEModel<float>;
extern template class MoEModel<double>;

}  // namespace ght::trainer
