// Causal GQA flash attention through cudnn-frontend's graph API (AttentionImpl::cudnn): one
// sdpa node (forward, with the fp32 softmax stats) or one sdpa_backward node per graph, which
// the frontend lowers to cuDNN's fused flash-attention engines (and sizes, zeroes and carves the
// backward's dQ accumulator out of the workspace itself). Built graphs are cached per shape and
// strides (detail/cudnn_attention.hpp); a shape the frontend cannot build is remembered.
//
// Layouts as in attention.hpp: token-major rows, so a (B, heads, T, D) view has strides
// (T·row, D, row, 1); stats (B, H, T, 1) fp32 natural-log logsumexp, the lse of the CPU op.
// Compiled only when CMake found the cudnn-frontend headers (kernels/CMakeLists.txt).
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/detail/cudnn_attention.hpp"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda::detail {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Uid = fe::graph::Tensor_attributes::uid_t;

enum : Uid { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Built {
  std::shared_ptr<Graph> graph;
  std::int64_t workspace = 0;
};

void check(const fe::error_t& st, const char* what) {
  if (st.is_good()) return;
  throw ght::cuda_error(std::string("cudnn-frontend attention: ") + what + " failed: " + st.err_msg);
}

// The (B, heads, T, D) view of token-major rows `row` elements apart.
std::vector<std::int64_t> dims(const CudnnAttentionKey& s, std::int64_t heads) {
  return {s.B, heads, s.T, s.D};
}
std::vector<std::int64_t> strides(const CudnnAttentionKey& s, std::int64_t row) {
  return {s.T * row, s.D, row, 1};
}

TensorPtr input(Graph& g, Uid uid, const char* name, const CudnnAttentionKey& s,
                std::int64_t heads, std::int64_t row) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(
      dims(s, heads)).set_stride(strides(s, row)));
}
void output(const TensorPtr& t, Uid uid, const CudnnAttentionKey& s, std::int64_t heads,
            std::int64_t row) {
  t->set_output(true).set_uid(uid).set_dim(dims(s, heads)).set_stride(strides(s, row));
}
// (B, H, T, 1) fp32: one natural-log logsumexp per query row.
TensorPtr stats_view(const TensorPtr& t, const CudnnAttentionKey& s) {
  t->set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.H, s.T, 1}).set_stride(
      {s.H * s.T, s.T, 1, 1});
  return t;
}

float scale_of(const CudnnAttentionKey& s) { return 1.0f / std::sqrt(static_cast<float>(s.D)); }

// The graph of `s`, not built yet.
std::shared_ptr<Graph> make_graph(const CudnnAttentionKey& s) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = input(*g, kQ, "Q", s, s.H, s.q_row);
  auto k = input(*g, kK, "K", s, s.KV, s.k_row);
  auto v = input(*g, kV, "V", s, s.KV, s.v_row);
  // Causal with the diagonal at the top left: query i sees keys j <= i (T_q == T_kv).
  if (!s.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa")
                    .set_generate_stats(true)
                    .set_attn_scale(scale_of(s))
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    output(o, kO, s, s.H, s.o_row);
    stats_view(stats, s)->set_output(true);
  } else {
    auto o = input(*g, kO, "O", s, s.H, s.o_row);
    auto d_o = input(*g, kdO, "dO", s, s.H, s.o_row);
    auto stats = stats_view(g->tensor(fe::graph::Tensor_attributes().set_name("Stats")), s);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(scale_of(s))
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
    output(dq, kdQ, s, s.H, s.q_row);
    output(dk, kdK, s, s.KV, s.k_row);
    output(dv, kdV, s, s.KV, s.v_row);
  }
  return g;
}

std::shared_ptr<Built> build(const CudnnAttentionKey& s, cudnnHandle_t handle) {
  auto g = make_graph(s);
  check(g->build(handle, {fe::HeurMode_t::A}), "graph build");
  auto b = std::make_shared<Built>();
  check(g->get_workspace_size(b->workspace), "workspace size");
  b->graph = std::move(g);
  return b;
}

// The variant pack of one call: the forward's tensors, and with `backward` the gradients too.
std::unordered_map<Uid, void*> pack_of(bool backward, const AttentionTensors& t) {
  auto in = [](const __nv_bfloat16* p) { return static_cast<void*>(const_cast<__nv_bfloat16*>(p)); };
  std::unordered_map<Uid, void*> pack = {{kQ, in(t.q)}, {kK, in(t.k)}, {kV, in(t.v)}, {kO, t.out}, {kStats, t.lse}};
  if (backward) pack.insert({{kdO, in(t.dout)}, {kdQ, t.dq}, {kdK, t.dk}, {kdV, t.dv}});
  return pack;
}

CudnnPlanCache<Built>& graphs() {
  static auto* c = new CudnnPlanCache<Built>;  // leaked like the handles it depends on
  return *c;
}

// Builds (or finds) the graph of `sh` and runs it with `pack`; false when no graph can be built.
bool run(bool backward, const AttentionShape& sh, std::unordered_map<Uid, void*> pack,
         cudaStream_t stream, bool throw_on_failure) {
  const int dev = cudnn_current_device();
  std::lock_guard<std::mutex> lock(cudnn_attention_mutex());
  cudnnHandle_t h = cudnn_handle_locked(dev);
  const auto key = CudnnAttentionKey::of(dev, backward, sh);
  const auto b = graphs().get(key, throw_on_failure, [&](const CudnnAttentionKey& k) {
    try {
      return build(k, h);
    } catch (const ght::cuda_error&) {
      throw;
    } catch (const std::exception& e) {  // the frontend's own exceptions, if any escape it
      throw ght::cuda_error(std::string("cudnn-frontend attention: graph build: ") + e.what());
    }
  });
  if (!b) return false;
  void* ws = b->workspace > 0
                 ? stream_scratch(stream, static_cast<std::size_t>(b->workspace))
                 : nullptr;
  if (cudnnSetStream(h, stream) != CUDNN_STATUS_SUCCESS)
    throw ght::cuda_error("cudnn-frontend attention: cudnnSetStream failed");
  check(b->graph->execute(h, pack, ws), "execute");
  return true;
}

}  // namespace

bool cudnn_frontend_attention_compiled() { return true; }

bool cudnn_frontend_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                                      const __nv_bfloat16* k, const __nv_bfloat16* v,
                                      const AttentionShape& s, cudaStream_t stream,
                                      bool throw_on_failure) {
  return run(false, s, pack_of(false, {q, k, v, out, lse}), stream, throw_on_failure);
}

bool cudnn_frontend_attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                                       const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                       const __nv_bfloat16* k, const __nv_bfloat16* v,
                                       const __nv_bfloat16* out, const float* lse,
                                       const AttentionShape& s, cudaStream_t stream,
                                       bool throw_on_failure) {
  // out and lse are inputs here; the pack holds non-const pointers either way.
  return run(true, s,
             pack_of(true, {q, k, v, const_cast<__nv_bfloat16*>(out), const_cast<float*>(lse), dout, dq, dk, dv}),
             stream, throw_on_failure);
}

void cudnn_frontend_attention_release_locked() { graphs().clear(); }

std::vector<CudnnPlanTiming> cudnn_frontend_attention_plan_times(bool backward, const AttentionTensors& t,
                                                                 const AttentionShape& sh, int iters,
                                                                 cudaStream_t stream) {
  GHT_EXPECTS(iters > 0, "cudnn_frontend_attention_plan_times: iters must be > 0");
  const int dev = cudnn_current_device();
  std::lock_guard<std::mutex> lock(cudnn_attention_mutex());
  cudnnHandle_t h = cudnn_handle_locked(dev);
  auto g = make_graph(CudnnAttentionKey::of(dev, backward, sh));
  check(g->build(h, {fe::HeurMode_t::A}, fe::BuildPlanPolicy_t::ALL), "graph build (every plan)");
  if (cudnnSetStream(h, stream) != CUDNN_STATUS_SUCCESS)
    throw ght::cuda_error("cudnn-frontend attention: cudnnSetStream failed");
  std::unordered_map<Uid, void*> pack = pack_of(backward, t);
  cudaEvent_t a = nullptr, b = nullptr;
  GHT_CUDA_TRY(cudaEventCreate(&a));
  GHT_CUDA_TRY(cudaEventCreate(&b));
  std::vector<CudnnPlanTiming> out;
  for (std::int64_t i = 0; i < g->get_execution_plan_count(); ++i) {
    CudnnPlanTiming p;
    (void)g->get_plan_name_at_index(i, p.name);
    std::int64_t ws_bytes = 0;
    fe::error_t st = g->get_workspace_size_plan_at_index(i, ws_bytes);
    void* ws = st.is_good() && ws_bytes > 0 ? stream_scratch(stream, static_cast<std::size_t>(ws_bytes)) : nullptr;
    std::vector<double> ms;
    for (int r = 0; st.is_good() && r <= iters; ++r) {  // run 0 is the warm-up
      GHT_CUDA_TRY(cudaEventRecord(a, stream));
      st = g->execute_plan_at_index(h, pack, ws, i);
      GHT_CUDA_TRY(cudaEventRecord(b, stream));
      GHT_CUDA_TRY(cudaEventSynchronize(b));
      float e = 0;
      GHT_CUDA_TRY(cudaEventElapsedTime(&e, a, b));
      if (r > 0) ms.push_back(e);
    }
    if (st.is_good()) {
      std::sort(ms.begin(), ms.end());
      p.ms = ms[ms.size() / 2];
    } else {
      p.error = st.get_message();
    }
    out.push_back(std::move(p));
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return out;
}

}  // namespace ght::kernels::cuda::detail
