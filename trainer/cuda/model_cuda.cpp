// The CUDA backend of the MoE model (see model_cuda.hpp). Host code only: every op is a launcher
// from kernels/cuda, so this file is plain C++ (OpenMP for the host-side conversions).
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/detail/normal_rng.hpp"
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

// ---- the tensor list and the initialisation of MoEModel ------------------------------------

std::vector<NamedTensor> model_tensor_list(const ModelConfig& cfg) {
  cfg.validate();
  const std::int64_t d = cfg.d_model, D = cfg.head_dim, H = cfg.heads, KV = cfg.kv_heads,
                     F = cfg.expert_ffn, V = cfg.vocab;
  std::vector<NamedTensor> out;
  std::size_t off = 0;
  // Same order, shapes and decay flags as MoEModel's constructor (trainer/model.cpp); the GPU
  // test compares the two lists.
  auto add = [&](std::string name, std::vector<std::int64_t> shape, bool decay) {
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    out.push_back(NamedTensor{std::move(name), std::move(shape), off, n, decay});
    off += n;
  };
  add("model.embed_tokens.weight", {V, d}, true);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {H * D, d}, true);
    add(p + "self_attn.k_proj.weight", {KV * D, d}, true);
    add(p + "self_attn.v_proj.weight", {KV * D, d}, true);
    add(p + "self_attn.o_proj.weight", {d, H * D}, true);
    add(p + "self_attn.q_norm.weight", {D}, false);
    add(p + "self_attn.k_norm.weight", {D}, false);
    add(p + "mlp.gate.weight", {static_cast<std::int64_t>(cfg.experts), d}, true);
    for (int e = 0; e < cfg.experts; ++e) {
      const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
      add(pe + "gate_proj.weight", {F, d}, true);
      add(pe + "up_proj.weight", {F, d}, true);
      add(pe + "down_proj.weight", {d, F}, true);
    }
    add(p + "input_layernorm.weight", {d}, false);
    add(p + "post_attention_layernorm.weight", {d}, false);
  }
  add("model.norm.weight", {d}, false);
  if (!cfg.tied_embeddings) add("lm_head.weight", {V, d}, true);
  GHT_EXPECTS(static_cast<std::int64_t>(off) == cfg.total_params(),
              "model_tensor_list: layout (" + std::to_string(off) +
                  ") disagrees with ModelConfig::total_params (" +
                  std::to_string(cfg.total_params()) + ")");
  return out;
}

namespace {

// MoEModel's generator (model.cpp: splitmix64 + Box-Muller, one spare) is counter-based: draw k
// is mix(seed + (k+1)·golden). Sample j of the normal stream is the cosine (j even) or sine
// (j odd) half of pair j/2, built from draws 2·(j/2) and 2·(j/2)+1, unless an earlier pair
// rejected a zero uniform (probability 2^-53 per pair), which shifts every later draw; that case
// is detected and finished with the sequential generator.
using detail::kGolden;
using detail::mix64;
using detail::uniform_of;
// The sequential generator: model.cpp's, startable at any draw count.
using SeqNormal = detail::NormalRng;

// Fills out[i] = float(0.02·sample(first + i)); false when a rejection occurred in the range.
bool counter_normals(std::uint64_t seed, std::uint64_t first, float* out, std::size_t n) {
  bool ok = true;
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) reduction(&& : ok) if (n > (1u << 16))
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t j = first + static_cast<std::uint64_t>(i), p = j / 2;
    const double u1 = uniform_of(mix64(seed + (2 * p + 1) * kGolden));
    const double u2 = uniform_of(mix64(seed + (2 * p + 2) * kGolden));
    if (u1 <= 0.0) ok = false;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * std::numbers::pi * u2;
    const double x = (j % 2 == 0) ? r * std::cos(a) : r * std::sin(a);
    out[i] = static_cast<float>(0.02 * x);
  }
  return ok;
}

}  // namespace

void init_params_host(const std::vector<NamedTensor>& tensors, std::uint64_t seed,
                      const std::function<void(std::size_t, std::span<const float>)>& fn) {
  std::vector<float> buf;
  std::uint64_t sample = 0;  // normal samples drawn before this tensor
  std::unique_ptr<SeqNormal> seq;
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const NamedTensor& t = tensors[ti];
    buf.resize(t.numel);
    if (t.shape.size() == 1) {
      std::fill(buf.begin(), buf.end(), 1.0f);  // norm weights
    } else {
      if (!seq && !counter_normals(seed, sample, buf.data(), t.numel)) {
        // No rejection happened before this tensor, so the sequential state at its start is
        // known: every pair consumed two draws, and an odd start leaves a pending sine.
        const std::uint64_t pairs = (sample + 1) / 2;
        double spare = 0;
        if (sample % 2 == 1) {
          const std::uint64_t p = sample / 2;
          const double u1 = uniform_of(mix64(seed + (2 * p + 1) * kGolden));
          const double u2 = uniform_of(mix64(seed + (2 * p + 2) * kGolden));
          spare = std::sqrt(-2.0 * std::log(u1)) * std::sin(2.0 * std::numbers::pi * u2);
        }
        seq = std::make_unique<SeqNormal>(seed, 2 * pairs, sample % 2 == 1, spare);
      }
      if (seq) {
        for (std::size_t i = 0; i < t.numel; ++i) buf[i] = static_cast<float>(0.02 * seq->next());
      }
      sample += t.numel;
    }
    fn(ti, std::span<const float>(buf.data(), buf.size()));
  }
}

// ---- the model -----------------------------------------------------------------------------

namespace {

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

void parallel_to_bf16(const float* src, std::uint16_t* dst, std::size_t n) {
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (n > (1u << 16))
  for (std::int64_t i = 0; i < count; ++i) dst[i] = optimizer::float_to_bf16_bits(src[i]);
}

void parallel_from_bf16(const std::uint16_t* src, float* dst, std::size_t n) {
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (n > (1u << 16))
  for (std::int64_t i = 0; i < count; ++i) dst[i] = optimizer::bf16_bits_to_float(src[i]);
}

// Host <-> device copies go through bounded chunks so a 10B-parameter model never needs a
// second full-size host copy.
constexpr std::size_t kCopyChunk = std::size_t{1} << 25;  // elements

}  // namespace

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

  void release() noexcept {
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    for (Graph& g : graphs) destroy(g);
    graphs.clear();
    if (graph_fwd_placeholder != nullptr) (void)cudaEventDestroy(graph_fwd_placeholder);
    graph_fwd_placeholder = nullptr;
    blocks.clear();  // each block goes back to the allocator
    for (cudaEvent_t& e : slot_event) {
      if (e != nullptr) (void)cudaEventDestroy(e);
      e = nullptr;
    }
    for (cudaEvent_t& e : in_event) {
      if (e != nullptr) (void)cudaEventDestroy(e);
      e = nullptr;
    }
    slot_host.reset();
    in_host.reset();
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    stream = nullptr;
  }

  // ---- memory ----
  void* alloc(std::size_t bytes, MemClass cls, const char* what) {
    static constexpr TensorClass kClass[4] = {TensorClass::weight, TensorClass::grad,
                                              TensorClass::activation, TensorClass::other};
    bytes = std::max<std::size_t>(bytes, 256);
    // HBM only: kernels read these through device pointers. The typed out_of_memory from the
    // allocator names the tier budgets; the trainer adds what to raise.
    const alloc::AllocRequest req{kClass[cls], std::string("model.") + what, TierKind::hbm, false};
    blocks.push_back({alloc::unique_block(*allocator, bytes, req, stream), cls});
    bytes_by_class[cls] += bytes;
    return blocks.back().mem.get();
  }

  void free_class(MemClass cls) {
    // Stream-ordered frees: the next allocation on `stream` may reuse the bytes at once.
    std::vector<Block> keep;
    for (Block& b : blocks) {
      if (b.cls == cls) {
        bytes_by_class[cls] -= b.mem.bytes();
        b.mem.reset(stream);
      } else {
        keep.push_back(std::move(b));
      }
    }
    blocks = std::move(keep);
  }

  std::string memory_report() const {
    std::string s = "model device memory: weights " + config::format_bytes(bytes_by_class[kWeights]) +
                    ", grads " + config::format_bytes(bytes_by_class[kGrads]) + ", activations " +
                    config::format_bytes(bytes_by_class[kActs]) + ", workspace " +
                    config::format_bytes(bytes_by_class[kWork]);
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      s += "; device free " + config::format_bytes(free_b) + " of " + config::format_bytes(total_b);
    } else {
      (void)cudaGetLastError();
      s += "; device memory info unavailable (the context may be broken)";
    }
    return s;
  }

  // ---- op tracking ----
  void op(const char* name, int layer = -1) {
    // With sync_each_op an asynchronous fault is caught while the op that caused it is current.
    if (opts.sync_each_op) GHT_CUDA_TRY(cudaStreamSynchronize(stream));
    op_name = name;
    op_layer = layer;
    if (op_hook) op_hook(name, layer);
  }

  std::string context() const {
    std::string s = "CUDA model, op '";
    if (op_layer >= 0) s += "layer " + std::to_string(op_layer) + ": ";
    return s + op_name + "': ";
  }

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
  void setup(ModelConfig c, CudaModelOptions o) {
    cfg = std::move(c);
    opts = std::move(o);
    allocator = opts.allocator ? opts.allocator : alloc::make_default_tiered_allocator();
    tensors = model_tensor_list(cfg);
    d = cfg.d_model; H = cfg.heads; KV = cfg.kv_heads; D = cfg.head_dim; E = cfg.experts;
    K = cfg.top_k; F = cfg.expert_ffn; V = cfg.vocab; L = cfg.layers;
    HD = H * D;
    QK = (H + KV) * D;
    QKV = (H + 2 * KV) * D;
    GHT_EXPECTS(opts.recompute.empty() || static_cast<std::int64_t>(opts.recompute.size()) == L,
                "CudaMoEModel: recompute has " + std::to_string(opts.recompute.size()) +
                    " flags for " + std::to_string(L) + " layers");
    if (opts.recompute.empty()) opts.recompute.assign(static_cast<std::size_t>(L), false);
    any_recompute = std::any_of(opts.recompute.begin(), opts.recompute.end(), [](bool b) { return b; });
    GHT_EXPECTS(opts.ce_chunk_rows >= 0, "CudaMoEModel: ce_chunk_rows must be >= 0");

    // Offsets by name position: embed, then per layer 7 + 3E + 2 tensors, final norm, lm_head.
    std::size_t i = 0;
    embed = tensors[i++].offset;
    for (int l = 0; l < cfg.layers; ++l) {
      LayerOff x{};
      x.begin = tensors[i].offset;
      x.wq = tensors[i++].offset;
      i += 2;  // k_proj, v_proj (contiguous after q_proj: the fused qkv weight)
      x.wo = tensors[i++].offset;
      x.q_norm = tensors[i++].offset;
      x.k_norm = tensors[i++].offset;
      x.router = tensors[i++].offset;
      x.expert0 = tensors[i].offset;
      i += static_cast<std::size_t>(3 * E);
      x.ln1 = tensors[i++].offset;
      x.ln2 = tensors[i++].offset;
      x.end = x.ln2 + static_cast<std::size_t>(d);
      lo.push_back(x);
    }
    final_norm = tensors[i++].offset;
    head = cfg.tied_embeddings ? embed : tensors[i++].offset;
    n = static_cast<std::size_t>(cfg.total_params());

    // The greatest priority: where the optimizer's kernels (created at the lowest, optimizer/
    // adamw.cpp) and the model's wait for SMs at the same time, the GPU schedules the model's
    // blocks first, so an update running beside compute takes only the SMs compute leaves idle.
    int least = 0, greatest = 0;
    GHT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    GHT_CUDA_TRY(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    W = as<bf16>(alloc(n * sizeof(bf16), kWeights, "weights"));
    G = alloc(n * optimizer::grad_type_size(opts.grad_type), kGrads, "gradients");
    GHT_CUDA_TRY(cudaMemsetAsync(W, 0, n * sizeof(bf16), stream));
    GHT_CUDA_TRY(cudaMemsetAsync(G, 0, n * optimizer::grad_type_size(opts.grad_type), stream));

    slot_bytes = cuda_loss_slot_bytes(static_cast<int>(L));
    slot_dev = as<char>(alloc(slot_bytes * kCudaLossSlots, kWork, "loss slots"));
    slot_host = alloc::unique_block(*allocator, slot_bytes * kCudaLossSlots,
                                    {TensorClass::other, "model.loss_slots_host", TierKind::host, false});
    for (cudaEvent_t& e : slot_event) GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : in_event) GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    slot_host_dev = static_cast<char*>(kc::mapped_device_pointer(slot_host.get()));
    using IC = CudaModelOptions::InputCopy;
    if (opts.input_copy == IC::sm) {
      GHT_EXPECTS(slot_host_dev != nullptr,
                  "GHT_INPUT_COPY=sm: the host tier's memory is not GPU-mapped here (pageable over PCIe); use auto or engine");
    }
    sm_copies = opts.input_copy != IC::engine && slot_host_dev != nullptr;
    scratch_losses = as<kc::RouterLossesDevice>(
        alloc(sizeof(kc::RouterLossesDevice) * static_cast<std::size_t>(L), kWork, "router losses"));
    if (opts.cuda_graphs) {
      graph_slot = as<char>(alloc(slot_bytes, kWork, "CUDA graph loss slot"));
      GHT_CUDA_TRY(cudaEventCreateWithFlags(&graph_fwd_placeholder, cudaEventDisableTiming));
    }
    GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  // Activation and scratch buffers for N tokens (re-allocated only when N grows).
  void ensure_capacity(std::int64_t N) {
    if (N <= cap_tokens) return;
    free_class(kActs);
    const auto nk = static_cast<std::size_t>(N * K), nn = static_cast<std::size_t>(N);
    const auto sd = static_cast<std::size_t>(d);
    auto b16 = [&](std::size_t count, const char* what) { return as<bf16>(alloc(count * 2, kActs, what)); };
    auto f32 = [&](std::size_t count, const char* what) { return as<float>(alloc(count * 4, kActs, what)); };
    auto i32 = [&](std::size_t count, const char* what) {
      return as<std::int32_t>(alloc(count * 4, kActs, what));
    };
    auto fill = [&](Acts& a) {
      a.ln1 = b16(nn * sd, "ln1");
      a.ln1_rstd = f32(nn, "ln1 rstd");
      a.qkv = b16(nn * static_cast<std::size_t>(QKV), "qkv");
      a.qk = b16(nn * static_cast<std::size_t>(QK), "q/k after norm+rope");
      a.q_rstd = f32(nn * static_cast<std::size_t>(H), "q rstd");
      a.k_rstd = f32(nn * static_cast<std::size_t>(KV), "k rstd");
      a.att = b16(nn * static_cast<std::size_t>(HD), "attention output");
      a.lse = f32(nn * static_cast<std::size_t>(H), "attention lse");
      a.h_mid = b16(nn * sd, "h_mid");
      a.ln2 = b16(nn * sd, "ln2");
      a.ln2_rstd = f32(nn, "ln2 rstd");
      a.logits = f32(nn * static_cast<std::size_t>(E), "router logits");
      a.probs = f32(nn * static_cast<std::size_t>(E), "router probs");
      a.topk_w = f32(nk, "topk weights");
      a.topk_idx = i32(nk, "topk ids");
      a.offsets = i32(static_cast<std::size_t>(E) + 1, "expert offsets");
      a.src_token = i32(nk, "src_token");
      a.dst_row = i32(nk, "dst_row");
      a.gu = b16(nk * 2 * static_cast<std::size_t>(F), "expert gate_up");
      a.act = b16(nk * static_cast<std::size_t>(F), "expert act");
      a.yp = b16(nk * sd, "expert output");
    };
    acts.assign(static_cast<std::size_t>(L), Acts{});
    for (std::int64_t l = 0; l < L; ++l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      a.resid = b16(nn * sd, "layer input");
      if (!opts.recompute[static_cast<std::size_t>(l)]) fill(a);
    }
    rc = Acts{};
    if (any_recompute) fill(rc);
    resid_final = b16(nn * sd, "final stream");
    lnf = b16(nn * sd, "final norm output");
    lnf_rstd = f32(nn, "final norm rstd");
    tmp_d = b16(nn * sd, "tmp (N, d)");
    dresid = b16(nn * sd, "d stream");
    dnorm = b16(nn * sd, "d norm output");
    datt = b16(nn * static_cast<std::size_t>(HD), "d attention output");
    dqkv = b16(nn * static_cast<std::size_t>(QKV), "d qkv");
    dqk = b16(nn * static_cast<std::size_t>(QK), "d q/k");
    big = b16(nk * sd, "permuted rows (N*K, d)");
    dgu = b16(nk * 2 * static_cast<std::size_t>(F), "d gate_up");
    dact = b16(nk * static_cast<std::size_t>(F), "d act");
    dtopk_w = f32(nk, "d topk weights");
    tokens = i32(nn, "tokens");
    targets = i32(nn, "targets");
    pos = i32(nn, "positions");
    if (sm_copies) {
      for (cudaEvent_t e : in_event) GHT_CUDA_TRY(cudaEventSynchronize(e));  // the old ring is read no more
      in_host = alloc::unique_block(*allocator, static_cast<std::size_t>(kInputSlots) * 2 * nn * 4,
                                    {TensorClass::other, "model.input_ring_host", TierKind::host, false});
      in_host_dev = static_cast<char*>(kc::mapped_device_pointer(in_host.get()));
      GHT_EXPECTS(in_host_dev != nullptr, "model: the host input ring is not GPU-mapped (set GHT_INPUT_COPY=engine)");
    }
    ce_chunk = std::min(opts.ce_chunk_rows > 0 ? opts.ce_chunk_rows : default_ce_chunk_rows(N, V), N);
    ce_ws_bytes = kc::lm_head_ce_workspace_bytes(ce_chunk, static_cast<int>(V));
    ce_ws = alloc(ce_ws_bytes, kActs, "LM head logits chunk");
    logits_buf = nullptr;
    logits_rows = 0;
    cap_tokens = N;
    ++buffer_generation;  // a captured graph holds the old buffers' addresses
  }

  // ---- inputs ----
  void upload_inputs(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_) {
    GHT_EXPECTS(B_ > 0 && T_ > 0, "model forward: B and T must be > 0, got B=" + std::to_string(B_) +
                                      " T=" + std::to_string(T_));
    const std::int64_t N = static_cast<std::int64_t>(B_) * T_;
    for (std::int64_t i = 0; i < N; ++i) {
      GHT_EXPECTS(tok[i] >= 0 && tok[i] < V, "model forward: token id " + std::to_string(tok[i]) +
                                                 " at position " + std::to_string(i) +
                                                 " is outside [0, " + std::to_string(V) + ")");
      if (tgt != nullptr) {
        GHT_EXPECTS(tgt[i] == kIgnoreIndex || (tgt[i] >= 0 && tgt[i] < V),
                    "model forward: target " + std::to_string(tgt[i]) + " at position " +
                        std::to_string(i) + " is outside [0, " + std::to_string(V) +
                        ") and is not the ignore index " + std::to_string(kIgnoreIndex));
      }
    }
    op("allocate activations");
    ensure_capacity(N);
    op("upload tokens");
    const auto bytes = static_cast<std::size_t>(N) * 4;
    if (sm_copies) {
      // Into the next ring slot (once the copy that read it last has run), then up by a kernel.
      const int slot = in_next;
      in_next = (in_next + 1) % kInputSlots;
      GHT_CUDA_TRY(cudaEventSynchronize(in_event[slot]));
      const std::size_t off = static_cast<std::size_t>(slot) * 2 * static_cast<std::size_t>(cap_tokens) * 4;
      std::memcpy(in_host.as<char>() + off, tok, bytes);
      kc::sm_copy(tokens, in_host_dev + off, bytes, stream);
      if (tgt != nullptr) {
        std::memcpy(in_host.as<char>() + off + bytes, tgt, bytes);
        kc::sm_copy(targets, in_host_dev + off + bytes, bytes, stream);
      }
      GHT_CUDA_TRY(cudaEventRecord(in_event[slot], stream));
    } else {
      // Pageable sources: cudaMemcpyAsync stages them before returning, so callers may reuse them.
      GHT_CUDA_TRY(cudaMemcpyAsync(tokens, tok, bytes, cudaMemcpyHostToDevice, stream));
      if (tgt != nullptr) GHT_CUDA_TRY(cudaMemcpyAsync(targets, tgt, bytes, cudaMemcpyHostToDevice, stream));
    }
    kc::make_positions(pos, nullptr, B_, T_, stream);
    B = B_;
    T = T_;
  }

  [[nodiscard]] std::int64_t tokens_n() const { return static_cast<std::int64_t>(B) * T; }

  void hook_forward(int unit) {
    if (hooks.before_unit_forward && !capturing) hooks.before_unit_forward(unit);
    if (unit == cfg.layers + 1) mark_forward_end();
  }
  // After the last layer's forward (and the final unit's hook): the caller's forward-end event.
  // In a capture it becomes an event record node, pointed at the caller's event at each launch.
  void mark_forward_end() {
    if (capturing) {
      GHT_CUDA_TRY(cudaEventRecordWithFlags(graph_fwd_placeholder, stream, cudaEventRecordExternal));
    } else if (fwd_end_event != nullptr) {
      GHT_CUDA_TRY(cudaEventRecord(fwd_end_event, stream));
    }
  }
  void hook_backward(int unit) {
    if (hooks.after_unit_backward && !capturing) hooks.after_unit_backward(unit);
  }

  // ---- GEMM helpers ----
  void gemm(std::int64_t m, std::int64_t n_, std::int64_t k, const bf16* a, bool ta, const bf16* b,
            bool tb, void* c, kc::DType ct, float beta, std::int64_t lda = 0) {
    kc::GemmArgs g;
    g.m = m;
    g.n = n_;
    g.k = k;
    g.a = a;
    g.trans_a = ta;
    g.b = b;
    g.trans_b = tb;
    g.c = c;
    g.c_type = ct;
    g.beta = beta;
    g.lda = lda;
    kc::gemm(g, stream);
  }

  kc::GroupOffsets offsets_of(const Acts& a) const {
    kc::GroupOffsets o;
    o.groups = static_cast<int>(E);
    o.device = a.offsets;
    o.host = a.host_offsets.empty() ? nullptr : a.host_offsets.data();
    o.max_rows = tokens_n() * K;
    return o;
  }

  // var-M over the experts: C[rows_e] = A[rows_e]·op(B_e) (+ beta·C); B_e = b + e·3dF.
  void grouped_m(const Acts& a, std::int64_t n_, std::int64_t k, const bf16* A, const bf16* B_,
                 std::int64_t ldb, bool tb, bf16* C) {
    kc::GroupedGemmVarM g;
    g.n = n_;
    g.k = k;
    g.a = A;
    g.b = B_;
    g.ldb = ldb;
    g.stride_b = 3 * d * F;
    g.trans_b = tb;
    g.c = C;
    g.c_type = kc::DType::bf16;
    kc::grouped_gemm(g, offsets_of(a), opts.expert_impl, stream);
  }

  // var-K weight gradient: C_e += A[rows_e]^T·B[rows_e]; C_e = c + e·3dF.
  void grouped_k(const Acts& a, std::int64_t m, std::int64_t n_, const bf16* A, const bf16* B_,
                 void* C, kc::DType ct, std::int64_t ldc) {
    kc::GroupedGemmVarK g;
    g.m = m;
    g.n = n_;
    g.a = A;
    g.b = B_;
    g.c = C;
    g.c_type = ct;
    g.ldc = ldc;
    g.stride_c = 3 * d * F;
    g.beta = grad_beta();
    kc::grouped_gemm(g, offsets_of(a), opts.expert_impl, stream);
  }

  kc::AttentionShape att_shape() const {
    kc::AttentionShape s;
    s.B = B;
    s.T = T;
    s.H = static_cast<int>(H);
    s.KV = static_cast<int>(KV);
    s.D = static_cast<int>(D);
    s.q_row = QK;
    s.k_row = QK;
    s.v_row = QKV;
    s.o_row = 0;
    return s;
  }

  // ---- forward ----
  // Layer l from a.ln1 (and a.resid) to the expert outputs a.yp; with `combine`, the MoE output
  // (N, d) lands in tmp_d.
  void layer_forward(int l, Acts& a, kc::RouterLossesDevice* losses, bool combine) {
    const LayerOff& x = lo[static_cast<std::size_t>(l)];
    const std::int64_t N = tokens_n(), NK = N * K;
    const float eps = static_cast<float>(cfg.rms_eps);
    op("q/k/v projection", l);
    gemm(N, QKV, d, a.ln1, false, W + x.wq, true, a.qkv, kc::DType::bf16, 0.0f);
    op("q/k RMSNorm + RoPE", l);
    const kc::QkNormRopeHeads qn{a.qk, QK, a.q_rstd, a.qkv, QKV, W + x.q_norm, static_cast<int>(H)};
    const kc::QkNormRopeHeads kn{a.qk + HD, QK, a.k_rstd, a.qkv + HD, QKV, W + x.k_norm,
                                 static_cast<int>(KV)};
    if (opts.fused_kernels) {
      kc::qk_norm_rope_forward_qk(qn, kn, pos, N, static_cast<int>(D), eps, cfg.rope_theta, stream);
    } else {
      kc::qk_norm_rope_forward_qk(qn, {}, pos, N, static_cast<int>(D), eps, cfg.rope_theta, stream);
      kc::qk_norm_rope_forward_qk(kn, {}, pos, N, static_cast<int>(D), eps, cfg.rope_theta, stream);
    }
    op("attention forward", l);
    attention_ran = kc::attention_forward(a.att, a.lse, a.qk, a.qk + HD, a.qkv + QK, nullptr, att_shape(),
                                          opts.attention_impl, stream);
    op("o_proj", l);
    gemm(N, d, HD, a.att, false, W + x.wo, true, tmp_d, kc::DType::bf16, 0.0f);
    op("residual add + post_attention_layernorm", l);
    kc::fused_residual_rmsnorm_forward(a.h_mid, a.ln2, a.ln2_rstd, tmp_d, a.resid, W + x.ln2, N,
                                       static_cast<int>(d), eps, stream);
    if (opts.fused_kernels) {
      op("router + permutation (fused)", l);
      kc::router_route_forward(a.logits, a.probs, a.topk_idx, a.topk_w, losses,
                               {a.offsets, a.src_token, a.dst_row, big}, a.ln2, W + x.router, N,
                               static_cast<int>(d), static_cast<int>(E), static_cast<int>(K),
                               cfg.norm_topk_prob, stream);
    } else {
      op("router", l);
      kc::router_forward(a.logits, a.probs, a.topk_idx, a.topk_w, losses, nullptr, a.ln2,
                         W + x.router, N, static_cast<int>(d), static_cast<int>(E),
                         static_cast<int>(K), cfg.norm_topk_prob, stream);
      op("permutation plan", l);
      kc::moe_permute_plan(a.offsets, a.src_token, a.dst_row, a.topk_idx, N, static_cast<int>(K),
                           static_cast<int>(E), stream);
      op("permute", l);
      kc::moe_permute_forward_by_token(big, a.ln2, a.dst_row, N, static_cast<int>(K),
                                       static_cast<int>(d), stream);
    }
    if (kc::needs_host_offsets(opts.expert_impl)) {
      op("expert offsets download", l);
      a.host_offsets = kc::download_offsets(a.offsets, static_cast<int>(E), stream);
    } else {
      a.host_offsets.clear();
    }
    op("expert gate_up grouped GEMM", l);
    grouped_m(a, 2 * F, d, big, W + x.expert0, d, true, a.gu);
    op("SwiGLU forward", l);
    kc::swiglu_forward(a.act, F, a.gu, a.gu + F, 2 * F, NK, static_cast<int>(F), stream);
    op("expert down_proj grouped GEMM", l);
    grouped_m(a, d, F, a.act, W + x.expert0 + 2 * d * F, F, true, a.yp);
    if (combine) {
      op("un-permute (combine)", l);
      kc::moe_unpermute_forward(tmp_d, a.yp, a.topk_w, a.dst_row, N, static_cast<int>(K),
                                static_cast<int>(d), stream);
    }
  }

  // Everything up to the final norm output lnf. losses: (L) device router losses.
  void trunk(kc::RouterLossesDevice* losses) {
    const std::int64_t N = tokens_n();
    const float eps = static_cast<float>(cfg.rms_eps);
    hook_forward(0);
    op("embedding forward");
    kc::embedding_forward(acts[0].resid, tokens, W + embed, N, static_cast<int>(d), static_cast<int>(V),
                          nullptr, stream);
    hook_forward(1);
    for (int l = 0; l < cfg.layers; ++l) {
      Acts& a = layer_acts(l);
      if (l == 0) {
        op("input_layernorm", 0);
        kc::rmsnorm_forward(a.ln1, a.ln1_rstd, a.resid, W + lo[0].ln1, N, static_cast<int>(d), eps, stream);
      }
      layer_forward(l, a, losses + l, true);
      // The residual add is fused with the next norm, whose weight belongs to the next unit.
      hook_forward(l + 2);
      if (l + 1 < cfg.layers) {
        Acts& nx = layer_acts(l + 1);
        op("residual add + input_layernorm", l + 1);
        kc::fused_residual_rmsnorm_forward(nx.resid, nx.ln1, nx.ln1_rstd, tmp_d, a.h_mid,
                                           W + lo[static_cast<std::size_t>(l) + 1].ln1, N,
                                           static_cast<int>(d), eps, stream);
      } else {
        op("residual add + final norm");
        kc::fused_residual_rmsnorm_forward(resid_final, lnf, lnf_rstd, tmp_d, a.h_mid, W + final_norm, N,
                                           static_cast<int>(d), eps, stream);
      }
    }
  }

  // The activations layer l writes in forward: its own, or the shared recompute set with its own
  // input stream.
  Acts& layer_acts(int l) {
    Acts& own = acts[static_cast<std::size_t>(l)];
    if (!opts.recompute[static_cast<std::size_t>(l)]) return own;
    rc.resid = own.resid;
    return rc;
  }

  // ---- backward ----
  template <class GT>
  GT* grad(std::size_t off) {
    return static_cast<GT*>(G) + off;
  }
  template <class GT>
  static constexpr kc::DType gdt() {
    return std::is_same_v<GT, float> ? kc::DType::f32 : kc::DType::bf16;
  }

  // dnorm holds d(loss)/d(lnf): final norm, every layer, embedding.
  template <class GT>
  void backward_body(float loss_scale) {
    const std::int64_t N = tokens_n();
    op("final norm backward");
    GHT_CUDA_TRY(cudaMemsetAsync(dresid, 0, static_cast<std::size_t>(N * d) * sizeof(bf16), stream));
    kc::fused_residual_rmsnorm_backward(dresid, grad<GT>(final_norm), dnorm, resid_final, W + final_norm,
                                        lnf_rstd, N, static_cast<int>(d), stream);
    hook_backward(cfg.layers + 1);
    for (int l = cfg.layers - 1; l >= 0; --l) {
      Acts* a = &acts[static_cast<std::size_t>(l)];
      if (opts.recompute[static_cast<std::size_t>(l)]) {
        Acts& r = layer_acts(l);
        op("recompute: input_layernorm", l);
        kc::rmsnorm_forward(r.ln1, r.ln1_rstd, r.resid, W + lo[static_cast<std::size_t>(l)].ln1, N,
                            static_cast<int>(d), static_cast<float>(cfg.rms_eps), stream);
        layer_forward(l, r, scratch_losses + l, false);
        a = &r;
      }
      layer_backward<GT>(l, *a, loss_scale);
      hook_backward(l + 1);
    }
    op("embedding backward");
    kc::embedding_backward(grad<GT>(embed), dresid, tokens, N, static_cast<int>(d), static_cast<int>(V),
                           stream);
    hook_backward(0);
  }

  // dresid holds the gradient of layer l's output stream; on return, of its input stream.
  template <class GT>
  void layer_backward(int l, Acts& a, float loss_scale) {
    const LayerOff& x = lo[static_cast<std::size_t>(l)];
    const std::int64_t N = tokens_n(), NK = N * K;
    const int di = static_cast<int>(d), Ki = static_cast<int>(K), Ei = static_cast<int>(E);
    constexpr kc::DType ct = gdt<GT>();
    // ---- MoE ----
    op("un-permute backward", l);
    kc::moe_unpermute_backward(big, dtopk_w, dresid, a.yp, a.topk_w, a.dst_row, N, Ki, di, stream);
    op("expert down_proj grouped GEMM (backward, data)", l);
    grouped_m(a, F, d, big, W + x.expert0 + 2 * d * F, F, false, dact);
    op("expert down_proj grouped GEMM (backward, weights)", l);
    grouped_k(a, d, F, big, a.act, grad<GT>(x.expert0 + static_cast<std::size_t>(2 * d * F)), ct, F);
    op("SwiGLU backward", l);
    kc::swiglu_backward(dgu, dgu + F, 2 * F, dact, F, a.gu, a.gu + F, 2 * F, NK, static_cast<int>(F), stream);
    op("permute (re-gather for the weight gradient)", l);
    kc::moe_permute_forward_by_token(big, a.ln2, a.dst_row, N, Ki, di, stream);
    op("expert gate_up grouped GEMM (backward, weights)", l);
    grouped_k(a, 2 * F, d, dgu, big, grad<GT>(x.expert0), ct, d);
    op("expert gate_up grouped GEMM (backward, data)", l);
    grouped_m(a, d, 2 * F, dgu, W + x.expert0, d, false, big);
    op("permute backward", l);
    kc::moe_permute_backward(dnorm, big, a.dst_row, N, Ki, di, stream);
    op("router backward", l);
    kc::router_backward(dnorm, grad<GT>(x.router), dtopk_w,
                        loss_scale * static_cast<float>(cfg.aux_loss_coef),
                        loss_scale * static_cast<float>(cfg.z_loss_coef), a.logits, a.probs, a.topk_idx,
                        a.topk_w, a.ln2, W + x.router, N, di, Ei, Ki, cfg.norm_topk_prob, stream);
    op("post_attention_layernorm backward", l);
    kc::fused_residual_rmsnorm_backward(dresid, grad<GT>(x.ln2), dnorm, a.h_mid, W + x.ln2, a.ln2_rstd, N,
                                        di, stream);
    // ---- attention ----
    op("o_proj backward", l);
    gemm(N, HD, d, dresid, false, W + x.wo, false, datt, kc::DType::bf16, 0.0f);
    gemm(d, HD, N, dresid, true, a.att, false, grad<GT>(x.wo), ct, grad_beta());
    op("attention backward", l);
    kc::attention_backward(dqk, dqk + HD, dqkv + QK, datt, a.qk, a.qk + HD, a.qkv + QK, a.att, a.lse,
                           nullptr, att_shape(), opts.attention_impl, stream);
    op("q/k RMSNorm + RoPE backward", l);
    const kc::QkNormRopeGradHeads<GT> qg{dqkv, QKV, grad<GT>(x.q_norm), dqk, QK, a.qkv, QKV,
                                         W + x.q_norm, a.q_rstd, static_cast<int>(H)};
    const kc::QkNormRopeGradHeads<GT> kg{dqkv + HD, QKV, grad<GT>(x.k_norm), dqk + HD, QK, a.qkv + HD,
                                         QKV, W + x.k_norm, a.k_rstd, static_cast<int>(KV)};
    if (opts.fused_kernels) {
      kc::qk_norm_rope_backward_qk(qg, kg, pos, N, static_cast<int>(D), cfg.rope_theta, stream);
    } else {
      kc::qk_norm_rope_backward_qk(qg, {}, pos, N, static_cast<int>(D), cfg.rope_theta, stream);
      kc::qk_norm_rope_backward_qk(kg, {}, pos, N, static_cast<int>(D), cfg.rope_theta, stream);
    }
    op("q/k/v projection backward", l);
    gemm(N, d, QKV, dqkv, false, W + x.wq, false, dnorm, kc::DType::bf16, 0.0f);
    gemm(QKV, d, N, dqkv, true, a.ln1, false, grad<GT>(x.wq), ct, grad_beta());
    op("input_layernorm backward", l);
    kc::rmsnorm_backward(dresid, grad<GT>(x.ln1), dnorm, a.resid, W + x.ln1, a.ln1_rstd, N, di, stream);
  }

  template <class GT>
  void head_forward_backward(float loss_scale, float* ce_loss, std::int32_t* valid) {
    const std::int64_t N = tokens_n();
    op("LM head + cross-entropy (forward and backward)");
    kc::CeOutputs out;
    out.loss = ce_loss;
    out.valid = valid;
    kc::lm_head_ce_forward_backward(out, dnorm, grad<GT>(head), lnf, W + head, targets, N,
                                    static_cast<int>(d), static_cast<int>(V), loss_scale, kIgnoreIndex,
                                    ce_chunk, ce_ws, ce_ws_bytes, stream, grad_beta());
  }

  // GradWrite::assign: the GEMMs write their weight gradients with beta 0 (the LM head's first,
  // so a tied embedding's scatter then adds to it); what kernels accumulate into with atomics is
  // zeroed here: per layer q/k norm and router, and the two RMSNorms; the final norm; an untied
  // embedding.
  template <class GT>
  void clear_accumulated_grads() {
    op("zero gradients");
    auto zero = [&](std::size_t begin, std::size_t end) {
      GHT_CUDA_TRY(cudaMemsetAsync(grad<GT>(begin), 0, (end - begin) * sizeof(GT), stream));
    };
    for (const LayerOff& x : lo) {
      zero(x.q_norm, x.expert0);  // q_norm, k_norm, router
      zero(x.ln1, x.end);         // input_layernorm, post_attention_layernorm
    }
    zero(final_norm, final_norm + static_cast<std::size_t>(d));
    if (!cfg.tied_embeddings) zero(embed, embed + static_cast<std::size_t>(V * d));
  }

  // The LM head (with the loss) and the backward of every layer, writing the gradients as
  // grad_write says.
  template <class GT>
  void head_and_body_backward(float loss_scale, float* ce_loss, std::int32_t* valid) {
    if (grad_write == GradWrite::assign) clear_accumulated_grads<GT>();
    head_forward_backward<GT>(loss_scale, ce_loss, valid);
    backward_body<GT>(loss_scale);
  }

  // ---- loss slots ----
  char* slot_d(int s) { return slot_dev + static_cast<std::size_t>(s) * slot_bytes; }
  char* slot_h(int s) { return slot_host.as<char>() + static_cast<std::size_t>(s) * slot_bytes; }
  static void check_slot(int s) {
    GHT_EXPECTS(s >= 0 && s < kCudaLossSlots, "CudaMoEModel: loss slot " + std::to_string(s) +
                                              " outside [0, " + std::to_string(kCudaLossSlots) + ")");
  }

  // One micro-batch after the upload: forward, LM head (+ backward), losses into slot `sd`.
  void compute(char* sd, bool with_backward, float loss_scale) {
    auto* ce_loss = reinterpret_cast<float*>(sd);
    auto* valid = reinterpret_cast<std::int32_t*>(sd + 4);
    auto* losses = reinterpret_cast<kc::RouterLossesDevice*>(sd + 8);
    trunk(losses);
    if (with_backward) {
      if (opts.grad_type == optimizer::GradType::fp32) {
        head_and_body_backward<float>(loss_scale, ce_loss, valid);
      } else {
        head_and_body_backward<bf16>(loss_scale, ce_loss, valid);
      }
    } else {
      op("LM head + cross-entropy (forward)");
      kc::CeOutputs out;
      out.loss = ce_loss;
      out.valid = valid;
      kc::lm_head_ce_forward(out, lnf, W + head, targets, tokens_n(), static_cast<int>(d),
                             static_cast<int>(V), kIgnoreIndex, ce_chunk, ce_ws, ce_ws_bytes, stream);
    }
  }

  // ---- CUDA graphs ----
  // A graph replays fixed pointers and host values, and nothing may wait on the host inside it.
  [[nodiscard]] bool graph_usable() const {
    const bool hooks_idle = (!hooks.before_unit_forward && !hooks.after_unit_backward) ||
                            (hooks_quiet && hooks_quiet());
    return opts.cuda_graphs && graphs_off.empty() && !op_hook && !opts.sync_each_op &&
           !kc::needs_host_offsets(opts.expert_impl) && hooks_idle;
  }

  static void destroy(Graph& g) noexcept {
    if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    if (g.graph != nullptr) (void)cudaGraphDestroy(g.graph);
    g = Graph{};
  }

  // compute() into graph_slot as a graph launch: replayed when captured for this key, captured
  // (then launched) when the key ran eagerly before, else run eagerly once.
  void run_graph(float loss_scale) {
    const GraphKey key{B, T, W, G, loss_scale, buffer_generation, grad_write, kc::stream_sm_budget(stream)};
    Graph* g = nullptr;
    for (Graph& x : graphs) {
      if (x.key == key) g = &x;
    }
    if (g == nullptr) {
      const bool warm = std::find(warm_keys.begin(), warm_keys.end(), key) != warm_keys.end();
      if (warm) g = capture(key, loss_scale);
      if (g == nullptr) {  // not warm yet, or the capture failed and graphs are off now
        compute(graph_slot, true, loss_scale);
        if (!warm) {
          warm_keys.push_back(key);
          if (warm_keys.size() > kMaxGraphs) warm_keys.erase(warm_keys.begin());
        }
        return;
      }
    }
    op("CUDA graph launch");
    GHT_CUDA_TRY(cudaGraphExecEventRecordNodeSetEvent(g->exec, g->fwd_end,
                                                      fwd_end_event != nullptr ? fwd_end_event : graph_fwd_placeholder));
    GHT_CUDA_TRY(cudaGraphLaunch(g->exec, stream));
    ++graph_launches;
  }

  // The event record node that mark_forward_end() left in `graph`.
  [[nodiscard]] cudaGraphNode_t forward_end_node(cudaGraph_t graph) const {
    std::size_t count = 0;
    GHT_CUDA_TRY(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    GHT_CUDA_TRY(cudaGraphGetNodes(graph, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      GHT_CUDA_TRY(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeEventRecord) continue;
      cudaEvent_t e = nullptr;
      GHT_CUDA_TRY(cudaGraphEventRecordNodeGetEvent(node, &e));
      if (e == graph_fwd_placeholder) return node;
    }
    GHT_FAIL("CUDA graph capture: the forward-end event record node is missing");
  }

  // Capture compute() for `key` and keep it (the oldest goes beyond kMaxGraphs). A failure
  // discards the capture (nothing of it ran) and is thrown, or with cuda_graphs_fall_back turns
  // graphs off with a warning and returns null, so that the caller runs the micro-batch eagerly.
  Graph* capture(const GraphKey& key, float loss_scale) {
    op("CUDA graph capture");
    // Thread-local: other threads' CUDA calls (the delayed update's) are not part of it.
    GHT_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    Graph g;
    g.key = key;
    std::exception_ptr failed;
    capturing = true;
    try {
      compute(graph_slot, true, loss_scale);
    } catch (...) {
      failed = std::current_exception();
    }
    capturing = false;
    const cudaError_t end = cudaStreamEndCapture(stream, &g.graph);  // leaves the stream usable again
    try {
      if (failed) std::rethrow_exception(failed);
      GHT_CUDA_TRY(end);
      g.fwd_end = forward_end_node(g.graph);
      GHT_CUDA_TRY(cudaGraphInstantiate(&g.exec, g.graph, 0));
    } catch (const std::exception& e) {
      destroy(g);
      (void)cudaGetLastError();
      if (!opts.cuda_graphs_fall_back) throw;
      graphs_off = e.what();
      ght::log::warn(std::string("CUDA graphs: capturing a micro-batch failed, so every micro-batch runs eagerly "
                                 "from now on (the same results): ") + graphs_off);
      return nullptr;
    }
    if (graphs.size() == kMaxGraphs) {
      destroy(graphs.front());
      graphs.erase(graphs.begin());
    }
    graphs.push_back(g);
    ++graph_captures;
    return &graphs.back();
  }

  void run_forward(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_, int slot,
                   bool with_backward, float loss_scale, cudaEvent_t forward_end, GradWrite write) {
    check_slot(slot);
    has_forward = false;
    struct CallScope {  // the caller's event and gradient write, for this call only
      Impl& m;
      ~CallScope() {
        m.fwd_end_event = nullptr;
        m.grad_write = GradWrite::add;
      }
    } call_scope{*this};
    fwd_end_event = forward_end;
    grad_write = write;
    upload_inputs(tok, tgt, B_, T_);
    char* sd = slot_d(slot);
    if (with_backward && graph_usable()) {
      run_graph(loss_scale);
      GHT_CUDA_TRY(cudaMemcpyAsync(sd, graph_slot, slot_bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      compute(sd, with_backward, loss_scale);
    }
    op("loss copy");
    if (sm_copies) {
      kc::sm_copy(slot_host_dev + static_cast<std::size_t>(slot) * slot_bytes, sd, slot_bytes, stream);
    } else {
      GHT_CUDA_TRY(cudaMemcpyAsync(slot_h(slot), sd, slot_bytes, cudaMemcpyDeviceToHost, stream));
    }
    GHT_CUDA_TRY(cudaEventRecord(slot_event[slot], stream));
    has_forward = true;
  }

  Loss collect(int slot) {
    check_slot(slot);
    op("loss readback");
    GHT_CUDA_TRY(cudaEventSynchronize(slot_event[slot]));
    const char* h = slot_h(slot);
    Loss l;
    float ce = 0;
    std::int32_t valid = 0;
    std::memcpy(&ce, h, 4);
    std::memcpy(&valid, h + 4, 4);
    for (std::int64_t i = 0; i < L; ++i) {
      kc::RouterLossesDevice r{};
      std::memcpy(&r, h + 8 + 8 * i, sizeof r);
      l.aux += r.aux;
      l.z += r.z;
    }
    l.ce = ce;
    l.tokens = valid;
    l.total = l.ce + cfg.aux_loss_coef * l.aux + cfg.z_loss_coef * l.z;
    return l;
  }

  // forward() computed the loss only: the LM head runs again with its gradient (GradWrite::add,
  // as outside forward_backward).
  void run_backward(float loss_scale) {
    GHT_EXPECTS(has_forward, "model backward: call forward() first (logits() does not count)");
    if (opts.grad_type == optimizer::GradType::fp32) {
      head_and_body_backward<float>(loss_scale, nullptr, nullptr);
    } else {
      head_and_body_backward<bf16>(loss_scale, nullptr, nullptr);
    }
  }
};

// ---- public interface ----------------------------------------------------------------------

CudaMoEModel::CudaMoEModel(ModelConfig cfg, CudaModelOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->guarded([&] { impl_->setup(std::move(cfg), std::move(opts)); });
}
CudaMoEModel::~CudaMoEModel() = default;

const ModelConfig& CudaMoEModel::config() const { return impl_->cfg; }
const CudaModelOptions& CudaMoEModel::options() const { return impl_->opts; }
kernels::cuda::AttentionImpl CudaMoEModel::attention_used() const { return impl_->attention_ran; }
const std::vector<NamedTensor>& CudaMoEModel::tensors() const { return impl_->tensors; }
std::size_t CudaMoEModel::num_params() const { return impl_->n; }
cudaStream_t CudaMoEModel::stream() const { return impl_->stream; }
__nv_bfloat16* CudaMoEModel::weights() { return impl_->W; }
void* CudaMoEModel::grads() { return impl_->G; }
std::pair<__nv_bfloat16*, void*> CudaMoEModel::swap_buffers(__nv_bfloat16* weights, void* grads) {
  GHT_EXPECTS(weights != nullptr && grads != nullptr, "CudaMoEModel::swap_buffers: null buffer");
  const std::pair<__nv_bfloat16*, void*> old{impl_->W, impl_->G};
  impl_->W = weights;
  impl_->G = grads;
  return old;
}
optimizer::GradType CudaMoEModel::grad_type() const { return impl_->opts.grad_type; }
int CudaMoEModel::num_units() const { return impl_->cfg.layers + 2; }
void CudaMoEModel::set_hooks(Hooks hooks) { impl_->hooks = std::move(hooks); }
void CudaMoEModel::set_hooks_quiet(std::function<bool()> quiet) { impl_->hooks_quiet = std::move(quiet); }
std::int64_t CudaMoEModel::cuda_graph_launches() const { return impl_->graph_launches; }
std::int64_t CudaMoEModel::cuda_graph_captures() const { return impl_->graph_captures; }
const std::string& CudaMoEModel::cuda_graphs_off() const { return impl_->graphs_off; }
void CudaMoEModel::set_op_hook(std::function<void(const char* op, int layer)> hook) {
  impl_->op_hook = std::move(hook);
}

const NamedTensor& CudaMoEModel::tensor(std::string_view name) const {
  for (const auto& t : impl_->tensors) {
    if (t.name == name) return t;
  }
  GHT_FAIL("model: no parameter tensor named '" + std::string(name) + "'");
}

std::pair<std::size_t, std::size_t> CudaMoEModel::unit_range(int unit) const {
  const Impl& I = *impl_;
  GHT_EXPECTS(unit >= 0 && unit < num_units(), "CudaMoEModel: unit " + std::to_string(unit) +
                                                   " outside [0, " + std::to_string(num_units()) + ")");
  if (unit == 0) return {I.embed, I.embed + static_cast<std::size_t>(I.V * I.d)};
  if (unit <= I.cfg.layers) {
    const LayerOff& x = I.lo[static_cast<std::size_t>(unit) - 1];
    return {x.begin, x.end};
  }
  return {I.final_norm, I.n};
}

void CudaMoEModel::init(std::uint64_t seed) {
  init_params_host(impl_->tensors, seed, [&](std::size_t ti, std::span<const float> v) {
    load_weights(impl_->tensors[ti].offset, v);
  });
  zero_grad();
  impl_->has_forward = false;
  GHT_CUDA_TRY(cudaStreamSynchronize(impl_->stream));
}

void CudaMoEModel::load_weights(std::span<const float> host) {
  GHT_EXPECTS(host.size() == impl_->n, "CudaMoEModel::load_weights: " + std::to_string(host.size()) +
                                           " values for " + std::to_string(impl_->n) + " parameters");
  load_weights(0, host);
}

void CudaMoEModel::load_weights(std::size_t offset, std::span<const float> host) {
  Impl& I = *impl_;
  GHT_EXPECTS(offset + host.size() <= I.n, "CudaMoEModel::load_weights: slice [" + std::to_string(offset) +
                                               ", " + std::to_string(offset + host.size()) +
                                               ") outside the " + std::to_string(I.n) + " parameters");
  I.guarded([&] {
    I.op("weight upload");
    std::vector<std::uint16_t> buf(std::min(host.size(), kCopyChunk));
    for (std::size_t i = 0; i < host.size(); i += kCopyChunk) {
      const std::size_t c = std::min(kCopyChunk, host.size() - i);
      // The previous chunk's copy must have left buf before it is refilled.
      GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
      parallel_to_bf16(host.data() + i, buf.data(), c);
      GHT_CUDA_TRY(cudaMemcpyAsync(I.W + offset + i, buf.data(), c * sizeof(bf16), cudaMemcpyHostToDevice,
                                   I.stream));
    }
    GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
  });
}

void CudaMoEModel::store_weights(std::span<float> host) const {
  Impl& I = *impl_;
  GHT_EXPECTS(host.size() == I.n, "CudaMoEModel::store_weights: room for " + std::to_string(host.size()) +
                                      " values, the model has " + std::to_string(I.n));
  I.guarded([&] {
    I.op("weight download");
    std::vector<std::uint16_t> buf(std::min(I.n, kCopyChunk));
    for (std::size_t i = 0; i < I.n; i += kCopyChunk) {
      const std::size_t c = std::min(kCopyChunk, I.n - i);
      GHT_CUDA_TRY(cudaMemcpyAsync(buf.data(), I.W + i, c * sizeof(bf16), cudaMemcpyDeviceToHost, I.stream));
      GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
      parallel_from_bf16(buf.data(), host.data() + i, c);
    }
  });
}

void CudaMoEModel::store_grads(std::span<float> host) const {
  GHT_EXPECTS(host.size() == impl_->n, "CudaMoEModel::store_grads: room for " + std::to_string(host.size()) +
                                           " values, the model has " + std::to_string(impl_->n));
  store_grads(0, host);
}

void CudaMoEModel::store_grads(std::size_t offset, std::span<float> host) const {
  Impl& I = *impl_;
  GHT_EXPECTS(offset + host.size() <= I.n, "CudaMoEModel::store_grads: slice outside the parameters");
  I.guarded([&] {
    I.op("gradient download");
    if (I.opts.grad_type == optimizer::GradType::fp32) {
      GHT_CUDA_TRY(cudaMemcpyAsync(host.data(), static_cast<const float*>(I.G) + offset, host.size() * 4,
                                   cudaMemcpyDeviceToHost, I.stream));
      GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
      return;
    }
    std::vector<std::uint16_t> buf(std::min(host.size(), kCopyChunk));
    for (std::size_t i = 0; i < host.size(); i += kCopyChunk) {
      const std::size_t c = std::min(kCopyChunk, host.size() - i);
      GHT_CUDA_TRY(cudaMemcpyAsync(buf.data(), static_cast<const bf16*>(I.G) + offset + i, c * 2,
                                   cudaMemcpyDeviceToHost, I.stream));
      GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
      parallel_from_bf16(buf.data(), host.data() + i, c);
    }
  });
}

void CudaMoEModel::zero_grad() {
  Impl& I = *impl_;
  I.guarded([&] {
    I.op("zero gradients");
    GHT_CUDA_TRY(cudaMemsetAsync(I.G, 0, I.n * optimizer::grad_type_size(I.opts.grad_type), I.stream));
  });
}

Loss CudaMoEModel::forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T) {
  forward_async(tokens, targets, B, T, kCudaLossSlots - 1);
  return collect_loss(kCudaLossSlots - 1);
}

void CudaMoEModel::backward(float loss_scale) {
  impl_->guarded([&] { impl_->run_backward(loss_scale); });
}

Loss CudaMoEModel::forward_backward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                                    float loss_scale) {
  forward_backward_async(tokens, targets, B, T, loss_scale, kCudaLossSlots - 1);
  return collect_loss(kCudaLossSlots - 1);
}

void CudaMoEModel::forward_async(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                                 int slot) {
  GHT_EXPECTS(targets != nullptr, "model forward: targets are required");
  impl_->guarded([&] { impl_->run_forward(tokens, targets, B, T, slot, false, 0.0f, nullptr, GradWrite::add); });
}

void CudaMoEModel::forward_backward_async(const std::int32_t* tokens, const std::int32_t* targets, int B,
                                          int T, float loss_scale, int slot, cudaEvent_t forward_end,
                                          GradWrite write) {
  GHT_EXPECTS(targets != nullptr, "model forward: targets are required");
  impl_->guarded([&] { impl_->run_forward(tokens, targets, B, T, slot, true, loss_scale, forward_end, write); });
}

Loss CudaMoEModel::collect_loss(int slot) {
  Loss l;
  impl_->guarded([&] { l = impl_->collect(slot); });
  return l;
}

void CudaMoEModel::logits(float* out, const std::int32_t* tokens, int B, int T, bool last_only) {
  Impl& I = *impl_;
  I.guarded([&] {
    I.has_forward = false;
    I.upload_inputs(tokens, nullptr, B, T);
    I.trunk(I.scratch_losses);
    const std::int64_t rows = last_only ? B : static_cast<std::int64_t>(B) * T;
    const std::int64_t cap = std::max<std::int64_t>(1, (std::int64_t{256} << 20) / (4 * I.V));
    const std::int64_t chunk = std::min(rows, cap);
    if (I.logits_rows < chunk) {
      I.op("allocate logits buffer");
      I.logits_buf = as<float>(I.alloc(static_cast<std::size_t>(chunk * I.V) * 4, kActs, "logits chunk"));
      I.logits_rows = chunk;
    }
    I.op("logits GEMM");
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t nr = std::min(chunk, rows - r0);
      // last_only: row b is lnf[b·T + T − 1], a strided view (lda = T·d) of the norm output.
      const bf16* a = last_only ? I.lnf + (r0 * T + T - 1) * I.d : I.lnf + r0 * I.d;
      I.gemm(nr, I.V, I.d, a, false, I.W + I.head, true, I.logits_buf, kc::DType::f32, 0.0f,
             last_only ? static_cast<std::int64_t>(T) * I.d : 0);
      GHT_CUDA_TRY(cudaMemcpyAsync(out + r0 * I.V, I.logits_buf, static_cast<std::size_t>(nr * I.V) * 4,
                                   cudaMemcpyDeviceToHost, I.stream));
      GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
    }
  });
}

std::vector<std::int32_t> CudaMoEModel::topk_indices(int layer) const {
  Impl& I = *impl_;
  GHT_EXPECTS(layer >= 0 && layer < I.cfg.layers, "model: layer " + std::to_string(layer) + " out of range");
  GHT_EXPECTS(!I.opts.recompute[static_cast<std::size_t>(layer)],
              "model: layer " + std::to_string(layer) + " is recomputed; its routing is not kept");
  if (I.cap_tokens == 0 || I.B == 0) return {};
  std::vector<std::int32_t> out(static_cast<std::size_t>(I.tokens_n() * I.K));
  I.guarded([&] {
    I.op("routing download");
    GHT_CUDA_TRY(cudaMemcpyAsync(out.data(), I.acts[static_cast<std::size_t>(layer)].topk_idx,
                                 out.size() * 4, cudaMemcpyDeviceToHost, I.stream));
    GHT_CUDA_TRY(cudaStreamSynchronize(I.stream));
  });
  return out;
}

CudaModelMemory CudaMoEModel::memory() const {
  const Impl& I = *impl_;
  return {I.bytes_by_class[kWeights], I.bytes_by_class[kGrads], I.bytes_by_class[kActs],
          I.bytes_by_class[kWork]};
}

std::string CudaMoEModel::memory_report() const { return impl_->memory_report(); }

}  // namespace ght::trainer
