// The CUDA model's micro-batch: its compute into a loss slot, the CUDA graph that replays it, the
// forward and backward entry points and the losses' read-back.
#include "trainer/cuda/model_cuda_impl.hpp"

namespace ght::trainer {

// One micro-batch after the upload: forward, LM head (+ backward), losses into slot `sd`.
void CudaMoEModel::Impl::compute(char* sd, bool with_backward, float loss_scale) {
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

// A graph replays fixed pointers and host values, and nothing may wait on the host inside it.
bool CudaMoEModel::Impl::graph_usable() const {
  const bool hooks_idle = (!hooks.before_unit_forward && !hooks.after_unit_backward) ||
                          (hooks_quiet && hooks_quiet());
  return opts.cuda_graphs && graphs_off.empty() && !op_hook && !opts.sync_each_op &&
         !kc::needs_host_offsets(opts.expert_impl) && hooks_idle;
}

void CudaMoEModel::Impl::destroy(Graph& g) noexcept {
  if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
  if (g.graph != nullptr) (void)cudaGraphDestroy(g.graph);
  g = Graph{};
}

// compute() into graph_slot as a graph launch: replayed when captured for this key, captured
// (then launched) when the key ran eagerly before, else run eagerly once.
void CudaMoEModel::Impl::run_graph(float loss_scale) {
  const GraphKey key{B, T, W, G, loss_scale, buffer_generation, grad_write, kc::stream_sm_budget(stream),
                     opts.fp8_experts && fp8_stale};
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
cudaGraphNode_t CudaMoEModel::Impl::forward_end_node(cudaGraph_t graph) const {
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
CudaMoEModel::Impl::Graph* CudaMoEModel::Impl::capture(const GraphKey& key, float loss_scale) {
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

void CudaMoEModel::Impl::run_forward(const std::int32_t* tok, const std::int32_t* tgt, int B_, int T_, int slot,
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
  fp8_stale = false;  // the FP8 copies (if any) are this forward's, graph replay or not
  op("loss copy");
  if (sm_copies) {
    kc::sm_copy(slot_host_dev + static_cast<std::size_t>(slot) * slot_bytes, sd, slot_bytes, stream);
  } else {
    GHT_CUDA_TRY(cudaMemcpyAsync(slot_h(slot), sd, slot_bytes, cudaMemcpyDeviceToHost, stream));
  }
  GHT_CUDA_TRY(cudaEventRecord(slot_event[slot], stream));
  has_forward = true;
}

Loss CudaMoEModel::Impl::collect(int slot) {
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
void CudaMoEModel::Impl::run_backward(float loss_scale) {
  GHT_EXPECTS(has_forward, "model backward: call forward() first (logits() does not count)");
  if (opts.grad_type == optimizer::GradType::fp32) {
    head_and_body_backward<float>(loss_scale, nullptr, nullptr);
  } else {
    head_and_body_backward<bf16>(loss_scale, nullptr, nullptr);
  }
}

}  // namespace ght::trainer
