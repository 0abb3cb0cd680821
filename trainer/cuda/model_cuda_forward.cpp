// The CUDA model's forward: the GEMM helpers (dense, grouped over the experts), one layer, and the
// trunk over every layer.
#include "trainer/cuda/model_cuda_impl.hpp"

namespace ght::trainer {

void CudaMoEModel::Impl::gemm(std::int64_t m, std::int64_t n_, std::int64_t k, const bf16* a, bool ta, const bf16* b,
          bool tb, void* c, kc::DType ct, float beta, std::int64_t lda) {
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

kc::GroupOffsets CudaMoEModel::Impl::offsets_of(const Acts& a) const {
  kc::GroupOffsets o;
  o.groups = static_cast<int>(E);
  o.device = a.offsets;
  o.host = a.host_offsets.empty() ? nullptr : a.host_offsets.data();
  o.max_rows = tokens_n() * K;
  return o;
}

// var-M over the experts: C[rows_e] = A[rows_e]·op(B_e) (+ beta·C); B_e = b + e·3dF.
void CudaMoEModel::Impl::grouped_m(const Acts& a, std::int64_t n_, std::int64_t k, const bf16* A, const bf16* B_,
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
void CudaMoEModel::Impl::grouped_k(const Acts& a, std::int64_t m, std::int64_t n_, const bf16* A, const bf16* B_,
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

kc::AttentionShape CudaMoEModel::Impl::att_shape() const {
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

// Layer l from a.ln1 (and a.resid) to the expert outputs a.yp; with `combine`, the MoE output
// (N, d) lands in tmp_d.
void CudaMoEModel::Impl::layer_forward(int l, Acts& a, kc::RouterLossesDevice* losses, bool combine,
                                       bool quantize_weights) {
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
  // FP8 experts read the permuted input as e4m3 codes, quantised while scattering (no bf16 copy in
  // expert order: the backward gathers its own).
  bf16* const xp = opts.fp8_experts ? nullptr : big;
  if (opts.fused_kernels) {
    if (xp != nullptr) {
      op("router + permutation (fused)", l);
    } else {
      op("router + permutation plan (fused)", l);
    }
    kc::router_route_forward(a.logits, a.probs, a.topk_idx, a.topk_w, losses,
                             {a.offsets, a.src_token, a.dst_row, xp}, a.ln2, W + x.router, N,
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
    if (xp != nullptr) {
      op("permute", l);
      kc::moe_permute_forward_by_token(xp, a.ln2, a.dst_row, N, static_cast<int>(K), static_cast<int>(d), stream);
    }
  }
  if (opts.fp8_experts) {
    op("permute + FP8 quantisation", l);
    kc::quantize_fp8_rows_scatter(fp8_act, fp8_act_scales, a.ln2, a.dst_row, N, static_cast<int>(K), d, stream);
  }
  if (kc::needs_host_offsets(opts.expert_impl)) {
    op("expert offsets download", l);
    a.host_offsets = kc::download_offsets(a.offsets, static_cast<int>(E), stream);
  } else {
    a.host_offsets.clear();
  }
  if (opts.fp8_experts) {
    if (quantize_weights) fp8_quantize_weights(l);
    op("expert gate_up grouped GEMM (FP8)", l);
    fp8_grouped_m(l, a, true, a.gu);
    op("SwiGLU forward + FP8 quantisation", l);
    kc::swiglu_forward_fp8(a.act, F, fp8_act, fp8_act_scales, a.gu, a.gu + F, 2 * F, NK, static_cast<int>(F),
                           stream);
    op("expert down_proj grouped GEMM (FP8)", l);
    fp8_grouped_m(l, a, false, a.yp);
  } else {
    op("expert gate_up grouped GEMM", l);
    grouped_m(a, 2 * F, d, big, W + x.expert0, d, true, a.gu);
    op("SwiGLU forward", l);
    kc::swiglu_forward(a.act, F, a.gu, a.gu + F, 2 * F, NK, static_cast<int>(F), stream);
    op("expert down_proj grouped GEMM", l);
    grouped_m(a, d, F, a.act, W + x.expert0 + 2 * d * F, F, true, a.yp);
  }
  if (combine) {
    op("un-permute (combine)", l);
    kc::moe_unpermute_forward(tmp_d, a.yp, a.topk_w, a.dst_row, N, static_cast<int>(K),
                              static_cast<int>(d), stream);
  }
}

// Everything up to the final norm output lnf. losses: (L) device router losses.
// With FP8 experts and changed weights, each layer quantises its expert weights first (recomputed
// layers in backward reuse those copies).
void CudaMoEModel::Impl::trunk(kc::RouterLossesDevice* losses) {
  const std::int64_t N = tokens_n();
  const bool quantize_weights = opts.fp8_experts && fp8_stale;
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
    layer_forward(l, a, losses + l, true, quantize_weights);
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
Acts& CudaMoEModel::Impl::layer_acts(int l) {
  Acts& own = acts[static_cast<std::size_t>(l)];
  if (!opts.recompute[static_cast<std::size_t>(l)]) return own;
  rc.resid = own.resid;
  return rc;
}

}  // namespace ght::trainer
