// Dense GEMM through cuBLASLt (see gemm.hpp for the row-major convention).
//
// cuBLASLt is column-major. A row-major (r,c) matrix with row stride ld is, read column-major,
// its transpose (c,r) with the same ld. So row-major C = op(A)·op(B) is computed as the
// column-major product C^T = op(B)^T · op(A)^T, i.e. cuBLASLt's "A" is our B and its "B" is our A,
// with the transpose flags carried over unchanged.
#include "kernels/cuda/gemm.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

// ---- kernels --------------------------------------------------------------------------------

// k == 0: C = beta·C (cuBLASLt rejects an empty reduction dimension).
template <typename T>
__global__ void scale_matrix_kernel(T* c, std::int64_t rows, std::int64_t cols, std::int64_t ldc,
                                    std::int64_t stride_c, int batch, float beta) {
  const std::int64_t total = rows * cols * batch;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bi = i / (rows * cols);
    const std::int64_t rc = i % (rows * cols);
    T* p = c + bi * stride_c + (rc / cols) * ldc + rc % cols;
    const float v = beta == 0.0f ? 0.0f : beta * static_cast<float>(*p);
    *p = static_cast<T>(v);
  }
}

// ---- cached library state -------------------------------------------------------------------

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // NVIDIA's recommendation for Hopper

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr;  // cuBLASLt's A = our B
  cublasLtMatrixLayout_t lb = nullptr;  // cuBLASLt's B = our A
  cublasLtMatrixLayout_t lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The shape, the alignments, the heuristic rank and (last) the SM count target.
using PlanKey = std::array<std::int64_t, 19>;
constexpr std::size_t kKeySms = 18;

struct BlasState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> lt;
  std::map<std::pair<int, cudaStream_t>, void*> workspace;
  std::map<std::pair<int, cudaStream_t>, cublasHandle_t> blas;
  std::map<std::pair<int, cudaStream_t>, int> sm_budget;  // set_stream_sm_budget; absent: 0
  // shared_ptr: a plan evicted while another thread is still launching with it stays alive.
  std::map<PlanKey, std::shared_ptr<const Plan>> plans;
};

// Expert GEMMs see a new row count m almost every step, so the cache is bounded; when full it is
// simply cleared (rebuilding a plan costs one heuristic query, tens of microseconds).
constexpr std::size_t kMaxPlans = 8192;

BlasState& state() {
  // Leaked on purpose: see gemm.hpp (no device frees from static destructors).
  static auto* s = new BlasState;
  return *s;
}

int current_device() {
  int dev = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  return dev;
}

cublasLtHandle_t lt_handle_locked(BlasState& s, int dev) {
  auto it = s.lt.find(dev);
  if (it != s.lt.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  GHT_CUBLAS_TRY(cublasLtCreate(&h));
  s.lt.emplace(dev, h);
  return h;
}

void* workspace_locked(BlasState& s, int dev, cudaStream_t stream) {
  const auto key = std::make_pair(dev, stream);
  auto it = s.workspace.find(key);
  if (it != s.workspace.end()) return it->second;
  void* p = nullptr;
  // Plain cudaMalloc: the workspace lives as long as the stream is used, and must not be
  // stream-ordered memory tied to a stream that may be destroyed first.
  GHT_CUDA_TRY(cudaMalloc(&p, kWorkspaceBytes));
  s.workspace.emplace(key, p);
  return p;
}

int pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 16;
  while (a > 1 && (v % static_cast<std::uintptr_t>(a)) != 0) a /= 2;
  return a;
}

cudaDataType_t to_cuda(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

std::string shape_text(const GemmArgs& g) {
  return "gemm(m=" + std::to_string(g.m) + ", n=" + std::to_string(g.n) +
         ", k=" + std::to_string(g.k) + ", trans_a=" + std::to_string(g.trans_a) +
         ", trans_b=" + std::to_string(g.trans_b) + ", lda=" + std::to_string(g.lda) +
         ", ldb=" + std::to_string(g.ldb) + ", ldc=" + std::to_string(g.ldc) +
         ", batch=" + std::to_string(g.batch) +
         ", c=" + (g.c_type == DType::bf16 ? "bf16" : "f32") + ")";
}

void set_layout_batch(cublasLtMatrixLayout_t l, int batch, std::int64_t stride) {
  if (batch <= 1) return;
  const std::int32_t count = batch;
  GHT_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)));
  GHT_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
}

void destroy_plan(Plan& p) {
  if (p.la) (void)cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) (void)cublasLtMatrixLayoutDestroy(p.lb);
  if (p.lc) (void)cublasLtMatrixLayoutDestroy(p.lc);
  if (p.desc) (void)cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

std::shared_ptr<const Plan> share_plan(Plan p) {
  return std::shared_ptr<const Plan>(new Plan(p), [](const Plan* q) {
    Plan tmp = *q;
    destroy_plan(tmp);
    delete q;
  });
}

constexpr int kMaxRanks = 32;  // heuristic candidates a benchmark may ask for

// Build descriptors for one normalised GEMM and take the heuristic's algorithm of rank `rank`
// (0: its best). With `count` set, only count the algorithms it offers (up to rank + 1) into it.
Plan make_plan(cublasLtHandle_t h, const GemmArgs& g, const int align[3], int rank = 0,
               int* count = nullptr) {
  Plan p;
  try {
    GHT_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt's A = our B
    const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt's B = our A
    GHT_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                  sizeof(op_a)));
    GHT_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                  sizeof(op_b)));
    if (g.sm_count_target > 0) {
      const std::int32_t sms = g.sm_count_target;
      GHT_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                    &sms, sizeof(sms)));
    }
    // Column-major stored shapes: our row-major (r,c) is a column-major (c,r).
    const std::uint64_t a_rows = g.trans_b ? g.k : g.n, a_cols = g.trans_b ? g.n : g.k;
    const std::uint64_t b_rows = g.trans_a ? g.m : g.k, b_cols = g.trans_a ? g.k : g.m;
    GHT_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, a_rows, a_cols, g.ldb));
    GHT_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, b_rows, b_cols, g.lda));
    GHT_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lc, to_cuda(g.c_type),
                                              static_cast<std::uint64_t>(g.n),
                                              static_cast<std::uint64_t>(g.m), g.ldc));
    set_layout_batch(p.la, g.batch, g.stride_b);
    set_layout_batch(p.lb, g.batch, g.stride_a);
    set_layout_batch(p.lc, g.batch, g.stride_c);

    cublasLtMatmulPreference_t pref = nullptr;
    GHT_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    GHT_EXPECTS(rank >= 0 && rank < kMaxRanks, "gemm: heuristic rank " + std::to_string(rank) +
                                                    " is outside [0, " + std::to_string(kMaxRanks) + ")");
    std::array<cublasLtMatmulHeuristicResult_t, kMaxRanks> results{};
    int found = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    {
      const std::size_t ws = kWorkspaceBytes;
      const std::uint32_t al_a = static_cast<std::uint32_t>(align[1]);  // Lt's A = our B
      const std::uint32_t al_b = static_cast<std::uint32_t>(align[0]);
      const std::uint32_t al_c = static_cast<std::uint32_t>(align[2]);
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof(ws));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &al_a, sizeof(al_a));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &al_b, sizeof(al_b));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &al_c, sizeof(al_c));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &al_c, sizeof(al_c));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, rank + 1,
                                            results.data(), &found);
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    GHT_CUBLAS_TRY(st);
    if (count != nullptr) {
      *count = found;
    } else if (found <= rank || results[static_cast<std::size_t>(rank)].state != CUBLAS_STATUS_SUCCESS) {
      throw ght::cuda_error(rank == 0 ? "cuBLASLt found no algorithm for " + shape_text(g)
                                      : "cuBLASLt offers " + std::to_string(found) +
                                            " algorithms, not rank " + std::to_string(rank) +
                                            ", for " + shape_text(g));
    } else {
      p.algo = results[static_cast<std::size_t>(rank)].algo;
    }
  } catch (...) {
    destroy_plan(p);
    throw;
  }
  return p;
}

void validate(GemmArgs& g) {
  GHT_EXPECTS(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: negative dimension in " + shape_text(g));
  GHT_EXPECTS(g.batch >= 0, "gemm: negative batch in " + shape_text(g));
  GHT_EXPECTS(g.sm_count_target >= 0, "gemm: negative sm_count_target in " + shape_text(g));
  // Packed defaults: the number of stored columns of each row-major operand.
  if (g.lda == 0) g.lda = g.trans_a ? g.m : g.k;
  if (g.ldb == 0) g.ldb = g.trans_b ? g.k : g.n;
  if (g.ldc == 0) g.ldc = g.n;
  // cuBLASLt needs ld >= 1 even for degenerate shapes.
  g.lda = std::max<std::int64_t>(g.lda, 1);
  g.ldb = std::max<std::int64_t>(g.ldb, 1);
  g.ldc = std::max<std::int64_t>(g.ldc, 1);
  GHT_EXPECTS(g.lda >= (g.trans_a ? g.m : g.k), "gemm: lda too small in " + shape_text(g));
  GHT_EXPECTS(g.ldb >= (g.trans_b ? g.k : g.n), "gemm: ldb too small in " + shape_text(g));
  GHT_EXPECTS(g.ldc >= g.n, "gemm: ldc too small in " + shape_text(g));
  GHT_EXPECTS(g.c != nullptr, "gemm: C is null in " + shape_text(g));
  GHT_EXPECTS(g.k == 0 || (g.a != nullptr && g.b != nullptr),
              "gemm: A or B is null in " + shape_text(g));
  if (g.batch > 1) {
    GHT_EXPECTS(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c > 0,
                "gemm: batched GEMM needs stride_c > 0 and non-negative stride_a/b in " +
                    shape_text(g));
  } else {
    g.stride_a = g.stride_b = g.stride_c = 0;  // irrelevant; keep the plan key canonical
  }
}

}  // namespace

cublasLtHandle_t lt_handle() {
  const int dev = current_device();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return lt_handle_locked(s, dev);
}

void* blas_workspace(cudaStream_t stream, std::size_t* bytes) {
  const int dev = current_device();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (bytes) *bytes = kWorkspaceBytes;
  return workspace_locked(s, dev, stream);
}

cublasHandle_t blas_handle(cudaStream_t stream) {
  const int dev = current_device();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto key = std::make_pair(dev, stream);
  auto it = s.blas.find(key);
  if (it != s.blas.end()) return it->second;
  cublasHandle_t h = nullptr;
  GHT_CUBLAS_TRY(cublasCreate(&h));
  try {
    GHT_CUBLAS_TRY(cublasSetStream(h, stream));
    GHT_CUBLAS_TRY(cublasSetWorkspace(h, workspace_locked(s, dev, stream), kWorkspaceBytes));
    GHT_CUBLAS_TRY(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    (void)cublasDestroy(h);
    throw;
  }
  s.blas.emplace(key, h);
  return h;
}

void release_blas_resources() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.sm_budget.clear();
  s.plans.clear();  // each plan is destroyed when its last user lets go
  for (auto& [k, h] : s.blas) (void)cublasDestroy(h);
  s.blas.clear();
  for (auto& [k, h] : s.lt) (void)cublasLtDestroy(h);
  s.lt.clear();
  for (auto& [k, p] : s.workspace) (void)cudaFree(p);
  s.workspace.clear();
}

namespace {

void run_gemm(const GemmArgs& args, int rank, cudaStream_t stream) {
  GemmArgs g = args;
  validate(g);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) {
    const std::int64_t total = g.m * g.n * g.batch;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<std::int64_t>((total + threads - 1) / threads, 4096));
    if (g.c_type == DType::bf16) {
      scale_matrix_kernel<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(g.c), g.m,
                                                          g.n, g.ldc, g.stride_c, g.batch, g.beta);
    } else {
      scale_matrix_kernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(g.c), g.m, g.n,
                                                          g.ldc, g.stride_c, g.batch, g.beta);
    }
    GHT_CUDA_CHECK_LAUNCH();
    return;
  }

  const int dev = current_device();
  const int align[3] = {pointer_alignment(g.a), pointer_alignment(g.b), pointer_alignment(g.c)};
  PlanKey key = {dev,       g.m,        g.n,        g.k,        g.trans_a,
                 g.trans_b, g.lda,      g.ldb,      g.ldc,      static_cast<int>(g.c_type),
                 g.batch,   g.stride_a, g.stride_b, g.stride_c, align[0],
                 align[1],  align[2],   rank,       g.sm_count_target};
  auto& s = state();
  cublasLtHandle_t h = nullptr;
  void* ws = nullptr;
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    h = lt_handle_locked(s, dev);
    ws = workspace_locked(s, dev, stream);
    if (g.sm_count_target == 0) {
      const auto b = s.sm_budget.find({dev, stream});
      if (b != s.sm_budget.end()) {
        g.sm_count_target = b->second;
        key[kKeySms] = b->second;
      }
    }
    auto it = s.plans.find(key);
    if (it == s.plans.end()) {
      if (s.plans.size() >= kMaxPlans) s.plans.clear();
      it = s.plans.emplace(key, share_plan(make_plan(h, g, align, rank))).first;
    }
    plan = it->second;  // descriptors are immutable once built
  }
  const float alpha = g.alpha, beta = g.beta;
  GHT_CUBLAS_TRY(cublasLtMatmul(h, plan->desc, &alpha, g.b, plan->la, g.a, plan->lb, &beta, g.c,
                                plan->lc, g.c, plan->lc, &plan->algo, ws, kWorkspaceBytes, stream));
}

}  // namespace

void gemm(const GemmArgs& args, cudaStream_t stream) { run_gemm(args, 0, stream); }

void set_stream_sm_budget(cudaStream_t stream, int sms) {
  GHT_EXPECTS(sms >= 0, "set_stream_sm_budget: the SM budget must be non-negative, got " + std::to_string(sms));
  const int dev = current_device();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (sms == 0) {
    s.sm_budget.erase({dev, stream});
  } else {
    s.sm_budget[{dev, stream}] = sms;
  }
}

int stream_sm_budget(cudaStream_t stream) {
  const int dev = current_device();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.sm_budget.find({dev, stream});
  return it == s.sm_budget.end() ? 0 : it->second;
}

int stream_sm_count(cudaStream_t stream, int device) {
  thread_local int sm_device = -1, sm_count = 0;
  if (sm_device != device) {
    GHT_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    sm_device = device;
  }
  const int budget = stream_sm_budget(stream);
  return budget > 0 ? std::min(budget, sm_count) : sm_count;
}

int gemm_heuristic_count(const GemmArgs& args, int max) {
  GHT_EXPECTS(max >= 1, "gemm_heuristic_count: max must be at least 1, got " + std::to_string(max));
  GemmArgs g = args;
  validate(g);
  if (g.m == 0 || g.n == 0 || g.batch == 0 || g.k == 0) return 1;  // no cuBLASLt call to rank
  const int align[3] = {pointer_alignment(g.a), pointer_alignment(g.b), pointer_alignment(g.c)};
  int found = 0;
  Plan p = make_plan(lt_handle(), g, align, std::min(max, kMaxRanks) - 1, &found);
  destroy_plan(p);
  return found;
}

void gemm_ranked(const GemmArgs& args, int rank, cudaStream_t stream) {
  GHT_EXPECTS(rank >= 0, "gemm_ranked: rank must be non-negative, got " + std::to_string(rank));
  run_gemm(args, rank, stream);
}

}  // namespace ght::kernels::cuda
