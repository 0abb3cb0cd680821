// The per-call cost of every op of a CUDA training step (see op_costs.hpp). Each entry names the
// kernels behind its label in model_cuda.cpp; bytes are the minimum traffic (every operand read
// once, every result written once; an accumulated result is read and written; a weight gradient
// is read in grad_read_share of the calls, the mean over a step's micro-batches).
#include "trainer/cuda/op_costs.hpp"

#include <algorithm>

namespace ght::trainer {

namespace {

// A GEMM C(m, n) = A(m, k)·B(k, n) with bf16 operands and c_bytes-sized C, read first (β = 1) in
// a `reads` share of the calls: kernels/cuda/README.md's dense GEMM row.
OpCost gemm(double m, double n, double k, double c_bytes, double reads) {
  return {2 * m * n * k, 2 * (m * k + k * n) + c_bytes * m * n * (1 + reads)};
}

OpCost operator+(OpCost a, OpCost b) { return {a.flops + b.flops, a.bytes + b.bytes}; }

}  // namespace

std::map<std::string, OpCost, std::less<>> op_cost_table(const ModelConfig& mc, const OpCostInputs& in) {
  const double B = mc.micro_batch, T = mc.seq_len, N = B * T, C = mc.d_model, V = mc.vocab;
  const double H = mc.heads, KV = mc.kv_heads, D = mc.head_dim, E = mc.experts, K = mc.top_k;
  const double F = mc.expert_ffn, R = N * K, QKV = (H + 2 * KV) * D, HD = H * D;
  const double G = in.grad_bytes, P = static_cast<double>(mc.total_params());
  const double Gw = G * (1 + in.grad_read_share);  // bytes per weight-gradient element and call
  const double heads_qk = (H + KV) * D;  // q and k rows of one token, normed and rotated
  const OpCost none{0, 0};
  // Gather (permute), its backward and the weighted combine: R rows of C on one side, N on the
  // other, plus the index/weight arrays.
  const OpCost gather{0, 2 * (N + R) * C + 4 * R};

  std::map<std::string, OpCost, std::less<>> t;
  // ---- host-side or tiny: no formula ----
  t["allocate activations"] = none;
  t["upload tokens"] = none;
  t["expert offsets download"] = none;  // a stream sync and a few bytes: its cost is the wait
  t["loss copy"] = none;
  t["loss readback"] = none;
  // zero_grad(), and in training GradWrite::assign's clearing of the few atomic accumulators.
  t["zero gradients"] = none;
  // Outside training steps (loading, checkpoints, logits for sampling): listed so that every
  // label of the model is known.
  for (const char* op : {"weight upload", "weight download", "gradient download",
                         "allocate logits buffer", "logits GEMM", "routing download",
                         // CUDA graphs run untraced (a tracer turns them off): labels only.
                         "CUDA graph capture", "CUDA graph launch"}) {
    t[op] = none;
  }
  // ---- forward ----
  t["embedding forward"] = {0, 4 * N * C};
  t["input_layernorm"] = {4 * N * C, 4 * N * C};
  t["recompute: input_layernorm"] = t["input_layernorm"];
  t["q/k/v projection"] = gemm(N, QKV, C, 2, 0);
  t["q/k RMSNorm + RoPE"] = {12 * N * heads_qk, 4 * N * heads_qk};
  t["attention forward"] = {2 * B * H * T * T * D, 4 * B * T * (H + KV) * D + 4 * B * H * T};  // causal
  t["o_proj"] = gemm(N, C, HD, 2, 0);
  // Residual add fused with the norm: reads x and the residual, writes the sum and the normed.
  const OpCost fused_norm{4 * N * C, 8 * N * C};
  t["residual add + post_attention_layernorm"] = fused_norm;
  t["residual add + input_layernorm"] = fused_norm;
  t["residual add + final norm"] = fused_norm;
  t["router"] = {2 * N * C * E + (6 + 2 * K) * N * E, 2 * N * C + 2 * E * C + 8 * N * E + 8 * N * K};
  t["permutation plan"] = {0, 12 * N * K};
  t["permute"] = gather;
  // The three in one call (GHT_FUSED_KERNELS): topk_idx is not read again by a separate plan.
  t["router + permutation (fused)"] = t["router"] + OpCost{0, 4 * N * K} + gather;
  t["router + permutation plan (fused)"] = t["router"] + OpCost{0, 4 * N * K};  // FP8 experts: no bf16 gather
  // Grouped GEMMs over the experts, var-M: R rows in total, every expert's weight read once.
  t["expert gate_up grouped GEMM"] = {2 * R * 2 * F * C, 2 * (R * C + E * 2 * F * C) + 2 * R * 2 * F};
  t["SwiGLU forward"] = {5 * R * F, 6 * R * F};
  t["expert down_proj grouped GEMM"] = {2 * R * C * F, 2 * (R * F + E * C * F) + 2 * R * C};
  // GHT_FP8=experts (trainer/fp8_experts.hpp): the activations' 1 x 128 quantisation fused into the
  // permutation's scatter (each token's bf16 row read once, e4m3 and a scale per 128 written to its
  // K rows) and into SwiGLU (its e4m3 copy besides the bf16 one), then the GEMMs on 1-byte operands;
  // the weights' 128 x 128 quantisation once per layer and step, its own op.
  auto quant = [](double rows, double cols) { return OpCost{3 * rows * cols, 3 * rows * cols + 4 * rows * cols / 128}; };
  t["permute + FP8 quantisation"] = {3 * R * C, 2 * N * C + R * C + 4 * R * C / 128 + 4 * R};
  t["SwiGLU forward + FP8 quantisation"] = t["SwiGLU forward"] + OpCost{3 * R * F, R * F + 4 * R * F / 128};
  t["expert gate_up grouped GEMM (FP8)"] =
      OpCost{2 * R * 2 * F * C, R * C + E * 2 * F * C + 4 * (R + E * 2 * F / 128) * C / 128 + 2 * R * 2 * F};
  t["expert down_proj grouped GEMM (FP8)"] =
      OpCost{2 * R * C * F, R * F + E * C * F + 4 * (R + E * C / 128) * F / 128 + 2 * R * C};
  t["FP8 expert weight quantisation"] = quant(E * 3 * F, C);
  t["un-permute (combine)"] = gather;
  t["LM head + cross-entropy (forward)"] = {2 * N * V * C, 4 * N * V + 2 * N * C + 2 * V * C};
  // Logits chunk written, read, dlogits written (2·N·V each); x and W read, dx written, dW
  // accumulated (tied embedding: the gradient is the embedding's).
  t["LM head + cross-entropy (forward and backward)"] = {6 * N * V * C,
                                                         6 * N * V + 4 * N * C + 2 * V * C + Gw * V * C};
  // ---- backward ----
  t["final norm backward"] = {10 * N * C, 10 * N * C};  // 8NC + the 2NC memset of dresid
  // U distinct token ids, at most min(N, V): their rows of the gradient are accumulated.
  t["embedding backward"] = {N * C, 2 * N * C + 2 * G * std::min(N, V) * C + 16 * N};
  // dy (N rows) and the expert outputs (R rows) read for the combine weights' gradient, dy
  // scattered to R rows.
  t["un-permute backward"] = {0, 2 * (N + 2 * R) * C + 8 * R};
  t["expert down_proj grouped GEMM (backward, data)"] = {2 * R * F * C, 2 * (R * C + E * F * C) + 2 * R * F};
  // var-K: each expert's (m, n) weight gradient accumulated over its rows.
  t["expert down_proj grouped GEMM (backward, weights)"] = {2 * C * F * R, 2 * R * (C + F) + Gw * E * C * F};
  t["SwiGLU backward"] = {10 * R * F, 10 * R * F};
  t["permute (re-gather for the weight gradient)"] = gather;
  t["expert gate_up grouped GEMM (backward, weights)"] = {2 * 2 * F * C * R,
                                                          2 * R * (2 * F + C) + Gw * E * 2 * F * C};
  t["expert gate_up grouped GEMM (backward, data)"] = {2 * R * C * 2 * F, 2 * (R * 2 * F + E * C * 2 * F) + 2 * R * C};
  t["permute backward"] = gather;
  // Two GEMMs on bf16 dlogits (dx accumulated into the norm's gradient, dW), softmax backward.
  t["router backward"] = {4 * N * C * E + 8 * N * E, 6 * N * C + 2 * E * C + 8 * N * E + 8 * N * K + 2 * G * E * C};
  const OpCost norm_bwd{10 * N * C, 8 * N * C};
  t["post_attention_layernorm backward"] = norm_bwd;
  t["input_layernorm backward"] = norm_bwd;
  t["o_proj backward"] = gemm(N, HD, C, 2, 0) + gemm(C, HD, N, G, in.grad_read_share);
  t["attention backward"] = {5 * B * H * T * T * D, 8 * B * T * (H + KV) * D + 4 * B * H * T};  // ≈2.5× forward
  t["q/k RMSNorm + RoPE backward"] = {20 * N * heads_qk, 8 * N * heads_qk};
  t["q/k/v projection backward"] = gemm(N, C, QKV, 2, 0) + gemm(QKV, C, N, G, in.grad_read_share);
  // ---- the step around the model ----
  t[kOpGradStream] = none;  // link traffic
  t[kOpSpeculate] = none;   // a part of the update, of varying size
  // Once per step over every parameter: the norm reads the gradients; the update reads the
  // gradient and master/m/v, writes master/m/v and the bf16 weight.
  t[kOpGradNorm] = in.optimizer_state_in_hbm ? OpCost{0, G * P} : none;
  t[kOpUpdate] = in.optimizer_state_in_hbm ? OpCost{0, (G + 3 * 8 + 2) * P} : none;
  return t;
}

}  // namespace ght::trainer
