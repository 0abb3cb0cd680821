// The CUDA model's buffers: set-up (weights, gradients, loss slots from the run's allocator),
// memory by class, op tracking, the activation buffers sized to the tokens of a micro-batch,
// and the inputs' upload.
#include "trainer/cuda/model_cuda_impl.hpp"
#include "trainer/fp8_experts.hpp"

namespace ght::trainer {

void CudaMoEModel::Impl::release() noexcept {
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

void* CudaMoEModel::Impl::alloc(std::size_t bytes, MemClass cls, const char* what) {
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

void CudaMoEModel::Impl::free_class(MemClass cls) {
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

std::string CudaMoEModel::Impl::memory_report() const {
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

void CudaMoEModel::Impl::op(const char* name, int layer) {
  // With sync_each_op an asynchronous fault is caught while the op that caused it is current.
  if (opts.sync_each_op) GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  op_name = name;
  op_layer = layer;
  if (op_hook) op_hook(name, layer);
}

std::string CudaMoEModel::Impl::context() const {
  std::string s = "CUDA model, op '";
  if (op_layer >= 0) s += "layer " + std::to_string(op_layer) + ": ";
  return s + op_name + "': ";
}

void CudaMoEModel::Impl::setup(ModelConfig c, CudaModelOptions o) {
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
  if (opts.fp8_experts) fp8_setup();
  if (opts.cuda_graphs) {
    graph_slot = as<char>(alloc(slot_bytes, kWork, "CUDA graph loss slot"));
    GHT_CUDA_TRY(cudaEventCreateWithFlags(&graph_fwd_placeholder, cudaEventDisableTiming));
  }
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
}

// Activation and scratch buffers for N tokens (re-allocated only when N grows).
void CudaMoEModel::Impl::ensure_capacity(std::int64_t N) {
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
  if (opts.fp8_experts) {
    const Fp8ExpertSizes s = fp8_expert_sizes(cfg, N);
    fp8_act = as<__nv_fp8_e4m3>(alloc(s.act_codes, kActs, "FP8 expert input codes"));
    fp8_act_scales = f32(s.act_scales / sizeof(float), "FP8 expert input scales");
  }
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

void CudaMoEModel::Impl::upload_inputs(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_) {
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

// After the last layer's forward (and the final unit's hook): the caller's forward-end event.
// In a capture it becomes an event record node, pointed at the caller's event at each launch.
void CudaMoEModel::Impl::mark_forward_end() {
  if (capturing) {
    GHT_CUDA_TRY(cudaEventRecordWithFlags(graph_fwd_placeholder, stream, cudaEventRecordExternal));
  } else if (fwd_end_event != nullptr) {
    GHT_CUDA_TRY(cudaEventRecord(fwd_end_event, stream));
  }
}

}  // namespace ght::trainer
