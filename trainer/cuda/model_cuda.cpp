// The CUDA backend of the MoE model (see model_cuda.hpp). Host code only: every op is a launcher
// from kernels/cuda, so these files are plain C++ (OpenMP for the host-side conversions). This
// file: the tensor list, the initialisation and the public interface; CudaMoEModel::Impl is in
// model_cuda_impl.hpp, its parts in model_cuda_buffers.cpp, model_cuda_forward.cpp,
// model_cuda_backward.cpp and model_cuda_graphs.cpp.
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/cuda/model_cuda_impl.hpp"
#include "trainer/detail/normal_rng.hpp"

namespace ght::trainer {

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

// ---- host conversions ------------------------------------------------------------------------

namespace {

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
  impl_->fp8_stale = true;
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
    I.fp8_stale = true;
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

void CudaMoEModel::weights_changed() { impl_->fp8_stale = true; }

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
    I.fp8_stale = false;
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
