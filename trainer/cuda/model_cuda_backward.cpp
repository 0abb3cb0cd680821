// The CUDA model's backward: the LM head's loss and gradient, every layer from the last, the
// embedding; the gradients in fp32 or bf16 (GT).
#include "trainer/cuda/model_cuda_impl.hpp"

namespace ght::trainer {

// dnorm holds d(loss)/d(lnf): final norm, every layer, embedding.
template <class GT>
void CudaMoEModel::Impl::backward_body(float loss_scale) {
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
      layer_forward(l, r, scratch_losses + l, false, false);  // the forward's FP8 copies serve
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
void CudaMoEModel::Impl::layer_backward(int l, Acts& a, float loss_scale) {
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
void CudaMoEModel::Impl::head_forward_backward(float loss_scale, float* ce_loss, std::int32_t* valid) {
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
void CudaMoEModel::Impl::clear_accumulated_grads() {
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
void CudaMoEModel::Impl::head_and_body_backward(float loss_scale, float* ce_loss, std::int32_t* valid) {
  if (grad_write == GradWrite::assign) clear_accumulated_grads<GT>();
  head_forward_backward<GT>(loss_scale, ce_loss, valid);
  backward_body<GT>(loss_scale);
}

// compute() and run_backward() (model_cuda_graphs.cpp) take both gradient types.
template void CudaMoEModel::Impl::head_and_body_backward<float>(float, float*, std::int32_t*);
template void CudaMoEModel::Impl::head_and_body_backward<bf16>(float, float*, std::int32_t*);

}  // namespace ght::trainer
