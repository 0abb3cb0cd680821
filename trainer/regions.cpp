#include "trainer/regions.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <tuple>

#include "optimizer/adamw.hpp"
#include "tier/config.hpp"
#include "tier/cost_model.hpp"
#include "tier/error.hpp"
#include "trainer/fp8_experts.hpp"

namespace ght::trainer {

namespace {

using tier::Access;
using tier::GpuPath;
using tier::Region;

struct Group {
  std::string name;   // region name prefix
  std::string label;  // table group
  std::int64_t params = 0;
  int layer = -1;
  int expert = -1;
  double frequency = 0;
  double weight_reads = 0;  // bytes the GPU reads of the bf16 weight per micro-batch
  double backward_left = 0; // share of backward still to run once its gradient is complete
  double head_chunks = 0;   // LM-head chunks per micro-batch whose dW GEMM accumulates this gradient
};

Access make_access(const char* what, double times, double window, GpuPath path) {
  Access a;
  a.what = what;
  // The update is a pass over its bytes of its own; the other accesses are the compute's.
  a.hbm_pass = std::string_view(what) == "optimizer";
  if (a.hbm_pass) a.hbm_pass_share = config::cfg().get_float(config::Key::GHT_ASSUMED_HBM_UPDATE);
  a.times_per_step = times;
  a.window_fraction = window;
  a.gpu_path = path;
  return a;
}

void add_group(const ModelConfig& c, const Group& g, optimizer::StateType st, int ranks, std::vector<Region>& out) {
  const double P = static_cast<double>(g.params);
  const auto p = static_cast<std::uint64_t>(g.params);
  // ZeRO-1: one rank updates (and holds the state of) 1/ranks of the group.
  const auto n_ranks = static_cast<std::uint64_t>(ranks);
  const std::uint64_t p_rank = (p + n_ranks - 1) / n_ranks;
  const double P_rank = P / ranks;
  const double ga = c.grad_accum;
  const double tokens = static_cast<double>(c.seq_len) * c.micro_batch;
  const double routed = g.expert >= 0 ? tokens : 0;  // expert accesses need a routed token
  const double opt_window = update_window_fraction(c.grad_accum);
  const std::uint64_t gb = optimizer::grad_type_size(hbm_grad_type());  // HBM accumulator
  // m and v: optimizer::state_bytes of the group's parameters (q8: whole 256-element block
  // records over the group, within one record per tensor of the optimizer's per-tensor regions).
  const std::uint64_t moment = optimizer::state_bytes(st, p_rank);
  // The update's HBM bytes per parameter: the bf16 weight written, the gradient read, master, m
  // and v read and written.
  const double update_bytes =
      tier::kUpdateWeightBytes + static_cast<double>(gb) +
      2.0 * (sizeof(float) + 2.0 * static_cast<double>(moment) / std::max<double>(1, p_rank));
  auto optimizer_access = [&] {
    Access a = make_access("optimizer", 1, opt_window, GpuPath::kernel);
    // 0 where the update is bandwidth-bound; the q8 update's parameter rate, as bytes, where not.
    a.hbm_pass_bps = optimizer::gpu_update_params_per_second(st) * update_bytes;
    return a;
  };
  auto base = [&](const char* suffix, ght::TensorClass cls, std::uint64_t bytes) {
    Region r;
    r.name = g.name + "." + suffix;
    r.cls = cls;
    r.group = g.label;
    r.bytes = bytes;
    r.layer = g.layer;
    r.expert = g.expert;
    r.routing_frequency = g.frequency;
    return r;
  };

  Region w = base("weight", ght::TensorClass::weight, 2 * p);
  Access fwd_bwd = make_access("compute", ga, 1.0, GpuPath::copy);
  fwd_bwd.gpu_read_bytes = g.weight_reads;
  fwd_bwd.routing_tokens = routed;
  Access w_opt = optimizer_access();
  w_opt.gpu_write_bytes = 2 * P_rank;  // the other ranks' parts arrive by all-gather (GPU to GPU)
  w.access = {fwd_bwd, w_opt};
  // The GPU computes on every bf16 weight in place each micro-batch; the trainer has no path
  // that streams weights in, so they must be in HBM (a plan that cannot hold them is infeasible).
  w.host_allowed = false;
  out.push_back(std::move(w));

  Region gr = base("grad", ght::TensorClass::grad, gb * p);
  gr.host_bytes = 4 * p;
  gr.hbm_bytes_on_host = 2 * p;  // streamed: the bf16 gradient of one micro-batch stays in HBM
  Access acc_hbm = make_access("compute", ga, 1.0, GpuPath::copy);
  acc_hbm.gpu_read_bytes = static_cast<double>(gb) * P;
  acc_hbm.gpu_write_bytes = static_cast<double>(gb) * P;
  acc_hbm.routing_tokens = routed;
  // The weight-gradient GEMMs read and write the accumulator each micro-batch; what they do not
  // hide lengthens the backward. The tied embedding's (and an untied LM head's) is the LM head's
  // dW GEMM, once per chunk and not hidden (kLmHeadAccumulatorExposed); the untied input
  // embedding's is a scatter of the micro-batch's rows (not counted). Streamed, the GEMM writes
  // the bf16 gradient and the copy reads it: counted the same, one access in both lists, so that a
  // gradient's tier does not change its backward (streaming's own HBM traffic is not measured
  // yet; the placement trades it on link and memory alone).
  const bool head = g.head_chunks > 0;
  Access backward_pass = make_access("compute", head ? ga * g.head_chunks : ga, 1.0, GpuPath::copy);
  backward_pass.backward_hbm_bytes = 2.0 * static_cast<double>(gb) * P;
  backward_pass.backward_exposed =
      head ? kLmHeadAccumulatorExposed
           : (g.name == "embed" ? 0.0 : config::cfg().get_float(config::Key::GHT_ASSUMED_ACC_EXPOSED));
  backward_pass.routing_tokens = routed;
  Access opt_hbm = optimizer_access();
  opt_hbm.gpu_read_bytes = static_cast<double>(gb) * P_rank;
  gr.access = {acc_hbm, backward_pass, opt_hbm};
  // With several ranks the gradients are reduced in HBM (NCCL): the trainer has no reduction of
  // host-accumulated ones.
  gr.host_allowed = ranks == 1;
  // Streaming: every micro-batch copies the bf16 gradient down and the CPU adds it into the fp32
  // accumulator (reads 2 B and, after the first micro-batch, 4 B; writes 4 B per param). The
  // first grad_accum - 1 micro-batches can hide anywhere in the step; the last one only in the
  // backward left after this gradient is complete (backward_share of a micro-batch's compute),
  // since the optimizer needs the sum: the embedding's, finished last, is on the critical path.
  const double tail_window = backward_share() * g.backward_left / ga;
  std::vector<Access> host;
  if (c.grad_accum > 1) {
    Access stream = make_access("grad_stream", ga - 1, 1.0, GpuPath::copy);
    stream.gpu_write_bytes = 2 * P;
    stream.routing_tokens = routed;
    Access accumulate = make_access("accumulate", 1, 1.0, GpuPath::copy);
    accumulate.cpu_read_bytes = 2 * P * (ga - 1) + 4 * P * (ga - 2);
    accumulate.cpu_write_bytes = 4 * P * (ga - 1);
    accumulate.routing_tokens = routed;
    host.push_back(stream);
    host.push_back(accumulate);
  }
  Access last_stream = make_access("grad_stream", 1, tail_window, GpuPath::copy);
  last_stream.gpu_write_bytes = 2 * P;
  last_stream.routing_tokens = routed;
  last_stream.overlappable = tail_window > 0;
  Access last_accumulate = make_access("accumulate", 1, tail_window, GpuPath::copy);
  last_accumulate.cpu_read_bytes = 2 * P + (c.grad_accum > 1 ? 4 * P : 0);
  last_accumulate.cpu_write_bytes = 4 * P;
  last_accumulate.routing_tokens = routed;
  last_accumulate.overlappable = tail_window > 0;
  host.push_back(last_stream);
  host.push_back(last_accumulate);
  Access opt_host = optimizer_access();
  opt_host.gpu_read_bytes = 4 * P;
  host.push_back(opt_host);
  host.push_back(backward_pass);
  gr.host_access = std::move(host);
  out.push_back(std::move(gr));

  const std::tuple<const char*, ght::TensorClass, std::uint64_t> states[] = {
      {"master", ght::TensorClass::master, sizeof(float) * p_rank},
      {"adam_m", ght::TensorClass::adam_m, moment},
      {"adam_v", ght::TensorClass::adam_v, moment}};
  for (const auto& [suffix, cls, bytes] : states) {
    Region s = base(suffix, cls, bytes);
    Access a = optimizer_access();
    // This rank's share of the group's traffic (P / ranks; the bytes are of the ceil(P / ranks)
    // it holds): 1 with one rank.
    const double share = P_rank / static_cast<double>(p_rank);
    a.gpu_read_bytes = static_cast<double>(bytes) * share;
    a.gpu_write_bytes = static_cast<double>(bytes) * share;
    s.access = {a};
    out.push_back(std::move(s));
  }
}

}  // namespace

ActivationSizes activation_sizes(const ModelConfig& c, std::int64_t lm_head_rows) {
  c.validate();
  // Byte for byte what CudaMoEModel allocates for one micro-batch of N tokens
  // (trainer/cuda/model_cuda.cpp, ensure_capacity): per layer the buffers saved for backward,
  // then the buffers every layer shares.
  const std::uint64_t d = c.d_model, N = static_cast<std::uint64_t>(c.seq_len) * c.micro_batch;
  const std::uint64_t H = c.heads, KV = c.kv_heads, D = c.head_dim, E = c.experts;
  const std::uint64_t K = c.top_k, F = c.expert_ffn, V = c.vocab, L = c.layers;
  const std::uint64_t HD = H * D, QK = (H + KV) * D, QKV = (H + 2 * KV) * D;
  // ln1, h_mid, ln2 (bf16); rstds, q/k rstd, lse, router logits/probs (fp32); qkv, q/k, att
  // (bf16); top-k weights, ids, src_token, dst_row (4 B per routed row); expert gate_up, act,
  // output (bf16 per routed row).
  const std::uint64_t saved_per_token = 2 * 3 * d + 4 * 2 + 2 * QKV + 2 * QK + 4 * H + 4 * KV + 2 * HD +
                                        4 * H + 8 * E + K * (4 * 4 + 2 * 3 * F + 2 * d);
  const std::uint64_t layer_input = 2 * d * N;
  ActivationSizes s;
  s.keep_per_layer = layer_input + saved_per_token * N + 4 * (E + 1);
  s.recompute_scratch = s.keep_per_layer - layer_input;
  s.checkpoint_per_layer = layer_input;
  const double active_layer = static_cast<double>(c.layer_dense_params()) +
                              static_cast<double>(c.top_k) * static_cast<double>(c.expert_params());
  s.recompute_flops_per_layer =
      static_cast<double>(c.grad_accum) * static_cast<double>(N) *
      (2.0 * active_layer + 4.0 * c.heads * c.head_dim * static_cast<double>(c.seq_len));
  // Shared: final stream, final norm output, tmp, d stream, d norm (bf16, N x d), final rstd,
  // d attention, d qkv, d q/k; per routed row the permuted rows, d gate_up, d act, d top-k
  // weight; tokens, targets, positions; the LM-head chunk (bf16 logits, default_ce_chunk_rows);
  // the loss read-back slots (63) and the router losses.
  const std::uint64_t shared_per_token = 2 * 5 * d + 4 + 2 * HD + 2 * QKV + 2 * QK + K * (2 * d + 2 * 3 * F + 4) + 3 * 4;
  const auto ce_rows = static_cast<std::uint64_t>(lm_head_chunk_rows(c, lm_head_rows));
  const std::uint64_t ce = (ce_rows * V * 2 + 255) / 256 * 256;
  const std::uint64_t slots = cuda_loss_slot_bytes(c.layers) * kCudaLossSlots + 8 * L;
  s.workspace = shared_per_token * N + ce + slots;
  return s;
}

std::size_t cuda_loss_slot_bytes(int layers) {
  return (8 + 8 * static_cast<std::size_t>(layers) + 255) / 256 * 256;  // ce, valid; aux, z per layer
}

namespace {

/// Rows per LM-head chunk: the whole of `tokens` where its bf16 logits fit `logits_bytes`, else
/// equal chunks of at most that many rows (a multiple of 64 where at least 64 fit), their count
/// rounded up to a power of two when `power_of_two_count`.
std::int64_t chunk_rows(std::int64_t tokens, std::int64_t vocab, std::uint64_t logits_bytes,
                        bool power_of_two_count) {
  GHT_EXPECTS(tokens > 0 && vocab > 0, "LM-head chunk: need tokens > 0 and vocab > 0, got tokens=" +
                                           std::to_string(tokens) + " vocab=" + std::to_string(vocab));
  const std::uint64_t row_bytes = 2 * static_cast<std::uint64_t>(vocab);
  if (static_cast<std::uint64_t>(tokens) <= logits_bytes / row_bytes) return tokens;
  std::int64_t most = std::max<std::int64_t>(1, static_cast<std::int64_t>(logits_bytes / row_bytes));
  if (most >= 64) most = most / 64 * 64;
  std::int64_t chunks = (tokens + most - 1) / most;
  // More chunks only shrink the logits, so the budget still holds.
  if (power_of_two_count) chunks = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(chunks)));
  std::int64_t rows = (tokens + chunks - 1) / chunks;
  if (most >= 64) rows = (rows + 63) / 64 * 64;
  return std::min(rows, most);
}

}  // namespace

std::int64_t ce_chunk_rows_within(std::int64_t tokens, std::int64_t vocab, std::uint64_t logits_bytes) {
  return chunk_rows(tokens, vocab, logits_bytes, false);
}

std::int64_t lm_head_chunk_rows(const ModelConfig& c, std::int64_t lm_head_rows) {
  const std::int64_t N = static_cast<std::int64_t>(c.seq_len) * c.micro_batch;
  return std::min(lm_head_rows > 0 ? lm_head_rows : default_ce_chunk_rows(N, c.vocab), N);
}

std::int64_t default_ce_chunk_rows(std::int64_t tokens, std::int64_t vocab) {
  const std::int64_t forced = config::cfg().get_int(config::Key::GHT_LM_HEAD_ROWS);
  if (forced > 0 && tokens > 0) return std::min(forced, tokens);
  // A power-of-two count of chunks: at 16384 tokens and vocab 151,936 three chunks of 5504 rows
  // measured 97.3 ms and four of 4096 93.1 ms (bench_lm_head, bench/NOTES.md, "LM head").
  return chunk_rows(tokens, vocab, kLmHeadLogitsBudget, true);
}

ModelPlan plan_model(const ModelConfig& c, const tier::PlanOptions& options, int ranks,
                     const tier::Measurements* measured) {
  const std::int64_t N = static_cast<std::int64_t>(c.seq_len) * c.micro_batch;
  const std::int64_t fast = default_ce_chunk_rows(N, c.vocab);
  const std::int64_t small = ce_chunk_rows_within(N, c.vocab, kLmHeadSmallLogits);
  auto plan = [&](std::int64_t rows) { return tier::make_plan(model_regions(c, {}, ranks, rows), options, measured); };
  // The choice goes into the plan's notes (`ght plan --explain`, the plan's JSON).
  auto noted = [&](const tier::Plan& p, std::int64_t rows, const std::string& why) {
    std::vector<std::string> notes = p.notes();
    notes.push_back("LM head: " + std::to_string(rows) + " of " + std::to_string(N) + " rows per chunk (" +
                    config::format_bytes(2 * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(c.vocab)) +
                    " of bf16 logits): " + why);
    return ModelPlan{tier::Plan(p.options(), p.regions(), p.decisions(), p.prediction(), std::move(notes)), rows};
  };
  if (config::cfg().get_int(config::Key::GHT_LM_HEAD_ROWS) > 0) return noted(plan(fast), fast, "GHT_LM_HEAD_ROWS");
  if (fast <= small) return noted(plan(fast), fast, "the whole micro-batch");
  const tier::Plan base = plan(small);
  const std::string short_of = "the " + std::to_string(fast) + "-row chunk would move other regions out of HBM";
  tier::Plan wide;
  try {
    wide = plan(fast);
  } catch (const tier::infeasible_plan&) {
    return noted(base, small, short_of);
  }
  // Both plans list the same regions in the same order; only the workspace's bytes differ.
  const auto& a = base.decisions();
  const auto& b = wide.decisions();
  const bool same = a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const tier::Decision& x, const tier::Decision& y) {
                      return x.tier == y.tier && x.mode == y.mode;
                    });
  const std::string what = fast == N ? "the whole micro-batch" : "equal chunks under 2 GiB (a power-of-two count)";
  if (same) return noted(wide, fast, what + ", in HBM the plan leaves free");
  // The trade: fewer passes over the head's gradient against what the larger logits displace.
  const double t_wide = wide.prediction().step_seconds, t_small = base.prediction().step_seconds;
  char steps[96];
  std::snprintf(steps, sizeof steps, " (predicted step %.3f s against %.3f s at %lld rows)", t_wide, t_small,
                static_cast<long long>(small));
  if (t_wide < t_small) {
    return noted(wide, fast, what + ": it moves regions out of HBM but predicts the shorter step" + steps);
  }
  return noted(base, small, short_of + steps);
}

std::string plan_group_of(std::string_view tensor) {
  if (tensor == "model.embed_tokens.weight") return "embed";
  if (tensor == "lm_head.weight") return "lm_head";
  if (tensor == "model.norm.weight") return "final_norm";
  constexpr std::string_view pre = "model.layers.";
  if (tensor.substr(0, pre.size()) == pre) {
    const std::size_t dot = tensor.find('.', pre.size());
    const std::string layer = "layer" + std::string(tensor.substr(pre.size(), dot - pre.size()));
    constexpr std::string_view ex = ".mlp.experts.";
    const std::size_t e = tensor.find(ex, dot);
    if (e != std::string_view::npos) {
      const std::size_t s0 = e + ex.size();
      return layer + ".expert" + std::string(tensor.substr(s0, tensor.find('.', s0) - s0));
    }
    return layer + ".attn";
  }
  return std::string(tensor);
}

std::string plan_region_of(std::string_view tensor, ght::TensorClass cls) {
  return plan_group_of(tensor) + "." + std::string(ght::to_string(cls));
}

void add_trainer_reservations(tier::PlanOptions& options, const ModelConfig& c, int ranks) {
  // An explicit optimizer path decides where the state lives (AdamW places it there whatever
  // the plan says): the plan places it there too, so that what it predicts is what runs.
  if (options.place.empty() && options.link.kind != ght::LinkKind::none) {
    const optimizer::PathChoice choice = optimizer::path_choice_from_config();
    switch (choice) {
      case optimizer::PathChoice::gpu_link:
      case optimizer::PathChoice::cpu: options.place = "master=host,adam_*=host"; break;
      case optimizer::PathChoice::device: options.place = "master=hbm,adam_*=hbm"; break;
      case optimizer::PathChoice::automatic:
      case optimizer::PathChoice::split: break;  // the plan places the state; split divides the host part
    }
    if (!options.place.empty()) options.place_origin = "GHT_OPTIMIZER=" + std::string(optimizer::to_string(choice));
  }
  options.recompute_scratch_bytes = activation_sizes(c).recompute_scratch;
  options.delayed_update_hbm_bytes = delayed_update_hbm_bytes(c);
  add_fp8_reservation(options, c);
  options.speculation_hbm_bytes = speculation_hbm_bytes(c, options, ranks);
  options.host_state_hbm_bytes = 0;
  if (optimizer::link_mode_from_config() != optimizer::LinkMode::dma) return;
  // One optimizer region per parameter tensor (the CUDA trainer's): the largest sizes the slots.
  const auto d = static_cast<std::size_t>(c.d_model);
  const std::size_t largest = d * std::max({static_cast<std::size_t>(c.vocab),           // embedding, LM head
                                            static_cast<std::size_t>(c.heads) * c.head_dim,  // q_proj, o_proj
                                            static_cast<std::size_t>(c.expert_ffn),        // expert projections
                                            static_cast<std::size_t>(c.experts)});         // router
  options.host_state_hbm_bytes = optimizer::dma_slot_bytes(largest, optimizer::state_type_from_config());
}

std::vector<Region> model_regions(const ModelConfig& c, const Routing& routing, int ranks, std::int64_t lm_head_rows) {
  c.validate();
  GHT_EXPECTS(ranks >= 1, "model_regions: ranks must be >= 1, got " + std::to_string(ranks));
  GHT_EXPECTS(routing.empty() || routing.size() == static_cast<std::size_t>(c.layers),
              "model_regions: routing has " + std::to_string(routing.size()) + " layers, the model " +
                  std::to_string(c.layers));
  const double tokens = static_cast<double>(c.seq_len) * c.micro_batch;
  const double uniform = static_cast<double>(c.top_k) / c.experts;
  const optimizer::StateType st = optimizer::state_type_from_config();
  std::vector<Region> out;
  out.reserve(static_cast<std::size_t>(c.layers) * (6 + 5 * c.experts) + 16);

  const std::int64_t table = static_cast<std::int64_t>(c.vocab) * c.d_model;
  const std::int64_t head_rows = lm_head_chunk_rows(c, lm_head_rows);
  const double head_chunks = static_cast<double>((static_cast<std::int64_t>(tokens) + head_rows - 1) / head_rows);
  // The tied table is the LM head's GEMM operand: read in forward and backward.
  // Backward runs from the LM head down to the embedding lookup: the final norm's and the LM
  // head's gradients are complete first (all backward left), the embedding's last (none).
  // Its gradient takes the LM head's passes when it is the head's (tied).
  Group embed{"embed", "embedding", table, -1, -1, 0, 2.0 * 2.0 * static_cast<double>(table), 0.0,
              c.tied_embeddings ? head_chunks : 0.0};
  if (!c.tied_embeddings) {
    // The untied input embedding is a gather: only the micro-batch's rows are read.
    embed.weight_reads = 2.0 * std::min(2.0 * static_cast<double>(table), 2.0 * tokens * c.d_model);
  }
  add_group(c, embed, st, ranks, out);
  if (!c.tied_embeddings) {
    add_group(c, {"lm_head", "embedding", table, -1, -1, 0, 4.0 * static_cast<double>(table), 1.0, head_chunks}, st,
              ranks, out);
  }
  const ActivationSizes act = activation_sizes(c, lm_head_rows);
  for (int l = 0; l < c.layers; ++l) {
    const std::string layer = "layer" + std::to_string(l);
    const std::int64_t dense = c.layer_dense_params();
    const double below = static_cast<double>(l) / c.layers;  // backward left after layer l
    add_group(c, {layer + ".attn", "attention", dense, l, -1, 0, 4.0 * static_cast<double>(dense), below},
              st, ranks, out);
    if (!routing.empty()) {
      GHT_EXPECTS(routing[l].size() == static_cast<std::size_t>(c.experts),
                  "model_regions: routing of layer " + std::to_string(l) + " has " +
                      std::to_string(routing[l].size()) + " experts, the model " + std::to_string(c.experts));
    }
    for (int e = 0; e < c.experts; ++e) {
      const double f = routing.empty() ? uniform : routing[l][e];
      GHT_EXPECTS(f >= 0 && f <= 1, "model_regions: routing share of layer " + std::to_string(l) +
                                        " expert " + std::to_string(e) + " must be within [0, 1]");
      add_group(c,
                {layer + ".expert" + std::to_string(e), "experts", c.expert_params(), l, e, f,
                 4.0 * static_cast<double>(c.expert_params()), below + 0.5 / c.layers},
                st, ranks, out);
    }
    Region a;
    a.name = layer + ".activation";
    a.cls = ght::TensorClass::activation;
    a.group = "activations";
    a.bytes = act.keep_per_layer;
    a.recompute_bytes = act.checkpoint_per_layer;
    a.recompute_flops = act.recompute_flops_per_layer;
    a.host_allowed = false;  // offloading every activation did not pay off in the seed
    a.layer = l;
    out.push_back(std::move(a));
  }
  add_group(c, {"final_norm", "norms", c.d_model, -1, -1, 0, 4.0 * c.d_model, 1.0}, st, ranks, out);
  Region ws;
  ws.name = "workspace";
  ws.cls = ght::TensorClass::other;
  ws.group = "workspace";
  ws.bytes = act.workspace;
  ws.host_allowed = false;
  out.push_back(std::move(ws));
  return out;
}

optimizer::GradType hbm_grad_type() {
  return config::cfg().get_string(config::Key::GHT_GRAD_ACCUM) == "bf16" ? optimizer::GradType::bf16
                                                                          : optimizer::GradType::fp32;
}

bool delayed_update() { return config::cfg().get_bool(config::Key::GHT_OPT_DELAY); }

double backward_share() {
  const double rho = config::cfg().get_float(config::Key::GHT_ASSUMED_BWD_RATIO);
  return rho / (1 + rho);
}

bool speculating_updates() {
  const config::Registry& reg = config::cfg();
  const auto set = [&](config::Key k) {
    const config::SizeValue v = reg.get_size(k);
    return v.bytes > 0 || v.fraction.value_or(0) > 0;
  };
  return speculation_auto() || set(config::Key::GHT_OPT_SPECULATE) || set(config::Key::GHT_OPT_SPECULATE_HOST);
}

bool speculation_auto() { return config::cfg().text(config::Key::GHT_OPT_SPECULATE).empty(); }

std::uint64_t speculation_hbm_bytes(const ModelConfig& c, const tier::PlanOptions& options, int ranks) {
  // Several ranks reduce the gradients first; a delayed update needs no speculation.
  if (ranks > 1 || delayed_update() || options.link.kind == ght::LinkKind::none) return 0;
  if (speculation_auto()) return auto_speculation_bytes(c, options);
  return config::cfg().get_size(config::Key::GHT_OPT_SPECULATE).resolve(options.budgets.hbm, "GHT_OPT_SPECULATE");
}

std::uint64_t auto_speculation_bytes(const ModelConfig& c, const tier::PlanOptions& o) {
  const double link = std::min(o.link.h2d_bps, o.link.d2h_bps);
  if (o.link.kind == ght::LinkKind::none || link <= 0 || o.assumed_tflops <= 0) return 0;
  const double rho = o.backward_ratio;
  // The backward is the bf16 layers' rho / (1 + rho) share: FP8's saving is the forward's (plan.cpp).
  const double layers = o.step_flops / (o.assumed_tflops * 1e12) * rho / (1 + rho);
  const double last_backward = (layers + o.head_seconds()) / c.grad_accum;
  const double state = optimizer::state_bytes_per_param(optimizer::state_type_from_config());
  const double params = std::min(last_backward * link / state, static_cast<double>(c.total_params()));
  const double bytes = params * (state + sizeof(std::uint16_t));
  return static_cast<std::uint64_t>(std::min(bytes, static_cast<double>(o.budgets.hbm) * kAutoSpeculationShare));
}

double update_window_fraction(int grad_accum) {
  const double ga = grad_accum;
  if (delayed_update()) return delay_stale_micro_batches(grad_accum) / ga;
  // Exact: each unit's update starts once the last backward is done (or, speculating, as that
  // backward finishes the unit), and the next step's first forward waits for it unit by unit.
  return (speculating_updates() ? 1.0 : 1.0 - backward_share()) / ga;
}

std::int64_t delay_warmup_steps() { return config::cfg().get_int(config::Key::GHT_OPT_DELAY_WARMUP); }

bool delayed_at(std::int64_t done) { return delayed_update() && done >= delay_warmup_steps(); }

int delay_stale_micro_batches(int grad_accum) {
  const std::int64_t j = config::cfg().get_int(config::Key::GHT_OPT_DELAY_MICRO);
  return j == 0 || j >= grad_accum ? grad_accum : static_cast<int>(j);
}

bool delay_partial(int grad_accum) { return delayed_update() && delay_stale_micro_batches(grad_accum) < grad_accum; }

double delay_weight_extrapolation(int grad_accum) {
  if (!delayed_update() || delay_partial(grad_accum)) return 0.0;
  return config::cfg().get_float(config::Key::GHT_OPT_DELAY_PREDICT);
}

std::uint64_t delayed_update_hbm_bytes(const ModelConfig& c) {
  if (!delayed_update()) return 0;
  const std::uint64_t params = static_cast<std::uint64_t>(c.total_params());
  return params * (sizeof(std::uint16_t) + optimizer::grad_type_size(hbm_grad_type()));
}

double model_step_flops(const ModelConfig& c) {
  return c.flops_per_token() * static_cast<double>(c.tokens_per_step());
}

double model_head_flops(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.vocab) * static_cast<double>(c.d_model) *
         static_cast<double>(c.tokens_per_step());
}

}  // namespace ght::trainer
