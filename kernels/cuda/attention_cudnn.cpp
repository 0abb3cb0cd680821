// Causal GQA flash attention through the cuDNN backend graph API, written out by hand
// (AttentionImpl::cudnn_backend; the path of builds without cudnn-frontend). The operation graphs
// are the ones cudnn-frontend's composite SDPA nodes lower to, so cuDNN's runtime-fusion engines
// recognise them as fused flash attention:
//
//   forward   S = Q·K^T (fp32) · scale → causal mask (GEN_INDEX row/col, CMP_GE, BINARY_SELECT
//             with the lowest float) → max, S − max, exp, sum, stats = max + log(sum),
//             P = exp / sum (bf16) → O = P·V
//   backward  Δ = rowsum(dO ∘ O) · 1; P = exp(mask(Q·K^T·scale) − stats); dV = P^T·dO (summed
//             over the query heads of a kv head for GQA); dS = (dO·V^T · 1 − Δ) ∘ P · scale;
//             dK = dS^T·Q (GQA-summed); dQ_accum (fp32, F16x16, zeroed) = dS·K; dQ = identity
//
// Plans are cached by shape and strides (per device). A shape for which cuDNN finds no engine is
// remembered as unsupported so the automatic dispatch does not retry it on every call. This file
// also owns the cuDNN handles both cuDNN paths share (detail/cudnn_attention.hpp).
// This file has no device code, so it is plain C++ (kernels/CMakeLists.txt compiles cuda/*.cpp
// only in CUDA builds).
#include "kernels/cuda/attention.hpp"

#if __has_include(<cudnn.h>)
#include <cudnn.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/detail/cudnn_attention.hpp"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

// The handle attributes of the operation graph and execution plan are deprecated from cuDNN 9.19
// on (in favour of device-property descriptors) but remain the portable way to build a plan on
// the cuDNN 9.14 of our H200 machine.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace ght::kernels::cuda::detail {
namespace {

using Dims = std::array<std::int64_t, 4>;

std::string last_cudnn_error() {
  char buf[512] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
}

void ck(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  (void)cudaGetLastError();
  throw ght::cuda_error(std::string("cuDNN attention: ") + what + " failed: " +
                        cudnnGetErrorString(st) + " (" + std::to_string(static_cast<int>(st)) +
                        ") " + last_cudnn_error());
}

class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t t) {
    ck(cudnnBackendCreateDescriptor(t, &d_), "cudnnBackendCreateDescriptor");
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d_ != nullptr) (void)cudnnBackendDestroyDescriptor(d_);
  }
  [[nodiscard]] cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, std::int64_t count, const void* value, const char* what) {
  ck(cudnnBackendSetAttribute(d, name, type, count, value), what);
}

// Builds one operation graph; owns every descriptor it creates (they must outlive the plan).
struct Builder {
  std::vector<std::unique_ptr<Desc>> owned;
  std::vector<cudnnBackendDescriptor_t> ops;
  std::int64_t next_virtual_uid = 1000;

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    owned.push_back(std::make_unique<Desc>(t));
    return owned.back()->get();
  }

  cudnnBackendDescriptor_t tensor(std::int64_t uid, cudnnDataType_t dt, const Dims& dims,
                                  const Dims& strides, bool is_virtual, bool by_value = false,
                                  bool reorder_f16x16 = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::int64_t align = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    if (reorder_f16x16) {
      const cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
      set(t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r,
          "tensor reordering");
    }
    ck(cudnnBackendFinalize(t), "tensor finalize");
    return t;
  }
  cudnnBackendDescriptor_t vt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_uid++, dt, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(std::int64_t uid, cudnnDataType_t dt) {
    return tensor(uid, dt, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 std::int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise precision");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    ck(cudnnBackendFinalize(pw), "pointwise descriptor finalize");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
    if (t != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    ck(cudnnBackendFinalize(op), "pointwise op finalize");
    ops.push_back(op);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    ck(cudnnBackendFinalize(mm), "matmul descriptor finalize");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul desc");
    ck(cudnnBackendFinalize(op), "matmul op finalize");
    ops.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    ck(cudnnBackendFinalize(rd), "reduction descriptor finalize");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction desc");
    ck(cudnnBackendFinalize(op), "reduction op finalize");
    ops.push_back(op);
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    ck(cudnnBackendFinalize(op), "reshape op finalize");
    ops.push_back(op);
  }
};

// Tensor uids of the variant packs.
enum Uid : std::int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kScale = 6, kNegInf = 7, kOne = 8,
  kdO = 9, kdQ = 10, kdK = 11, kdV = 12, kdQAccum = 13,
};

struct Plan {
  Builder graph;                 // keeps every descriptor alive
  cudnnBackendDescriptor_t plan = nullptr;
  std::int64_t workspace = 0;    // bytes the engine needs
  std::int64_t dq_accum = 0;     // bytes of the zeroed fp32 dQ accumulator (backward)
};

struct Geometry {
  std::int64_t B, T, H, KV, D, q_row, k_row, v_row, o_row;
  Dims q() const { return {B, H, T, D}; }
  Dims q_strides() const { return {T * q_row, D, q_row, 1}; }
  Dims o_strides() const { return {T * o_row, D, o_row, 1}; }
  Dims kv() const { return {B, KV, T, D}; }
  Dims k_strides() const { return {T * k_row, D, k_row, 1}; }
  Dims v_strides() const { return {T * v_row, D, v_row, 1}; }
  Dims kt() const { return {B, KV, D, T}; }
  Dims kt_strides() const { return {T * k_row, D, 1, k_row}; }
  Dims vt_strides() const { return {T * v_row, D, 1, v_row}; }
  Dims s() const { return {B, H, T, T}; }
  Dims s_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims st_strides() const { return {H * T * T, T * T, 1, T}; }  // S^T view of the same S
  Dims r() const { return {B, H, T, 1}; }
  Dims r_strides() const { return {H * T, T, 1, 1}; }
  Dims packed_q_strides() const { return {H * T * D, T * D, D, 1}; }
};

Geometry geometry(const AttentionShape& s) {
  return Geometry{s.B, s.T, s.H, s.KV, s.D, s.q_row, s.k_row, s.v_row, s.o_row};
}

// The causal mask of both graphs: keep S[i][j] where i >= j, else the lowest float.
cudnnBackendDescriptor_t causal_mask(Builder& g, const Geometry& G, cudnnBackendDescriptor_t s,
                                     cudnnBackendDescriptor_t neg_inf) {
  auto row = g.vt(CUDNN_DATA_INT32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
  auto col = g.vt(CUDNN_DATA_INT32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
  auto keep = g.vt(CUDNN_DATA_BOOLEAN, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  auto out = g.vt(CUDNN_DATA_FLOAT, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out);
  return out;
}

void build_forward(Builder& g, const Geometry& G) {
  const auto bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  auto q = g.tensor(kQ, bf, G.q(), G.q_strides(), false);
  auto kt = g.tensor(kK, bf, G.kt(), G.kt_strides(), false);
  auto v = g.tensor(kV, bf, G.kv(), G.v_strides(), false);
  auto o = g.tensor(kO, bf, G.q(), G.o_strides(), false);
  auto stats = g.tensor(kStats, f32, G.r(), G.r_strides(), false);
  auto scale = g.scalar(kScale, f32);
  auto neg_inf = g.scalar(kNegInf, f32);

  auto s1 = g.vt(f32, G.s(), G.s_strides());
  g.matmul(q, kt, s1);
  auto s2 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, s1, scale, nullptr, s2);
  auto s3 = causal_mask(g, G, s2, neg_inf);
  auto mx = g.vt(f32, G.r(), G.r_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s3, mx);
  auto sub = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, f32, s3, mx, nullptr, sub);
  auto ex = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, f32, sub, nullptr, nullptr, ex);
  auto sum = g.vt(f32, G.r(), G.r_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  auto lg = g.vt(f32, G.r(), G.r_strides());
  g.pointwise(CUDNN_POINTWISE_LOG, f32, sum, nullptr, nullptr, lg);
  g.pointwise(CUDNN_POINTWISE_ADD, f32, mx, lg, nullptr, stats);
  // The second matmul takes its A operand in the I/O type (a cuDNN backend requirement).
  auto p = g.vt(bf, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_DIV, f32, ex, sum, nullptr, p);
  g.matmul(p, v, o);
}

void build_backward(Builder& g, const Geometry& G) {
  const auto bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const bool gqa = G.H != G.KV;
  auto q = g.tensor(kQ, bf, G.q(), G.q_strides(), false);
  auto kt = g.tensor(kK, bf, G.kt(), G.kt_strides(), false);
  auto vt = g.tensor(kV, bf, G.kt(), G.vt_strides(), false);
  auto o = g.tensor(kO, bf, G.q(), G.o_strides(), false);
  auto dO = g.tensor(kdO, bf, G.q(), G.o_strides(), false);
  auto stats = g.tensor(kStats, f32, G.r(), G.r_strides(), false);
  auto dq = g.tensor(kdQ, bf, G.q(), G.q_strides(), false);
  auto dk = g.tensor(kdK, bf, G.kv(), G.k_strides(), false);
  auto dv = g.tensor(kdV, bf, G.kv(), G.v_strides(), false);
  auto dq_accum = g.tensor(kdQAccum, f32, G.q(), G.packed_q_strides(), false, false, true);
  auto scale = g.scalar(kScale, f32);
  auto neg_inf = g.scalar(kNegInf, f32);
  auto one = g.scalar(kOne, f32);

  // softmax_sum = rowsum(dO ∘ O) · 1
  auto doo = g.vt(f32, G.q(), Dims{G.H * G.T * G.D, G.T * G.D, G.H * G.D, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, f32, dO, o, nullptr, doo);
  auto red = g.vt(f32, G.r(), G.r_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, red);
  auto softmax_sum = g.vt(f32, G.r(), G.r_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, red, one, nullptr, softmax_sum);

  // P = exp(mask(Q·K^T·scale) − stats)
  auto s1 = g.vt(f32, G.s(), G.s_strides());
  g.matmul(q, kt, s1);
  auto s2 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, s1, scale, nullptr, s2);
  auto s3 = causal_mask(g, G, s2, neg_inf);
  auto s4 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, f32, s3, stats, nullptr, s4);
  auto p = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, f32, s4, nullptr, nullptr, p);

  // dV = P^T·dO (summed over the query heads of each kv head)
  const Dims st{G.B, G.H, G.T, G.T};
  auto pt = g.vt(bf, st, G.st_strides());
  g.reshape(p, pt);
  if (!gqa) {
    g.matmul(pt, dO, dv);
  } else {
    auto dvh = g.vt(bf, G.q(), G.packed_q_strides());
    g.matmul(pt, dO, dvh);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
  }

  // dS = (dO·V^T · 1 − softmax_sum) ∘ P · scale
  auto dp1 = g.vt(f32, G.s(), G.s_strides());
  g.matmul(dO, vt, dp1);
  auto dp2 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, dp1, one, nullptr, dp2);
  auto dp3 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, f32, dp2, softmax_sum, nullptr, dp3);
  auto dp4 = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, dp3, p, nullptr, dp4);
  auto ds = g.vt(f32, G.s(), G.s_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, f32, dp4, scale, nullptr, ds);

  // dK = dS^T·Q (summed over the query heads of each kv head)
  auto dst = g.vt(bf, st, G.st_strides());
  g.reshape(ds, dst);
  if (!gqa) {
    g.matmul(dst, q, dk);
  } else {
    auto dkh = g.vt(bf, G.q(), G.packed_q_strides());
    g.matmul(dst, q, dkh);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
  }

  // dQ = dS·K through the fp32 accumulator
  auto k = g.vt(bf, G.kv(), G.k_strides());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, f32, dq_accum, nullptr, nullptr, dq);
}

// Finalize the operation graph and the first engine configuration cuDNN's heuristics offer that
// builds into an execution plan.
void finalize_plan(Plan& p, cudnnHandle_t handle) {
  Builder& g = p.graph;
  cudnnBackendDescriptor_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
      static_cast<std::int64_t>(g.ops.size()), g.ops.data(), "graph ops");
  ck(cudnnBackendFinalize(graph), "operation graph finalize");

  std::string reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics graph");
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) {
      reasons += " heuristics(mode " + std::to_string(static_cast<int>(mode)) + "): " + last_cudnn_error();
      continue;
    }
    std::int64_t count = 0;
    ck(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                &count, nullptr),
       "heuristics result count");
    if (count <= 0) continue;
    std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<std::size_t>(count));
    for (auto& c : cfgs) c = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    std::int64_t got = 0;
    ck(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                &got, cfgs.data()),
       "heuristics results");
    for (std::int64_t i = 0; i < got; ++i) {
      cudnnBackendDescriptor_t plan = g.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i],
          "plan engine config");
      if (cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS) {
        reasons += " engine config " + std::to_string(i) + ": " + last_cudnn_error();
        continue;
      }
      std::int64_t ws = 0, n = 0;
      ck(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                  &ws),
         "plan workspace size");
      p.plan = plan;
      p.workspace = ws;
      return;
    }
  }
  throw ght::cuda_error("cuDNN attention: no engine builds a plan for this graph;" + reasons);
}

CudnnPlanCache<Plan>& plans() {
  static auto* c = new CudnnPlanCache<Plan>;  // leaked on purpose, like the handles
  return *c;
}

std::shared_ptr<Plan> get_plan(const CudnnAttentionKey& key, const Geometry& G, cudnnHandle_t h,
                               bool throw_on_failure) {
  return plans().get(key, throw_on_failure, [&](const CudnnAttentionKey&) {
    auto p = std::make_shared<Plan>();
    if (key.backward) {
      build_backward(p->graph, G);
      p->dq_accum = static_cast<std::int64_t>(scratch_align(
          static_cast<std::size_t>(G.B * G.H * G.T * G.D) * sizeof(float)));
    } else {
      build_forward(p->graph, G);
    }
    finalize_plan(*p, h);
    return p;
  });
}

void execute(cudnnHandle_t h, const Plan& p, cudaStream_t stream,
             const std::vector<std::int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
      static_cast<std::int64_t>(uids.size()), uids.data(), "variant pack uids");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
      static_cast<std::int64_t>(ptrs.size()), ptrs.data(), "variant pack pointers");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace,
      "variant pack workspace");
  ck(cudnnBackendFinalize(pack.get()), "variant pack finalize");
  ck(cudnnSetStream(h, stream), "cudnnSetStream");
  ck(cudnnBackendExecute(h, p.plan, pack.get()), "cudnnBackendExecute");
}

}  // namespace

std::mutex& cudnn_attention_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

namespace {
std::map<int, cudnnHandle_t>& handles() {
  static auto* h = new std::map<int, cudnnHandle_t>;  // no cuDNN teardown from static destructors
  return *h;
}
}  // namespace

cudnnHandle_t cudnn_handle_locked(int device) {
  auto it = handles().find(device);
  if (it != handles().end()) return it->second;
  cudnnHandle_t h = nullptr;
  ck(cudnnCreate(&h), "cudnnCreate");
  handles().emplace(device, h);
  return h;
}

int cudnn_current_device() {
  int dev = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  return dev;
}

bool cudnn_attention_compiled() { return true; }

bool cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v,
                             const AttentionShape& sh, cudaStream_t stream, bool throw_on_failure) {
  const int dev = cudnn_current_device();
  std::lock_guard<std::mutex> lock(cudnn_attention_mutex());
  cudnnHandle_t h = cudnn_handle_locked(dev);
  auto plan = get_plan(CudnnAttentionKey::of(dev, false, sh), geometry(sh), h, throw_on_failure);
  if (!plan) return false;
  void* ws = plan->workspace > 0
                 ? stream_scratch(stream, static_cast<std::size_t>(plan->workspace))
                 : nullptr;
  float scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
  float neg_inf = std::numeric_limits<float>::lowest();
  const std::vector<std::int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  const std::vector<void*> ptrs = {const_cast<__nv_bfloat16*>(q), const_cast<__nv_bfloat16*>(k),
                                   const_cast<__nv_bfloat16*>(v), out, lse, &scale, &neg_inf};
  execute(h, *plan, stream, uids, ptrs, ws);
  return true;
}

bool cudnn_attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                              const __nv_bfloat16* dout, const __nv_bfloat16* q,
                              const __nv_bfloat16* k, const __nv_bfloat16* v,
                              const __nv_bfloat16* out, const float* lse,
                              const AttentionShape& sh, cudaStream_t stream,
                              bool throw_on_failure) {
  const int dev = cudnn_current_device();
  std::lock_guard<std::mutex> lock(cudnn_attention_mutex());
  cudnnHandle_t h = cudnn_handle_locked(dev);
  auto plan = get_plan(CudnnAttentionKey::of(dev, true, sh), geometry(sh), h, throw_on_failure);
  if (!plan) return false;
  const std::size_t ws_bytes = scratch_align(static_cast<std::size_t>(plan->workspace));
  auto* base = static_cast<char*>(
      stream_scratch(stream, ws_bytes + static_cast<std::size_t>(plan->dq_accum)));
  void* ws = plan->workspace > 0 ? base : nullptr;
  void* dq_accum = base + ws_bytes;
  // The engine accumulates dQ into this buffer; it must start at zero on every call.
  GHT_CUDA_TRY(cudaMemsetAsync(dq_accum, 0, static_cast<std::size_t>(plan->dq_accum), stream));
  float scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
  float neg_inf = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  const std::vector<std::int64_t> uids = {kQ,  kK,  kV,  kO,       kdO,    kStats,  kdQ,
                                          kdK, kdV, kdQAccum, kScale, kNegInf, kOne};
  const std::vector<void*> ptrs = {
      const_cast<__nv_bfloat16*>(q), const_cast<__nv_bfloat16*>(k), const_cast<__nv_bfloat16*>(v),
      const_cast<__nv_bfloat16*>(out), const_cast<__nv_bfloat16*>(dout), const_cast<float*>(lse),
      dq, dk, dv, dq_accum, &scale, &neg_inf, &one};
  execute(h, *plan, stream, uids, ptrs, ws);
  return true;
}

void cudnn_attention_release() {
  std::lock_guard<std::mutex> lock(cudnn_attention_mutex());
  plans().clear();
  cudnn_frontend_attention_release_locked();  // its graphs hold the handles' plans
  for (auto& [dev, h] : handles()) (void)cudnnDestroy(h);
  handles().clear();
}

}  // namespace ght::kernels::cuda::detail

#pragma GCC diagnostic pop

#else  // no cuDNN headers: the automatic dispatch always takes the fallback kernels

#include "tier/error.hpp"

namespace ght::kernels::cuda::detail {
bool cudnn_attention_compiled() { return false; }
bool cudnn_attention_forward(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*,
                             const __nv_bfloat16*, const AttentionShape&, cudaStream_t, bool t) {
  if (t) GHT_FAIL("attention: this build has no cuDNN");
  return false;
}
bool cudnn_attention_backward(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*,
                              const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                              const AttentionShape&, cudaStream_t, bool t) {
  if (t) GHT_FAIL("attention: this build has no cuDNN");
  return false;
}
void cudnn_attention_release() {}
}  // namespace ght::kernels::cuda::detail

#endif

#if !defined(GHT_HAVE_CUDNN_FRONTEND)
// A build without cudnn-frontend has no SDPA-node path (cudnn_frontend/attention_sdpa.cpp); the
// dispatch in attention.cu asks cudnn_frontend_attention_compiled() before calling these.
namespace ght::kernels::cuda::detail {
bool cudnn_frontend_attention_compiled() { return false; }
bool cudnn_frontend_attention_forward(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                      const __nv_bfloat16*, const __nv_bfloat16*,
                                      const AttentionShape&, cudaStream_t, bool t) {
  if (t) GHT_FAIL("attention: this build has no cudnn-frontend");
  return false;
}
bool cudnn_frontend_attention_backward(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*,
                                       const __nv_bfloat16*, const __nv_bfloat16*,
                                       const __nv_bfloat16*, const __nv_bfloat16*,
                                       const __nv_bfloat16*, const float*, const AttentionShape&,
                                       cudaStream_t, bool t) {
  if (t) GHT_FAIL("attention: this build has no cudnn-frontend");
  return false;
}
void cudnn_frontend_attention_release_locked() {}
std::vector<CudnnPlanTiming> cudnn_frontend_attention_plan_times(bool, const AttentionTensors&, const AttentionShape&,
                                                                 int, cudaStream_t) {
  GHT_FAIL("attention: this build has no cudnn-frontend");
}
}  // namespace ght::kernels::cuda::detail
#endif
