#include "trainer/model.hpp"
#include "trainer/detail/normal_rng.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <new>
#include <numbers>
#include <string>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/lm_head_ce.hpp"
#include "kernels/cpu/permute.hpp"
#include "kernels/cpu/qk_norm_rope.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/router.hpp"
#include "kernels/cpu/swiglu_experts.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::trainer {

namespace k = ght::kernels::cpu;

namespace detail {

/// Offsets of one layer's tensors in the flat parameter array.
struct LayerParams {
  std::size_t wq, wk, wv, wo, q_norm, k_norm, router, expert0_gate, expert0_up, expert0_down, ln1,
      ln2;
};

template <class T>
struct LayerActs {
  std::vector<T> resid;                 // (N, d) residual stream entering the layer
  std::vector<T> ln1, ln1_rstd;         // (N, d), (N)
  std::vector<T> q_raw, k_raw, v;       // (N, H*D), (N, KV*D), (N, KV*D)
  std::vector<T> q, kk, q_rstd, k_rstd; // after QK-norm + RoPE; rstd (N, H), (N, KV)
  std::vector<T> att, lse;              // (N, H*D), (B, H, T)
  std::vector<T> h_mid;                 // (N, d) stream after the attention residual add
  std::vector<T> ln2, ln2_rstd;         // (N, d), (N)
  std::vector<T> logits, probs, topk_w; // (N, E), (N, E), (N, K)
  std::vector<std::int32_t> topk_idx;   // (N, K)
  std::vector<std::int32_t> offsets, src_token, dst_row;  // (E+1), (N*K), (N*K)
  std::vector<T> xp, gate, up, act, yp; // (N*K, d), (N*K, F) x3, (N*K, d)
};

template <class T>
struct Workspace {
  int B = 0, T_ = 0;
  bool has_forward = false;
  std::vector<std::int32_t> tokens, targets, doc_ids, pos;
  std::vector<LayerActs<T>> layers;
  std::vector<T> resid_final, lnf, lnf_rstd, ce_lse;  // (N, d), (N, d), (N), (N)
  std::vector<T> tmp_d, tmp_d2, tmp_q, tmp_q2, tmp_kv, tmp_kv2, tmp_kv3;  // scratch
  std::vector<T> tmp_xp, tmp_yp, tmp_w;                                  // scratch
  k::CrossEntropyResult ce;
  std::vector<LayerParams> lp;
  std::size_t embed = 0, final_norm = 0, head = 0;
};

}  // namespace detail

namespace {

using detail::NormalRng;  // shared with the CUDA model (trainer/detail/normal_rng.hpp)

template <class T>
void resize(std::vector<T>& v, std::size_t n) {
  v.resize(n);
}

}  // namespace

std::uint64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

void check_host_fits(const std::string& what, std::uint64_t bytes, std::uint64_t available) {
  if (available == 0 || bytes <= available) return;
  throw ght::out_of_memory(what + " need " + std::to_string(bytes) + " bytes (" +
                           config::format_bytes(bytes) + "), but only " + std::to_string(available) +
                           " bytes (" + config::format_bytes(available) +
                           ") of host memory are available; use a smaller model or the cuda backend");
}

template <class T>
MoEModel<T>::MoEModel(ModelConfig cfg, ModelOptions opts)
    : cfg_(std::move(cfg)), opts_(opts), ws_(std::make_unique<detail::Workspace<T>>()) {
  cfg_.validate();
  GHT_EXPECTS(opts_.ce_chunk_rows > 0, "model options: ce_chunk_rows must be > 0");
  const std::int64_t d = cfg_.d_model, D = cfg_.head_dim, H = cfg_.heads, KV = cfg_.kv_heads,
                     E = cfg_.experts, F = cfg_.expert_ffn, V = cfg_.vocab;
  std::size_t off = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, bool decay) {
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    tensors_.push_back(NamedTensor{std::move(name), std::move(shape), off, n, decay});
    off += n;
    return tensors_.back().offset;
  };
  auto& w = *ws_;
  w.embed = add("model.embed_tokens.weight", {V, d}, true);
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    detail::LayerParams lp{};
    lp.wq = add(p + "self_attn.q_proj.weight", {H * D, d}, true);
    lp.wk = add(p + "self_attn.k_proj.weight", {KV * D, d}, true);
    lp.wv = add(p + "self_attn.v_proj.weight", {KV * D, d}, true);
    lp.wo = add(p + "self_attn.o_proj.weight", {d, H * D}, true);
    lp.q_norm = add(p + "self_attn.q_norm.weight", {D}, false);
    lp.k_norm = add(p + "self_attn.k_norm.weight", {D}, false);
    lp.router = add(p + "mlp.gate.weight", {E, d}, true);
    for (int e = 0; e < cfg_.experts; ++e) {
      const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
      const std::size_t g = add(pe + "gate_proj.weight", {F, d}, true);
      const std::size_t u = add(pe + "up_proj.weight", {F, d}, true);
      const std::size_t dn = add(pe + "down_proj.weight", {d, F}, true);
      if (e == 0) {
        lp.expert0_gate = g;
        lp.expert0_up = u;
        lp.expert0_down = dn;
      }
    }
    lp.ln1 = add(p + "input_layernorm.weight", {d}, false);
    lp.ln2 = add(p + "post_attention_layernorm.weight", {d}, false);
    w.lp.push_back(lp);
  }
  w.final_norm = add("model.norm.weight", {d}, false);
  w.head = cfg_.tied_embeddings ? w.embed : add("lm_head.weight", {V, d}, true);
  GHT_EXPECTS(static_cast<std::int64_t>(off) == cfg_.total_params(),
              "model: parameter layout (" + std::to_string(off) +
                  ") disagrees with ModelConfig::total_params (" +
                  std::to_string(cfg_.total_params()) + ")");
  // Parameters and gradients, checked up front: seed-21b on the CPU backend asks for 168 GB, and
  // a bare std::bad_alloc would not say what did not fit.
  const std::string what = "CPU model '" + cfg_.name + "' (" + std::to_string(off) +
                           " parameters): parameters and gradients";
  const std::uint64_t need = 2ULL * off * sizeof(T);
  const std::uint64_t available = host_available_bytes();
  check_host_fits(what, need, available);
  try {
    params_.assign(off, T(0));
    grads_.assign(off, T(0));
  } catch (const std::bad_alloc&) {
    throw ght::out_of_memory(what + " need " + std::to_string(need) + " bytes (" +
                             config::format_bytes(need) + "); allocating them failed with " +
                             std::to_string(available) + " bytes reported available");
  }
}

template <class T>
MoEModel<T>::~MoEModel() = default;
template <class T>
MoEModel<T>::MoEModel(MoEModel&&) noexcept = default;
template <class T>
MoEModel<T>& MoEModel<T>::operator=(MoEModel&&) noexcept = default;

template <class T>
void MoEModel<T>::init(std::uint64_t seed) {
  NormalRng rng(seed);
  for (const auto& t : tensors_) {
    T* p = params_.data() + t.offset;
    if (t.shape.size() == 1) {
      std::fill(p, p + t.numel, T(1));  // norm weights
    } else {
      for (std::size_t i = 0; i < t.numel; ++i) p[i] = static_cast<T>(0.02 * rng.next());
    }
  }
  zero_grad();
  ws_->has_forward = false;
}

template <class T>
const NamedTensor& MoEModel<T>::tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  GHT_FAIL("model: no parameter tensor named '" + std::string(name) + "'");
}

template <class T>
std::span<T> MoEModel<T>::param(std::string_view name) {
  const auto& t = tensor(name);
  return std::span<T>(params_).subspan(t.offset, t.numel);
}

template <class T>
std::span<T> MoEModel<T>::grad(std::string_view name) {
  const auto& t = tensor(name);
  return std::span<T>(grads_).subspan(t.offset, t.numel);
}

template <class T>
void MoEModel<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
std::span<const std::int32_t> MoEModel<T>::topk_indices(int layer) const {
  GHT_EXPECTS(layer >= 0 && layer < cfg_.layers,
              "model: layer " + std::to_string(layer) + " out of range");
  if (ws_->layers.empty()) return {};
  return ws_->layers[layer].topk_idx;
}

// Runs everything up to the final norm (lnf); returns the summed router losses.
template <class T>
static k::RouterLosses forward_trunk(const ModelConfig& cfg, const ModelOptions& opts,
                                     const T* P, detail::Workspace<T>& w,
                                     const std::int32_t* tokens, int B, int T_,
                                     const std::int32_t* doc_ids) {
  GHT_EXPECTS(B > 0 && T_ > 0, "model forward: B and T must be > 0, got B=" + std::to_string(B) +
                                   " T=" + std::to_string(T_));
  const std::int64_t N = static_cast<std::int64_t>(B) * T_;
  const int d = cfg.d_model, H = cfg.heads, KV = cfg.kv_heads, D = cfg.head_dim,
            E = cfg.experts, K = cfg.top_k, F = cfg.expert_ffn, V = cfg.vocab, L = cfg.layers;
  const std::int64_t qd = static_cast<std::int64_t>(H) * D, kvd = static_cast<std::int64_t>(KV) * D;
  const std::size_t n = static_cast<std::size_t>(N), nk = n * K;

  w.B = B;
  w.T_ = T_;
  w.tokens.assign(tokens, tokens + N);
  if (doc_ids != nullptr) {
    w.doc_ids.assign(doc_ids, doc_ids + N);
  } else {
    w.doc_ids.clear();
  }
  const std::int32_t* docs = doc_ids != nullptr ? w.doc_ids.data() : nullptr;
  w.pos.resize(n);
  k::make_positions(w.pos.data(), opts.reset_positions_at_doc ? docs : nullptr, B, T_);

  w.layers.resize(L);
  for (auto& a : w.layers) {
    resize(a.resid, n * d); resize(a.ln1, n * d); resize(a.ln1_rstd, n);
    resize(a.q_raw, n * qd); resize(a.k_raw, n * kvd); resize(a.v, n * kvd);
    resize(a.q, n * qd); resize(a.kk, n * kvd); resize(a.q_rstd, n * H); resize(a.k_rstd, n * KV);
    resize(a.att, n * qd); resize(a.lse, n * H); resize(a.h_mid, n * d);
    resize(a.ln2, n * d); resize(a.ln2_rstd, n);
    resize(a.logits, n * E); resize(a.probs, n * E); resize(a.topk_w, nk); resize(a.topk_idx, nk);
    resize(a.offsets, static_cast<std::size_t>(E) + 1); resize(a.src_token, nk); resize(a.dst_row, nk);
    resize(a.xp, nk * d); resize(a.gate, nk * F); resize(a.up, nk * F); resize(a.act, nk * F);
    resize(a.yp, nk * d);
  }
  resize(w.resid_final, n * d); resize(w.lnf, n * d); resize(w.lnf_rstd, n); resize(w.ce_lse, n);
  resize(w.tmp_d, n * d);

  k::RouterLosses total;
  k::embedding_forward(w.layers[0].resid.data(), tokens, P + w.embed, N, d, V);
  k::rmsnorm_forward(w.layers[0].ln1.data(), w.layers[0].ln1_rstd.data(), w.layers[0].resid.data(),
                     P + w.lp[0].ln1, N, d, cfg.rms_eps);
  for (int l = 0; l < L; ++l) {
    auto& a = w.layers[l];
    const auto& lp = w.lp[l];
    // ---- attention ----
    k::linear_forward(a.q_raw.data(), a.ln1.data(), P + lp.wq, N, d, static_cast<int>(qd));
    k::linear_forward(a.k_raw.data(), a.ln1.data(), P + lp.wk, N, d, static_cast<int>(kvd));
    k::linear_forward(a.v.data(), a.ln1.data(), P + lp.wv, N, d, static_cast<int>(kvd));
    k::qk_norm_rope_forward(a.q.data(), a.q_rstd.data(), a.q_raw.data(), P + lp.q_norm,
                            w.pos.data(), N, H, D, cfg.rms_eps, cfg.rope_theta);
    k::qk_norm_rope_forward(a.kk.data(), a.k_rstd.data(), a.k_raw.data(), P + lp.k_norm,
                            w.pos.data(), N, KV, D, cfg.rms_eps, cfg.rope_theta);
    k::attention_forward(a.att.data(), a.lse.data(), a.q.data(), a.kk.data(), a.v.data(), docs, B,
                         T_, H, KV, D);
    k::linear_forward(w.tmp_d.data(), a.att.data(), P + lp.wo, N, static_cast<int>(qd), d);
    k::fused_residual_rmsnorm_forward(a.h_mid.data(), a.ln2.data(), a.ln2_rstd.data(),
                                      w.tmp_d.data(), a.resid.data(), P + lp.ln2, N, d,
                                      cfg.rms_eps);
    // ---- MoE ----
    const k::RouterLosses rl =
        k::router_forward(a.logits.data(), a.probs.data(), a.topk_idx.data(), a.topk_w.data(),
                          a.ln2.data(), P + lp.router, N, d, E, K, cfg.norm_topk_prob);
    total.aux += rl.aux;
    total.z += rl.z;
    k::moe_permute_plan(a.offsets.data(), a.src_token.data(), a.dst_row.data(),
                        a.topk_idx.data(), N, K, E);
    k::moe_permute_forward(a.xp.data(), a.ln2.data(), a.src_token.data(), N, K, d);
    k::swiglu_experts_forward(a.yp.data(), a.gate.data(), a.up.data(), a.act.data(), a.xp.data(),
                              P + lp.expert0_gate, P + lp.expert0_up, P + lp.expert0_down,
                              cfg.expert_params(), a.offsets.data(), E, d, F);
    k::moe_unpermute_forward(w.tmp_d.data(), a.yp.data(), a.topk_w.data(), a.dst_row.data(), N,
                             K, d);
    // ---- residual add fused with the next norm ----
    if (l + 1 < L) {
      auto& nx = w.layers[l + 1];
      k::fused_residual_rmsnorm_forward(nx.resid.data(), nx.ln1.data(), nx.ln1_rstd.data(),
                                        w.tmp_d.data(), a.h_mid.data(), P + w.lp[l + 1].ln1, N,
                                        d, cfg.rms_eps);
    } else {
      k::fused_residual_rmsnorm_forward(w.resid_final.data(), w.lnf.data(), w.lnf_rstd.data(),
                                        w.tmp_d.data(), a.h_mid.data(), P + w.final_norm, N, d,
                                        cfg.rms_eps);
    }
  }
  return total;
}

template <class T>
Loss MoEModel<T>::forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T_,
                          const std::int32_t* doc_ids) {
  auto& w = *ws_;
  w.has_forward = false;
  const k::RouterLosses rl = forward_trunk(cfg_, opts_, params_.data(), w, tokens, B, T_, doc_ids);
  const std::int64_t N = static_cast<std::int64_t>(B) * T_;
  w.targets.assign(targets, targets + N);
  w.ce = k::lm_head_ce_forward(w.ce_lse.data(), w.lnf.data(), params_.data() + w.head,
                               w.targets.data(), N, cfg_.d_model, cfg_.vocab, k::kIgnoreIndex,
                               opts_.ce_chunk_rows);
  w.has_forward = true;
  Loss loss;
  loss.ce = w.ce.loss;
  loss.aux = rl.aux;
  loss.z = rl.z;
  loss.tokens = w.ce.valid;
  loss.total = loss.ce + cfg_.aux_loss_coef * loss.aux + cfg_.z_loss_coef * loss.z;
  return loss;
}

template <class T>
void MoEModel<T>::backward(T loss_scale) {
  auto& w = *ws_;
  GHT_EXPECTS(w.has_forward, "model backward: call forward() first (logits() does not count)");
  const ModelConfig& c = cfg_;
  const std::int64_t N = static_cast<std::int64_t>(w.B) * w.T_;
  const int d = c.d_model, H = c.heads, KV = c.kv_heads, D = c.head_dim, E = c.experts,
            K = c.top_k, F = c.expert_ffn, V = c.vocab;
  const std::int64_t qd = static_cast<std::int64_t>(H) * D, kvd = static_cast<std::int64_t>(KV) * D;
  const std::size_t n = static_cast<std::size_t>(N), nk = n * K;
  const T* P = params_.data();
  T* G = grads_.data();
  const std::int32_t* docs = w.doc_ids.empty() ? nullptr : w.doc_ids.data();
  const T aux_grad = loss_scale * static_cast<T>(c.aux_loss_coef);
  const T z_grad = loss_scale * static_cast<T>(c.z_loss_coef);

  std::vector<T>& dresid = w.tmp_d;   // gradient of the residual stream, (N, d)
  std::vector<T>& dnorm = w.tmp_d2;   // gradient of a norm output, (N, d)
  resize(dresid, n * d); resize(dnorm, n * d);
  resize(w.tmp_q, n * qd); resize(w.tmp_q2, n * qd);
  resize(w.tmp_kv, n * kvd); resize(w.tmp_kv2, n * kvd); resize(w.tmp_kv3, n * kvd);
  resize(w.tmp_xp, nk * d); resize(w.tmp_yp, nk * d); resize(w.tmp_w, nk);

  k::lm_head_ce_backward(dnorm.data(), G + w.head, w.lnf.data(), P + w.head, w.targets.data(),
                         w.ce_lse.data(), N, d, V, loss_scale, w.ce.valid, k::kIgnoreIndex,
                         opts_.ce_chunk_rows);
  std::fill(dresid.begin(), dresid.end(), T(0));
  k::fused_residual_rmsnorm_backward(dresid.data(), G + w.final_norm, dnorm.data(),
                                     w.resid_final.data(), P + w.final_norm, w.lnf_rstd.data(), N,
                                     d);
  for (int l = c.layers - 1; l >= 0; --l) {
    auto& a = w.layers[l];
    const auto& lp = w.lp[l];
    // dresid is now the gradient of (h_mid + moe_out): both receive it.
    // ---- MoE ----
    k::moe_unpermute_backward(w.tmp_yp.data(), w.tmp_w.data(), dresid.data(), a.yp.data(),
                              a.topk_w.data(), a.dst_row.data(), N, K, d);
    k::swiglu_experts_backward(w.tmp_xp.data(), G + lp.expert0_gate, G + lp.expert0_up,
                               G + lp.expert0_down, w.tmp_yp.data(), a.xp.data(), a.gate.data(),
                               a.up.data(), a.act.data(), P + lp.expert0_gate, P + lp.expert0_up,
                               P + lp.expert0_down, c.expert_params(), a.offsets.data(), E, d, F);
    k::moe_permute_backward(dnorm.data(), w.tmp_xp.data(), a.dst_row.data(), N, K, d);
    k::router_backward(dnorm.data(), G + lp.router, w.tmp_w.data(), aux_grad, z_grad,
                       a.logits.data(), a.probs.data(), a.topk_idx.data(), a.topk_w.data(),
                       a.ln2.data(), P + lp.router, N, d, E, K, c.norm_topk_prob);
    k::fused_residual_rmsnorm_backward(dresid.data(), G + lp.ln2, dnorm.data(), a.h_mid.data(),
                                       P + lp.ln2, a.ln2_rstd.data(), N, d);
    // dresid is now the gradient of h_mid = resid + o_proj(att).
    // ---- attention ----
    T* datt = w.tmp_q.data();
    k::linear_backward(datt, G + lp.wo, dresid.data(), a.att.data(), P + lp.wo, N,
                       static_cast<int>(qd), d);
    T* dq = w.tmp_q2.data();
    T* dk = w.tmp_kv.data();
    T* dv = w.tmp_kv2.data();
    k::attention_backward(dq, dk, dv, datt, a.q.data(), a.kk.data(), a.v.data(), a.att.data(),
                          a.lse.data(), docs, w.B, w.T_, H, KV, D);
    // QK-norm/RoPE backward; the raw-projection gradients reuse buffers no longer needed.
    T* dq_raw = datt;
    T* dk_raw = w.tmp_kv3.data();
    k::qk_norm_rope_backward(dq_raw, G + lp.q_norm, dq, a.q_raw.data(), P + lp.q_norm,
                             a.q_rstd.data(), w.pos.data(), N, H, D, c.rope_theta);
    k::qk_norm_rope_backward(dk_raw, G + lp.k_norm, dk, a.k_raw.data(), P + lp.k_norm,
                             a.k_rstd.data(), w.pos.data(), N, KV, D, c.rope_theta);
    k::linear_backward(dnorm.data(), G + lp.wq, dq_raw, a.ln1.data(), P + lp.wq, N, d,
                       static_cast<int>(qd));
    k::linear_backward(dnorm.data(), G + lp.wk, dk_raw, a.ln1.data(), P + lp.wk, N, d,
                       static_cast<int>(kvd), /*accumulate_dinp=*/true);
    k::linear_backward(dnorm.data(), G + lp.wv, dv, a.ln1.data(), P + lp.wv, N, d,
                       static_cast<int>(kvd), /*accumulate_dinp=*/true);
    k::rmsnorm_backward(dresid.data(), G + lp.ln1, dnorm.data(), a.resid.data(), P + lp.ln1,
                        a.ln1_rstd.data(), N, d);
    // dresid is now the gradient of this layer's input stream.
  }
  k::embedding_backward(G + w.embed, dresid.data(), w.tokens.data(), N, d, V);
}

template <class T>
void MoEModel<T>::logits(float* out, const std::int32_t* tokens, int B, int T_, bool last_only,
                         const std::int32_t* doc_ids) {
  auto& w = *ws_;
  w.has_forward = false;
  forward_trunk(cfg_, opts_, params_.data(), w, tokens, B, T_, doc_ids);
  const int d = cfg_.d_model, V = cfg_.vocab;
  const std::int64_t rows = last_only ? B : static_cast<std::int64_t>(B) * T_;
  std::vector<T> x(static_cast<std::size_t>(rows) * d);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t src = last_only ? (r * T_ + T_ - 1) : r;
    std::copy_n(w.lnf.data() + src * d, d, x.data() + r * d);
  }
  // Row chunks bound the temporary logits like the training path does.
  const std::int64_t chunk = opts_.ce_chunk_rows;
  std::vector<T> lg(static_cast<std::size_t>(std::min(rows, chunk)) * V);
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const std::int64_t nr = std::min(chunk, rows - r0);
    k::matmul_nt(lg.data(), x.data() + r0 * d, params_.data() + w.head, nr, V, d);
    for (std::int64_t i = 0; i < nr * V; ++i) out[r0 * V + i] = static_cast<float>(lg[i]);
  }
}

template class MoEModel<float>;
template class MoEModel<double>;

}  // namespace ght::trainer
