#pragma once
/**
 * @file model_cuda.hpp
 * @brief The Qwen3-MoE decoder on the CUDA backend: bf16 weights in HBM, in the flat order and
 * with the Hugging Face names of the CPU model (trainer/model.hpp), gradients in a flat device
 * buffer mirroring them (fp32 or bf16), forward / backward / logits built from kernels/cuda.
 *
 * Semantics are those of MoEModel (same Loss fields, same formula
 * total = ce + aux_coef·Σ_l aux_l + z_coef·Σ_l z_l, same accumulate-on-backward contract), with
 * bf16 storage and fp32 math/accumulation, so results agree with the fp32 CPU model to bf16
 * tolerance, not bit for bit.
 *
 * Layout choices (why):
 *  - q, k, v projections are contiguous in the flat array, so they run as ONE fused GEMM
 *    ((H+2·KV)·D, d) and so do their weight gradients;
 *  - an expert's gate and up projections are contiguous, so gate_up is one grouped GEMM;
 *  - the permuted expert input (N·K, d) is not kept for backward: it is gathered again from the
 *    kept norm output (cheap, saves N·K·d·2 bytes per layer);
 *  - with `recompute` a layer keeps only its input stream; its forward runs again in backward
 *    into one set of buffers shared by every recomputed layer.
 *
 * Streams: all work runs on one compute stream (stream()). Hooks let a trainer gate each unit's
 * forward on the optimizer's events and act on each unit's gradients as soon as they are final.
 * Units: 0 = embedding, 1 + l = layer l, L + 1 = final norm (and the untied lm_head).
 *
 * Errors: every launch is checked; a failure is rethrown with the op that was running (e.g.
 * "layer 3: expert down_proj grouped GEMM (backward)") and the model's device-memory statistics.
 * Kernel faults surface asynchronously; CudaModelOptions::sync_each_op (or CUDA_LAUNCH_BLOCKING=1)
 * pins them to their op.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "alloc/tiered.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/expert_gemm.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "trainer/model.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {

/// How a backward writes the gradient buffer. `add`: grads += this micro-batch's gradient (the
/// contract of backward()). `assign`: grads = this micro-batch's gradient, whatever the buffer
/// held (garbage and NaN included), the same values as zero_grad() then `add` (up to the sign of
/// a zero) without the memset, and without the weight-gradient GEMMs reading their accumulators:
/// the first micro-batch of a step. Only the few small tensors that kernels accumulate into with
/// atomics (the norms, the routers, an untied embedding) are cleared first, by the model.
enum class GradWrite { add, assign };

struct CudaModelOptions {
  /// Where every device byte (weights, gradients, activations, scratch) comes from: HBM of this
  /// allocator, never spilled. Null: alloc::make_default_tiered_allocator().
  std::shared_ptr<alloc::tiered_allocator> allocator;
  optimizer::GradType grad_type = optimizer::GradType::fp32;  ///< gradient buffer element type
  /// Expert GEMM implementation: CUTLASS's grouped GEMM when built in (sizes on the device, no
  /// host sync), else cublaslt_streams (19% faster than the serial loop on bench-h200,
  /// bench/results/2026-11-30-h200-expert-streams.md). The cuBLASLt ones need the expert offsets
  /// on the host: the model downloads them once per layer per forward (one stream sync) and
  /// reuses them in backward.
  kernels::cuda::GroupedGemmImpl expert_impl = kernels::cuda::default_grouped_gemm_impl();
  kernels::cuda::AttentionImpl attention_impl = kernels::cuda::AttentionImpl::automatic;
  /// Fused kernels (GHT_FUSED_KERNELS): the router, its top-k and the permutation (plan and
  /// gather) in one call (kernels/cuda/router.hpp: router_route_forward), and the q and k
  /// RMSNorm + RoPE of a layer in one launch each way. false runs the separate kernels; the
  /// results are bit-identical either way.
  bool fused_kernels = true;
  /// Rows per LM-head/cross-entropy chunk; 0 = default_ce_chunk_rows (trainer/regions.hpp: the
  /// whole micro-batch while its bf16 logits fit 2 GiB, or GHT_LM_HEAD_ROWS), as the plan counts.
  std::int64_t ce_chunk_rows = 0;
  /// Per layer: recompute its forward in backward (keeps only the layer input). Empty = none.
  std::vector<bool> recompute;
  /// Synchronise after every op so that an asynchronous kernel fault names its op (slow).
  bool sync_each_op = false;
  /// How each micro-batch's tokens and targets go up and its loss slot comes back
  /// (GHT_INPUT_COPY): `sm` copies through a pinned, GPU-mapped host ring with a small kernel
  /// (kernels/cuda/sm_copy.hpp), so these transfers never queue behind the optimizer's DMA copies
  /// in the copy engines; `engine` uses cudaMemcpyAsync; `automatic` is sm where the host
  /// buffers are GPU-mapped.
  enum class InputCopy { automatic, sm, engine } input_copy = InputCopy::automatic;
  /**
   * CUDA graphs for forward_backward(_async): after the token upload, the whole micro-batch
   * (forward, LM head, backward) is captured once per (B, T, weights, gradients, loss scale,
   * activation buffers) and replayed after that; the first micro-batch of each key runs eagerly
   * (it sizes the scratch buffers and plans the capture then finds). The two most recent keys
   * keep their graphs (the delayed update alternates two weight/gradient pairs). Used only where
   * it is safe: no op hook (tracing), no sync_each_op, device-side expert offsets (cutlass,
   * custom), and hooks either unset or set_hooks_quiet()'s predicate true; otherwise the call
   * runs eagerly. Results are bit-identical either way. `ght train` sets it from
   * GHT_CUDA_GRAPHS (trainer/cuda/graph_choice.hpp).
   */
  bool cuda_graphs = false;
  /// A capture that fails (a library call that cannot be captured, say): false throws its
  /// error; true warns once, turns graphs off for the model's lifetime (cuda_graphs_off()) and
  /// runs that micro-batch eagerly (nothing of the failed capture ran). GHT_CUDA_GRAPHS=auto.
  bool cuda_graphs_fall_back = false;
  /// The experts' forward GEMMs in block-scaled FP8 (GHT_FP8=experts, trainer/fp8_experts.hpp):
  /// the weights are quantised at the first forward after weights_changed() (or a load, init or
  /// swap_buffers), the activations before each GEMM; the backward stays bf16. Needs
  /// kernels::cuda::fp8_gemm_available(): the constructor throws ght::config_error with the
  /// reason otherwise.
  bool fp8_experts = false;
};

/// Device bytes the model holds, by class.
struct CudaModelMemory {
  std::size_t weights = 0, grads = 0, activations = 0, workspace = 0;
  [[nodiscard]] std::size_t total() const { return weights + grads + activations + workspace; }
};

/// The tensor list of MoEModel (same names, shapes, offsets and decay flags) without
/// allocating a CPU model. @throws ght::logic_error when cfg is invalid
[[nodiscard]] std::vector<NamedTensor> model_tensor_list(const ModelConfig& cfg);

/**
 * @brief The values MoEModel<float>::init(seed) gives every tensor, produced tensor by tensor
 * (in parallel; the generator is counter-based, so any tensor can start without the others).
 * @param fn called once per tensor, in flat order, with its index and its fp32 values
 */
void init_params_host(const std::vector<NamedTensor>& tensors, std::uint64_t seed,
                      const std::function<void(std::size_t, std::span<const float>)>& fn);

class CudaMoEModel {
 public:
  /// Callbacks run on the calling thread while work is being enqueued (see file comment).
  struct Hooks {
    /// Before the first op that reads the unit's weights in a forward (also in logits()).
    std::function<void(int unit)> before_unit_forward;
    /// After the last op that writes the unit's gradients in a backward has been enqueued.
    std::function<void(int unit)> after_unit_backward;
  };

  /// Allocates weights and gradients (zeroed) on the current device.
  /// @throws ght::logic_error for an invalid config, ght::out_of_memory when HBM is short
  explicit CudaMoEModel(ModelConfig cfg, CudaModelOptions opts = {});
  ~CudaMoEModel();
  CudaMoEModel(const CudaMoEModel&) = delete;
  CudaMoEModel& operator=(const CudaMoEModel&) = delete;

  [[nodiscard]] const ModelConfig& config() const;
  [[nodiscard]] const CudaModelOptions& options() const;
  /// The attention implementation the last forward ran (`automatic` before the first forward).
  [[nodiscard]] kernels::cuda::AttentionImpl attention_used() const;
  [[nodiscard]] const std::vector<NamedTensor>& tensors() const;
  /// @throws ght::logic_error naming `name` when no such tensor exists
  [[nodiscard]] const NamedTensor& tensor(std::string_view name) const;
  [[nodiscard]] std::size_t num_params() const;
  [[nodiscard]] cudaStream_t stream() const;

  /// (num_params) bf16 weights in HBM, flat order.
  [[nodiscard]] __nv_bfloat16* weights();
  /// (num_params) gradients in HBM, element type grad_type().
  [[nodiscard]] void* grads();
  [[nodiscard]] optimizer::GradType grad_type() const;
  /**
   * @brief Compute with `weights` and accumulate into `grads` from now on; returns the pair used
   * so far. Both are HBM buffers of the caller's, of weights()' and grads()' sizes and types, and
   * must outlive their use. The caller orders the switch against work queued on stream() (the
   * trainer's delayed update alternates two pairs, trainer/cuda/train_cuda.cpp).
   */
  std::pair<__nv_bfloat16*, void*> swap_buffers(__nv_bfloat16* weights, void* grads);

  /// Number of units (layers + 2) and the flat element range [first, second) of one.
  [[nodiscard]] int num_units() const;
  [[nodiscard]] std::pair<std::size_t, std::size_t> unit_range(int unit) const;
  void set_hooks(Hooks hooks);
  /// With CudaModelOptions::cuda_graphs and hooks set: `quiet` returns true when neither hook
  /// would act in the coming forward_backward, which may then run as a CUDA graph (the hooks are
  /// then not called). Unset: never while hooks are set.
  void set_hooks_quiet(std::function<bool()> quiet);
  /// Called before each op is enqueued with its label (e.g. "o_proj") and layer (-1: none), so
  /// that a kernel tracer (kernel_trace.hpp) attributes the op's GPU work. Empty: no call.
  void set_op_hook(std::function<void(const char* op, int layer)> hook);

  /// MoEModel<float>::init(seed)'s values, rounded to bf16; zeroes the gradients.
  void init(std::uint64_t seed);
  /// Weights from host fp32 (rounded to nearest even), e.g. MoEModel<float>::params().
  /// Synchronous. @throws ght::logic_error unless host.size() == num_params()
  void load_weights(std::span<const float> host);
  /// One slice [offset, offset + host.size()) of the flat weights. Synchronous.
  void load_weights(std::size_t offset, std::span<const float> host);
  /// Weights widened to fp32 into host (size num_params()). Synchronous.
  void store_weights(std::span<float> host) const;
  /// Gradients as fp32 into host (size num_params()). Synchronous.
  void store_grads(std::span<float> host) const;
  /// Gradients of [offset, offset + host.size()) as fp32. Synchronous.
  void store_grads(std::size_t offset, std::span<float> host) const;

  /// Zero the gradients (asynchronous on stream()).
  void zero_grad();
  /// The weights in weights() changed other than through this class (an optimizer update, a
  /// gather): with CudaModelOptions::fp8_experts the next forward quantises them again. Cheap; a
  /// no-op otherwise.
  void weights_changed();

  /**
   * @brief Forward pass; keeps the activations backward() needs. Waits for the result.
   * @param tokens, targets (B, T) host arrays (ids in [0, vocab); targets may be kIgnoreIndex)
   * @throws ght::logic_error for an out-of-range id or a non-positive B or T
   */
  Loss forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T);
  /// Backward of the last forward(): grads += loss_scale·d(total)/d(params). The LM head's
  /// logits are computed again (forward_backward() avoids that). Asynchronous.
  void backward(float loss_scale = 1.0f);
  /// forward() then backward(loss_scale) with the LM head and cross-entropy done once.
  Loss forward_backward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                        float loss_scale);

  /// Asynchronous versions for the training loop: the loss lands in `slot` (0 <= slot < 64) and
  /// is read by collect_loss(slot), which waits only for that copy.
  void forward_async(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                     int slot);
  /// `forward_end` (optional, a timing event of the caller's): recorded on stream() after the
  /// last layer's forward and the final unit's before_unit_forward hook, before the final norm
  /// and the LM head, in eager runs and in graph replays alike (there an event record node).
  /// `write`: add to the gradients (the default) or assign them (GradWrite).
  void forward_backward_async(const std::int32_t* tokens, const std::int32_t* targets, int B,
                              int T, float loss_scale, int slot, cudaEvent_t forward_end = nullptr,
                              GradWrite write = GradWrite::add);
  [[nodiscard]] Loss collect_loss(int slot);

  /**
   * @brief fp32 logits (no loss). Reuses the activation buffers, so a following backward()
   * needs a new forward() first. Synchronous.
   * @param out (B, V) when last_only, else (B, T, V)
   */
  void logits(float* out, const std::int32_t* tokens, int B, int T, bool last_only = true);

  /// Routing of the last forward in `layer`: (B·T, top_k) expert ids (synchronous copy).
  [[nodiscard]] std::vector<std::int32_t> topk_indices(int layer) const;

  /// Micro-batches that ran as a CUDA graph launch (captured or replayed) so far.
  [[nodiscard]] std::int64_t cuda_graph_launches() const;
  /// Graphs captured (and instantiated) so far: one per key, again only after it was evicted.
  [[nodiscard]] std::int64_t cuda_graph_captures() const;
  /// Empty, or why graphs are off after a failed capture (CudaModelOptions::cuda_graphs_fall_back).
  [[nodiscard]] const std::string& cuda_graphs_off() const;

  [[nodiscard]] CudaModelMemory memory() const;
  /// One line: the model's device bytes by class and the device's free/total memory.
  [[nodiscard]] std::string memory_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ght::trainer
