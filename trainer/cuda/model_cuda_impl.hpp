#pragma once
// Internal to the CUDA MoE model (model_cuda.hpp): CudaMoEModel::Impl, its buffers and layer
// types, shared by model_cuda.cpp (tensor list, initialisation, the public interface),
// model_cuda_buffers.cpp (set-up, memory, activation buffers, inputs), model_cuda_forward.cpp
// (the GEMM helpers and the forward), model_cuda_backward.cpp (the LM head's loss and gradient,
// the backward) and model_cuda_graphs.cpp (loss slots, a micro-batch's compute, CUDA graphs).
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/regions.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <numbers>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "alloc/block.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/expert_gemm_fp8.hpp"
#include "kernels/cuda/fp8_quant.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/lm_head_ce.hpp"
#include "kernels/cuda/permute.hpp"
#include "kernels/cuda/qk_norm_rope.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda/router.hpp"
#include "kernels/cuda/sm_copy.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "optimizer/bf16.hpp"
#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "tier/log.hpp"

namespace ght::trainer {

namespace kc = ght::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace cuda_model {

enum MemClass { kWeights = 0, kGrads = 1, kActs = 2, kWork = 3 };

struct LayerOff {
  std::size_t wq, wo, q_norm, k_norm, router, expert0, ln1, ln2, begin, end;
};

// Device pointers of one layer's saved activations.
struct Acts {
  bf16 *resid = nullptr, *ln1 = nullptr, *qkv = nullptr, *qk = nullptr, *att = nullptr,
       *h_mid = nullptr, *ln2 = nullptr, *gu = nullptr, *act = nullptr, *yp = nullptr;
  float *ln1_rstd = nullptr, *q_rstd = nullptr, *k_rstd = nullptr, *lse = nullptr,
        *ln2_rstd = nullptr, *logits = nullptr, *probs = nullptr, *topk_w = nullptr;
  std::int32_t *topk_idx = nullptr, *offsets = nullptr, *src_token = nullptr, *dst_row = nullptr;
  std::vector<std::int32_t> host_offsets;  // (E+1) when the expert GEMMs need them on the host
};

// Loss slot layout (device and pinned host; kCudaLossSlots of cuda_loss_slot_bytes(L) each):
// ce (f32), valid (i32), then L router losses.

template <class T>
T* as(void* p) {
  return static_cast<T*>(p);
}

}  // namespace cuda_model

using namespace cuda_model;  // NOLINT(google-build-using-namespace): this header's own types

struct CudaMoEModel::Impl {
  ModelConfig cfg;
  CudaModelOptions opts;
  kc::AttentionImpl attention_ran = kc::AttentionImpl::automatic;  // what the last forward ran
  std::vector<NamedTensor> tensors;
  std::vector<LayerOff> lo;
  std::size_t embed = 0, final_norm = 0, head = 0, n = 0;
  std::int64_t d = 0, H = 0, KV = 0, D = 0, E = 0, K = 0, F = 0, V = 0, L = 0;
  std::int64_t QKV = 0, QK = 0, HD = 0;
  cudaStream_t stream = nullptr;

  // Device memory from the run's tiered allocator (HBM, no spill), tracked by class for reports.
  std::shared_ptr<alloc::tiered_allocator> allocator;
  struct Block {
    alloc::unique_block mem;
    MemClass cls;
  };
  std::vector<Block> blocks;
  std::size_t bytes_by_class[4] = {0, 0, 0, 0};

  bf16* W = nullptr;
  void* G = nullptr;

  std::int64_t cap_tokens = 0;
  std::vector<Acts> acts;
  Acts rc;  // buffers shared by every recomputed layer
  bool any_recompute = false;
  bf16 *resid_final = nullptr, *lnf = nullptr;
  float* lnf_rstd = nullptr;
  bf16 *tmp_d = nullptr, *dresid = nullptr, *dnorm = nullptr, *datt = nullptr, *dqkv = nullptr,
       *dqk = nullptr, *big = nullptr, *dgu = nullptr, *dact = nullptr;
  float* dtopk_w = nullptr;
  std::int32_t *tokens = nullptr, *targets = nullptr, *pos = nullptr;
  void* ce_ws = nullptr;
  std::size_t ce_ws_bytes = 0;
  std::int64_t ce_chunk = 0;
  kc::RouterLossesDevice* scratch_losses = nullptr;  // (L) for logits() and recompute
  float* logits_buf = nullptr;
  std::int64_t logits_rows = 0;

  // FP8 experts (CudaModelOptions::fp8_experts): every layer's expert weights as e4m3 codes with
  // their 128 x 128 block scales (gate/up, then down, per expert, layer after layer), and one
  // activation buffer of 1 x 128-tile codes and scales that both expert GEMMs of a layer use.
  __nv_fp8_e4m3* fp8_w = nullptr;
  float* fp8_w_scales = nullptr;
  __nv_fp8_e4m3* fp8_act = nullptr;
  float* fp8_act_scales = nullptr;
  bool fp8_stale = true;  // the weights changed since their FP8 copies were made

  std::size_t slot_bytes = 0;
  char* slot_dev = nullptr;
  alloc::unique_block slot_host;  // host (pinned on PCIe): loss read-back
  char* slot_host_dev = nullptr;  // its GPU-mapped alias (sm copies); null: copy engines
  cudaEvent_t slot_event[kCudaLossSlots] = {};
  // sm copies: the host ring the micro-batches' tokens and targets go up from, kInputSlots
  // slots of (tokens, targets) for cap_tokens tokens each; a slot is rewritten once the copy
  // that read it last has run (in_event).
  static constexpr int kInputSlots = 8;
  bool sm_copies = false;
  alloc::unique_block in_host;
  char* in_host_dev = nullptr;
  cudaEvent_t in_event[kInputSlots] = {};
  int in_next = 0;

  int B = 0, T = 0;
  bool has_forward = false;
  Hooks hooks;
  std::function<bool()> hooks_quiet;  // see set_hooks_quiet
  bool capturing = false;  // hooks are not called while a CUDA graph is captured

  // CUDA graph of one micro-batch (opts.cuda_graphs): what it was captured for, and the device
  // loss slot it writes (copied to the caller's slot after each launch).
  struct GraphKey {
    int B = 0, T = 0;
    const void* W = nullptr;
    const void* G = nullptr;
    float loss_scale = 0;
    std::int64_t buffers = -1;  // activation buffer generation (ensure_capacity reallocations)
    GradWrite write = GradWrite::add;
    int sm_budget = 0;  // kernels::cuda::stream_sm_budget: the GEMMs' plans are captured with it
    bool fp8_requant = false;  // the micro-batch quantises the FP8 expert weights first
    bool operator==(const GraphKey&) const = default;
  };
  std::int64_t buffer_generation = 0;
  // One graph per key, the newest last. Eight: the delayed update alternates two weight/gradient
  // pairs (a partial delay, GHT_OPT_DELAY_MICRO, switches the weights within a step: three
  // weight/gradient/write keys per step, six over the two steps of its cycle), a step's first
  // micro-batch assigns the gradients and the others add to them, and recapturing at every step
  // would cost more than the launches save.
  static constexpr std::size_t kMaxGraphs = 8;
  struct Graph {
    GraphKey key;
    cudaGraph_t graph = nullptr;  // kept: its forward-end node names the node of exec
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t fwd_end = nullptr;  // the event record node of mark_forward_end()
  };
  std::vector<Graph> graphs;
  std::vector<GraphKey> warm_keys;  // ran eagerly once: a capture will find their buffers sized
  char* graph_slot = nullptr;
  std::int64_t graph_launches = 0, graph_captures = 0;
  // The caller's forward-end event for the forward_backward running now (null: none), and the
  // event the capture records in its place (each launch points the node at the caller's).
  cudaEvent_t fwd_end_event = nullptr;
  // How the forward_backward running now writes the gradients (GradWrite).
  GradWrite grad_write = GradWrite::add;
  [[nodiscard]] float grad_beta() const { return grad_write == GradWrite::assign ? 0.0f : 1.0f; }
  cudaEvent_t graph_fwd_placeholder = nullptr;
  std::string graphs_off;  // why a failed capture turned graphs off (cuda_graphs_fall_back)
  std::function<void(const char*, int)> op_hook;  // kernel tracing: told of every op
  const char* op_name = "idle";
  int op_layer = -1;

  ~Impl() { release(); }

  void release() noexcept;

  // ---- memory ----
  void* alloc(std::size_t bytes, MemClass cls, const char* what);

  void free_class(MemClass cls);

  std::string memory_report() const;

  // ---- op tracking ----
  void op(const char* name, int layer = -1);

  std::string context() const;

  template <class Fn>
  void guarded(Fn&& fn) {
    try {
      fn();
      if (opts.sync_each_op) GHT_CUDA_TRY(cudaStreamSynchronize(stream));
    } catch (const ght::out_of_memory& e) {
      throw ght::out_of_memory(context() + e.what());
    } catch (const ght::cuda_error& e) {
      throw ght::cuda_error(context() + e.what() + "; " + memory_report());
    } catch (const ght::config_error&) {
      throw;
    } catch (const ght::logic_error& e) {
      throw ght::logic_error(context() + e.what());
    }
  }

  // ---- set-up ----
  void setup(ModelConfig c, CudaModelOptions o);

  void ensure_capacity(std::int64_t N);

  // ---- inputs ----
  void upload_inputs(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_);

  [[nodiscard]] std::int64_t tokens_n() const { return static_cast<std::int64_t>(B) * T; }

  void hook_forward(int unit) {
    if (hooks.before_unit_forward && !capturing) hooks.before_unit_forward(unit);
    if (unit == cfg.layers + 1) mark_forward_end();
  }
  void mark_forward_end();
  void hook_backward(int unit) {
    if (hooks.after_unit_backward && !capturing) hooks.after_unit_backward(unit);
  }

  // ---- GEMM helpers ----
  void gemm(std::int64_t m, std::int64_t n_, std::int64_t k, const bf16* a, bool ta, const bf16* b,
            bool tb, void* c, kc::DType ct, float beta, std::int64_t lda = 0);

  kc::GroupOffsets offsets_of(const Acts& a) const;

  void grouped_m(const Acts& a, std::int64_t n_, std::int64_t k, const bf16* A, const bf16* B_,
                 std::int64_t ldb, bool tb, bf16* C);

  void grouped_k(const Acts& a, std::int64_t m, std::int64_t n_, const bf16* A, const bf16* B_,
                 void* C, kc::DType ct, std::int64_t ldc);

  // ---- FP8 experts (model_cuda_fp8.cpp) ----
  void fp8_setup();
  // Layer l's FP8 weight copies: gate/up and down codes and their block scales.
  struct Fp8LayerCopies {
    __nv_fp8_e4m3 *gate_up = nullptr, *down = nullptr;
    float *gate_up_scales = nullptr, *down_scales = nullptr;
  };
  [[nodiscard]] Fp8LayerCopies fp8_layer(int l) const;
  void fp8_quantize_weights(int l);
  // var-M in FP8: C[rows_e] = Â[rows_e]·B̂_e^T with Â the (R, k) codes and scales in fp8_act, which
  // the kernel before it wrote (the scatter of the permutation, or SwiGLU); B̂ is layer l's gate/up
  // (gate_up true: n = 2F, k = d) or down (n = d, k = F) copy.
  void fp8_grouped_m(int l, const Acts& a, bool gate_up, bf16* C);

  kc::AttentionShape att_shape() const;

  // ---- forward ----
  // quantize_weights: make layer l's FP8 expert weight copies first (FP8 experts only).
  void layer_forward(int l, Acts& a, kc::RouterLossesDevice* losses, bool combine, bool quantize_weights);

  void trunk(kc::RouterLossesDevice* losses);

  Acts& layer_acts(int l);

  // ---- backward ----
  template <class GT>
  GT* grad(std::size_t off) {
    return static_cast<GT*>(G) + off;
  }
  template <class GT>
  static constexpr kc::DType gdt() {
    return std::is_same_v<GT, float> ? kc::DType::f32 : kc::DType::bf16;
  }

  template <class GT>
  void backward_body(float loss_scale);

  template <class GT>
  void layer_backward(int l, Acts& a, float loss_scale);

  template <class GT>
  void head_forward_backward(float loss_scale, float* ce_loss, std::int32_t* valid);

  template <class GT>
  void clear_accumulated_grads();

  template <class GT>
  void head_and_body_backward(float loss_scale, float* ce_loss, std::int32_t* valid);

  // ---- loss slots ----
  char* slot_d(int s) { return slot_dev + static_cast<std::size_t>(s) * slot_bytes; }
  char* slot_h(int s) { return slot_host.as<char>() + static_cast<std::size_t>(s) * slot_bytes; }
  static void check_slot(int s) {
    GHT_EXPECTS(s >= 0 && s < kCudaLossSlots, "CudaMoEModel: loss slot " + std::to_string(s) +
                                              " outside [0, " + std::to_string(kCudaLossSlots) + ")");
  }

  void compute(char* sd, bool with_backward, float loss_scale);

  // ---- CUDA graphs ----
  [[nodiscard]] bool graph_usable() const;

  static void destroy(Graph& g) noexcept;

  void run_graph(float loss_scale);

  [[nodiscard]] cudaGraphNode_t forward_end_node(cudaGraph_t graph) const;

  Graph* capture(const GraphKey& key, float loss_scale);

  void run_forward(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_, int slot,
                   bool with_backward, float loss_scale, cudaEvent_t forward_end, GradWrite write);

  Loss collect(int slot);

  void run_backward(float loss_scale);
};

}  // namespace ght::trainer
