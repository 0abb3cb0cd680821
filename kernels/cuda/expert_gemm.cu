// Grouped expert GEMMs: cuBLASLt loop, cublasGemmGroupedBatchedEx and our own WMMA kernel
// (see expert_gemm.hpp).
#include "kernels/cuda/expert_gemm.hpp"

#include <mma.h>

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cutlass/grouped_gemm.hpp"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

// ---- custom grouped kernel --------------------------------------------------------------------
//
// Each block computes one 128x128 tile of one group's C = op(A)·op(B) (row-major), 8 warps in a
// 2 (m) x 4 (n) layout, each warp 64x32 = 4x2 WMMA 16x16x16 fragments with fp32 accumulators.
// Tiles of A and B go through shared memory in their stored orientation (the WMMA fragment
// layout absorbs the transpose), two stages deep with cp.async.

constexpr int kBM = 128, kBN = 128, kBK = 32, kPad = 8;
constexpr int kThreads = 256;
constexpr int kStageElems = 5120;  // max(128·(32+8), 32·(128+8)) bf16 elements per operand

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0 source bytes: the 16 destination bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copy a ROWS x COLS tile (COLS contiguous in global memory) whose top-left is element
// (row0, col0) of a row-major matrix with `ld`, into smem with row stride COLS + kPad.
// Rows >= row_lim or columns >= col_lim are zero-filled (col_lim is a multiple of 8).
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(bf16* smem, const bf16* g, std::int64_t ld, int row0,
                                          int col0, int row_lim, int col_lim) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += kThreads) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
    const bool valid = row0 + r < row_lim && col0 + c < col_lim;
    const bf16* src = valid ? g + static_cast<std::int64_t>(row0 + r) * ld + col0 + c : g;
    cp_async16(smem + r * (COLS + kPad) + c, src, valid);
  }
}

struct TileProblem {
  int M, N, K;          // this group's C is M x N, reduction K
  const bf16* a;        // stored (M, K), or (K, M) when TA
  std::int64_t lda;
  const bf16* b;        // stored (K, N), or (N, K) when TB
  std::int64_t ldb;
  void* c;              // (M, N)
  std::int64_t ldc;
};

template <bool TA, bool TB, typename CT>
__device__ void gemm_tile(const TileProblem& p, int m0, int n0, float alpha, float beta) {
  using namespace nvcuda;
  __shared__ __align__(128) bf16 smem[2][2][kStageElems];  // [stage][A|B]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;

  auto load_stage = [&](int stage, int k0) {
    if constexpr (!TA) {  // A tile (BM x BK) of stored (M, K)
      load_tile<kBM, kBK>(smem[stage][0], p.a, p.lda, m0, k0, p.M, p.K);
    } else {  // A^T tile (BK x BM) of stored (K, M)
      load_tile<kBK, kBM>(smem[stage][0], p.a, p.lda, k0, m0, p.K, p.M);
    }
    if constexpr (!TB) {  // B tile (BK x BN) of stored (K, N)
      load_tile<kBK, kBN>(smem[stage][1], p.b, p.ldb, k0, n0, p.K, p.N);
    } else {  // B^T tile (BN x BK) of stored (N, K)
      load_tile<kBN, kBK>(smem[stage][1], p.b, p.ldb, n0, k0, p.N, p.K);
    }
  };

  using ALayout = std::conditional_t<TA, wmma::col_major, wmma::row_major>;
  using BLayout = std::conditional_t<TB, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int k_tiles = (p.K + kBK - 1) / kBK;
  if (k_tiles > 0) {
    load_stage(0, 0);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) {
      load_stage((kt + 1) & 1, (kt + 1) * kBK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* as = smem[kt & 1][0];
    const bf16* bs = smem[kt & 1][1];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, ALayout> fa[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = wm * 64 + i * 16;
        if constexpr (!TA) {
          wmma::load_matrix_sync(fa[i], as + m * (kBK + kPad) + kk, kBK + kPad);
        } else {
          wmma::load_matrix_sync(fa[i], as + kk * (kBM + kPad) + m, kBM + kPad);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int n = wn * 32 + j * 16;
        if constexpr (!TB) {
          wmma::load_matrix_sync(fb[j], bs + kk * (kBN + kPad) + n, kBN + kPad);
        } else {
          wmma::load_matrix_sync(fb[j], bs + n * (kBK + kPad) + kk, kBK + kPad);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();  // the next iteration's loads overwrite the stage just read
  }

  // Epilogue: each warp stages one 16x16 fragment at a time in shared memory (reusing the
  // operand buffers) and writes it out with bounds checks, alpha/beta and the output type.
  float* stage = reinterpret_cast<float*>(&smem[0][0][0]) + warp * 256;
  CT* c = static_cast<CT*>(p.c);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int gm = m0 + wm * 64 + i * 16 + e / 16;
        const int gn = n0 + wn * 32 + j * 16 + e % 16;
        if (gm < p.M && gn < p.N) {
          CT* dst = c + static_cast<std::int64_t>(gm) * p.ldc + gn;
          float v = alpha * stage[e];
          if (beta != 0.0f) v += beta * detail::to_float(*dst);
          *dst = detail::from_float<CT>(v);
        }
      }
      __syncwarp();
    }
  }
}

// var-M: blockIdx.x enumerates (group, m-tile) pairs over an upper bound; blockIdx.y the n-tile.
template <bool TB, typename CT>
__global__ void __launch_bounds__(kThreads)
    grouped_var_m_kernel(const std::int32_t* __restrict__ offsets, int groups, int N, int K,
                         const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb,
                         std::int64_t stride_b, void* c, std::int64_t ldc, float alpha,
                         float beta) {
  __shared__ int s_group, s_tile;
  if (threadIdx.x < 32) {
    // Warp 0 finds which (group, m-tile) this block is: a warp-wide inclusive scan of the groups'
    // tile counts, 32 groups at a time, and a ballot for the first group whose range holds mt.
    const int lane = threadIdx.x;
    const int mt = static_cast<int>(blockIdx.x);
    int cum = 0, g = -1, t = 0;
    for (int base = 0; base < groups; base += 32) {
      const int e = base + lane;
      const int tiles = e < groups ? (offsets[e + 1] - offsets[e] + kBM - 1) / kBM : 0;
      int incl = tiles;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, mt < cum + incl);
      if (hit != 0u) {
        const int first = __ffs(static_cast<int>(hit)) - 1;
        const int excl = __shfl_sync(0xffffffffu, incl - tiles, first);
        g = base + first;
        t = mt - cum - excl;
        break;
      }
      cum += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      s_group = g;
      s_tile = t;
    }
  }
  __syncthreads();
  const int g = s_group;
  if (g < 0) return;  // beyond the last tile of the last group
  const std::int64_t r0 = offsets[g];
  TileProblem p;
  p.M = offsets[g + 1] - offsets[g];
  p.N = N;
  p.K = K;
  p.a = a + r0 * lda;
  p.lda = lda;
  p.b = b + g * stride_b;
  p.ldb = ldb;
  p.c = static_cast<CT*>(c) + r0 * ldc;
  p.ldc = ldc;
  gemm_tile<false, TB, CT>(p, s_tile * kBM, static_cast<int>(blockIdx.y) * kBN, alpha, beta);
}

// var-K: blockIdx.x = group · m_tiles + m-tile, blockIdx.y = n-tile; reduction over the rows.
template <typename CT>
__global__ void __launch_bounds__(kThreads)
    grouped_var_k_kernel(const std::int32_t* __restrict__ offsets, int M, int N, int m_tiles,
                         const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, void* c,
                         std::int64_t ldc, std::int64_t stride_c, float alpha, float beta) {
  const int g = static_cast<int>(blockIdx.x) / m_tiles;
  const int mt = static_cast<int>(blockIdx.x) % m_tiles;
  const std::int64_t r0 = offsets[g];
  const int rows = offsets[g + 1] - offsets[g];
  if (rows == 0 && beta == 1.0f) return;  // C_e = 1·C_e
  TileProblem p;
  p.M = M;
  p.N = N;
  p.K = rows;
  p.a = a + r0 * lda;
  p.lda = lda;
  p.b = b + r0 * ldb;
  p.ldb = ldb;
  p.c = static_cast<CT*>(c) + g * stride_c;
  p.ldc = ldc;
  gemm_tile<true, false, CT>(p, mt * kBM, static_cast<int>(blockIdx.y) * kBN, alpha, beta);
}

// C_e = beta·C_e for the groups with no rows (var-K), which the CUTLASS path skips. Grid:
// (blocks over the m·n elements, E); a block of a non-empty group returns at once.
template <typename CT>
__global__ void scale_empty_groups_kernel(const std::int32_t* __restrict__ offsets, int M, int N,
                                          CT* __restrict__ c, std::int64_t ldc, std::int64_t stride_c,
                                          float beta) {
  const int g = static_cast<int>(blockIdx.y);
  if (offsets[g + 1] > offsets[g]) return;
  CT* cg = c + g * stride_c;
  const std::int64_t total = static_cast<std::int64_t>(M) * N;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    CT& v = cg[(i / N) * ldc + i % N];
    v = beta == 0.0f ? CT(0.0f) : CT(beta * static_cast<float>(v));
  }
}

// ---- shared helpers -------------------------------------------------------------------------

void check_offsets(const GroupOffsets& o, const char* op) {
  GHT_EXPECTS(o.groups >= 1, std::string(op) + ": need at least one group, got " +
                                 std::to_string(o.groups));
  GHT_EXPECTS(o.device != nullptr || o.host != nullptr,
              std::string(op) + ": group offsets missing (device and host are both null)");
}

std::vector<std::int32_t> host_offsets(const GroupOffsets& o, cudaStream_t stream) {
  if (o.host != nullptr) return std::vector<std::int32_t>(o.host, o.host + o.groups + 1);
  return download_offsets(o.device, o.groups, stream);
}

void normalise(GroupedGemmVarM& g) {
  if (g.lda == 0) g.lda = g.k;
  if (g.ldb == 0) g.ldb = g.trans_b ? g.k : g.n;
  if (g.ldc == 0) g.ldc = g.n;
  GHT_EXPECTS(g.n > 0 && g.k > 0, "grouped_gemm(var-M): need n > 0 and k > 0, got n=" +
                                      std::to_string(g.n) + " k=" + std::to_string(g.k));
  GHT_EXPECTS(g.lda >= g.k && g.ldb >= (g.trans_b ? g.k : g.n) && g.ldc >= g.n,
              "grouped_gemm(var-M): a leading dimension is smaller than its row");
  GHT_EXPECTS(g.a != nullptr && g.b != nullptr && g.c != nullptr,
              "grouped_gemm(var-M): null operand");
  GHT_EXPECTS(g.n <= 0x7fffffff && g.k <= 0x7fffffff, "grouped_gemm(var-M): n or k too large");
}

void normalise(GroupedGemmVarK& g) {
  if (g.lda == 0) g.lda = g.m;
  if (g.ldb == 0) g.ldb = g.n;
  if (g.ldc == 0) g.ldc = g.n;
  GHT_EXPECTS(g.m > 0 && g.n > 0, "grouped_gemm(var-K): need m > 0 and n > 0, got m=" +
                                      std::to_string(g.m) + " n=" + std::to_string(g.n));
  GHT_EXPECTS(g.lda >= g.m && g.ldb >= g.n && g.ldc >= g.n,
              "grouped_gemm(var-K): a leading dimension is smaller than its row");
  GHT_EXPECTS(g.a != nullptr && g.b != nullptr && g.c != nullptr,
              "grouped_gemm(var-K): null operand");
  GHT_EXPECTS(g.m <= 0x7fffffff && g.n <= 0x7fffffff, "grouped_gemm(var-K): m or n too large");
}

char* byte_ptr(void* p, std::int64_t elems, DType t) {
  return static_cast<char*>(p) + elems * static_cast<std::int64_t>(dtype_size(t));
}

// ---- cublasGemmGroupedBatchedEx -------------------------------------------------------------

// One column-major problem per non-empty group (cuBLAS's view of our row-major one; see gemm.cu).
struct ColMajorBatch {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> pa, pb;
  std::vector<void*> pc;
  void add(cublasOperation_t opa, cublasOperation_t opb, std::int64_t mm, std::int64_t nn,
           std::int64_t kk, const void* a, std::int64_t la, const void* b, std::int64_t lb,
           void* c, std::int64_t lc, float al, float be) {
    ta.push_back(opa);
    tb.push_back(opb);
    m.push_back(static_cast<int>(mm));
    n.push_back(static_cast<int>(nn));
    k.push_back(static_cast<int>(kk));
    lda.push_back(static_cast<int>(la));
    ldb.push_back(static_cast<int>(lb));
    ldc.push_back(static_cast<int>(lc));
    size.push_back(1);
    alpha.push_back(al);
    beta.push_back(be);
    pa.push_back(a);
    pb.push_back(b);
    pc.push_back(c);
  }
};

void run_cublas_grouped(ColMajorBatch& cb, cudaStream_t stream) {
  const int count = static_cast<int>(cb.m.size());
  if (count == 0) return;
#if CUBLAS_VERSION >= 120500
  // Device pointer arrays (cuBLAS reads them on the GPU); the copy is stream-ordered.
  const std::size_t bytes = 3 * static_cast<std::size_t>(count) * sizeof(void*);
  auto* dptr = static_cast<void**>(stream_scratch(stream, bytes));
  std::vector<const void*> host(3 * static_cast<std::size_t>(count));
  std::copy(cb.pa.begin(), cb.pa.end(), host.begin());
  std::copy(cb.pb.begin(), cb.pb.end(), host.begin() + count);
  std::copy(cb.pc.begin(), cb.pc.end(), host.begin() + 2 * count);
  // From pageable memory: cudaMemcpyAsync stages the bytes before it returns, so `host` may die
  // right after while the DMA itself stays stream-ordered.
  GHT_CUDA_TRY(cudaMemcpyAsync(dptr, host.data(), bytes, cudaMemcpyHostToDevice, stream));
  GHT_CUBLAS_TRY(cublasGemmGroupedBatchedEx(
      blas_handle(stream), cb.ta.data(), cb.tb.data(), cb.m.data(), cb.n.data(), cb.k.data(),
      cb.alpha.data(), reinterpret_cast<const void* const*>(dptr), CUDA_R_16BF, cb.lda.data(),
      reinterpret_cast<const void* const*>(dptr + count), CUDA_R_16BF, cb.ldb.data(),
      cb.beta.data(), dptr + 2 * count, CUDA_R_16BF, cb.ldc.data(), count, cb.size.data(),
      CUBLAS_COMPUTE_32F));
#else
  (void)stream;
  GHT_FAIL("grouped_gemm: cublasGemmGroupedBatchedEx needs cuBLAS >= 12.5");
#endif
}

unsigned grid_dim(std::int64_t v, const char* what) {
  GHT_EXPECTS(v >= 1 && v <= 0x7fffffff, std::string("grouped_gemm: grid ") + what + " = " +
                                             std::to_string(v) + " out of range");
  return static_cast<unsigned>(v);
}


// ---- side streams for cublaslt_streams --------------------------------------------------------

/// kExpertStreams non-blocking streams and their join events, for one host thread and device.
/// Per thread, so that two threads' fork/join event pairs never interleave.
struct SideStreams {
  int device = -1;
  cudaEvent_t fork = nullptr;
  std::array<cudaStream_t, kExpertStreams> streams{};
  std::array<cudaEvent_t, kExpertStreams> joined{};

  void release() noexcept {  // errors ignored: may run while the CUDA runtime shuts down
    if (device < 0) return;
    for (int i = 0; i < kExpertStreams; ++i) {
      if (streams[static_cast<std::size_t>(i)] != nullptr) (void)cudaStreamDestroy(streams[static_cast<std::size_t>(i)]);
      if (joined[static_cast<std::size_t>(i)] != nullptr) (void)cudaEventDestroy(joined[static_cast<std::size_t>(i)]);
    }
    if (fork != nullptr) (void)cudaEventDestroy(fork);
    *this = SideStreams{};
  }
  ~SideStreams() { release(); }
};

SideStreams& side_streams() {
  thread_local SideStreams ss;
  int dev = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  if (ss.device != dev) {
    ss.release();
    ss.device = dev;
    GHT_CUDA_TRY(cudaEventCreateWithFlags(&ss.fork, cudaEventDisableTiming));
    for (std::size_t i = 0; i < ss.streams.size(); ++i) {
      GHT_CUDA_TRY(cudaStreamCreateWithFlags(&ss.streams[i], cudaStreamNonBlocking));
      GHT_CUDA_TRY(cudaEventCreateWithFlags(&ss.joined[i], cudaEventDisableTiming));
    }
  }
  return ss;
}

/// Call run(e, s) for each group e in `groups`, on `stream` itself (spread = false) or round-robin
/// over the side streams, forked after the work already queued on `stream` and joined back into
/// it before returning, so callers see one stream-ordered operation either way.
template <class Run>
void for_each_group(const std::vector<int>& groups, bool spread, cudaStream_t stream, Run&& run) {
  if (!spread || groups.size() < 2) {
    for (int e : groups) run(e, stream);
    return;
  }
  SideStreams& ss = side_streams();
  const std::size_t k = std::min<std::size_t>(groups.size(), ss.streams.size());
  GHT_CUDA_TRY(cudaEventRecord(ss.fork, stream));
  for (std::size_t i = 0; i < k; ++i) GHT_CUDA_TRY(cudaStreamWaitEvent(ss.streams[i], ss.fork, 0));
  for (std::size_t i = 0; i < groups.size(); ++i) run(groups[i], ss.streams[i % k]);
  for (std::size_t i = 0; i < k; ++i) {
    GHT_CUDA_TRY(cudaEventRecord(ss.joined[i], ss.streams[i]));
    GHT_CUDA_TRY(cudaStreamWaitEvent(stream, ss.joined[i], 0));
  }
}

// ---- CUTLASS --------------------------------------------------------------------------------

namespace cg = cutlass_grouped;

bool rows_aligned(std::int64_t ld, std::size_t elem) { return (ld * static_cast<std::int64_t>(elem)) % 16 == 0; }

// The fields var-M and var-K share: groups, operands, scalars, the device.
template <class Args>
cg::Problem cutlass_problem(const Args& g, const GroupOffsets& o, cudaStream_t stream) {
  GHT_EXPECTS(o.device != nullptr, "grouped_gemm(cutlass): needs device offsets");
  cg::Problem p;
  p.groups = o.groups;
  p.offsets = o.device;
  p.a = g.a;
  p.lda = g.lda;
  p.b = g.b;
  p.ldb = g.ldb;
  p.c = g.c;
  p.ldc = g.ldc;
  p.alpha = g.alpha;
  p.beta = g.beta;
  GHT_CUDA_TRY(cudaGetDevice(&p.device));
  p.sm_count = stream_sm_count(stream, p.device);  // gemm.hpp: fewer SMs, so others may run beside
  return p;
}

// Normalised arguments (leading dimensions filled in) that the CUTLASS instantiations cover:
// 16-byte aligned operands and rows, and extents of 8 along each contiguous dimension (CUTLASS's
// own alignment rule, which it cannot check itself without host problem sizes).
bool covered(const GroupedGemmVarM& g) {
  return cutlass_available() && g.c_type == DType::bf16 && detail::aligned16(g.a, g.b, g.c) &&
         rows_aligned(g.lda, 2) && rows_aligned(g.ldb, 2) && rows_aligned(g.ldc, 2) &&
         rows_aligned(g.stride_b, 2) && rows_aligned(g.k, 2) && rows_aligned(g.n, 2);
}
bool covered(const GroupedGemmVarK& g) {
  const std::size_t cs = dtype_size(g.c_type);
  return cutlass_available() && detail::aligned16(g.a, g.b, g.c) && rows_aligned(g.lda, 2) &&
         rows_aligned(g.ldb, 2) && rows_aligned(g.ldc, cs) && rows_aligned(g.stride_c, cs) &&
         rows_aligned(g.m, 2) && rows_aligned(g.n, 2);
}

// True when it ran; false for a call CUTLASS does not cover (the caller runs `custom`).
bool run_cutlass(const GroupedGemmVarM& g, const GroupOffsets& o, cudaStream_t stream) {
  if (!cutlass_available()) GHT_FAIL("grouped_gemm: this build has no CUTLASS (GroupedGemmImpl::cutlass)");
  if (!covered(g)) return false;
  cg::Problem p = cutlass_problem(g, o, stream);
  p.n = g.n;
  p.k = g.k;
  p.stride_b = g.stride_b;
#if defined(GHT_HAVE_CUTLASS)
  (g.trans_b ? cg::var_m_bt_bf16_128x256 : cg::var_m_bn_bf16_128x256)(p, stream);
#else
  (void)p;  // not reached: covered() is false without CUTLASS
  (void)stream;
#endif
  return true;
}

bool run_cutlass(const GroupedGemmVarK& g, const GroupOffsets& o, cudaStream_t stream) {
  if (!cutlass_available()) GHT_FAIL("grouped_gemm: this build has no CUTLASS (GroupedGemmImpl::cutlass)");
  if (!covered(g)) return false;
  cg::Problem p = cutlass_problem(g, o, stream);
  p.var_k = true;
  p.m = g.m;
  p.n = g.n;
  p.stride_c = g.stride_c;
#if defined(GHT_HAVE_CUTLASS)
  if (g.c_type == DType::f32) {
    cg::var_k_f32(p, stream);
  } else {
    cg::var_k_bf16(p, stream);
  }
#else
  (void)p;  // not reached: covered() is false without CUTLASS
#endif
  if (g.beta != 1.0f) {  // groups with no rows: C_e = beta·C_e (CUTLASS skipped them)
    const std::int64_t blocks = std::min<std::int64_t>(detail::ceil_div(g.m * g.n, 256), 1024);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(o.groups));
    if (g.c_type == DType::f32) {
      scale_empty_groups_kernel<float><<<grid, 256, 0, stream>>>(o.device, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<float*>(g.c), g.ldc, g.stride_c, g.beta);
    } else {
      scale_empty_groups_kernel<bf16><<<grid, 256, 0, stream>>>(o.device, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<bf16*>(g.c), g.ldc, g.stride_c, g.beta);
    }
    GHT_CUDA_CHECK_LAUNCH();
  }
  return true;
}

}  // namespace

std::string_view to_string(GroupedGemmImpl impl) noexcept {
  switch (impl) {
    case GroupedGemmImpl::cublaslt_loop: return "cublaslt_loop";
    case GroupedGemmImpl::cublas_grouped: return "cublas_grouped";
    case GroupedGemmImpl::custom: return "custom";
    case GroupedGemmImpl::cublaslt_streams: return "cublaslt_streams";
    case GroupedGemmImpl::cutlass: return "cutlass";
  }
  return "?";
}

bool cutlass_available() noexcept {
#if defined(GHT_HAVE_CUTLASS)
  return true;
#else
  return false;
#endif
}

GroupedGemmImpl default_grouped_gemm_impl() noexcept {
  return cutlass_available() ? GroupedGemmImpl::cutlass : GroupedGemmImpl::cublaslt_streams;
}

bool cutlass_covers(const GroupedGemmVarM& args) {
  GroupedGemmVarM g = args;
  normalise(g);
  return covered(g);
}

bool cutlass_covers(const GroupedGemmVarK& args) {
  GroupedGemmVarK g = args;
  normalise(g);
  return covered(g);
}

std::vector<std::int32_t> download_offsets(const std::int32_t* device_offsets, int groups,
                                           cudaStream_t stream) {
  GHT_EXPECTS(device_offsets != nullptr && groups >= 1, "download_offsets: no offsets");
  std::vector<std::int32_t> h(static_cast<std::size_t>(groups) + 1);
  GHT_CUDA_TRY(cudaMemcpyAsync(h.data(), device_offsets, h.size() * sizeof(std::int32_t),
                               cudaMemcpyDeviceToHost, stream));
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  return h;
}

void grouped_gemm(const GroupedGemmVarM& args, const GroupOffsets& offsets, GroupedGemmImpl impl,
                  cudaStream_t stream) {
  GroupedGemmVarM g = args;
  normalise(g);
  check_offsets(offsets, "grouped_gemm(var-M)");
  const int E = offsets.groups;

  if (impl == GroupedGemmImpl::cutlass) {
    if (run_cutlass(g, offsets, stream)) return;
    impl = GroupedGemmImpl::custom;  // a call CUTLASS does not cover: our kernel, still sync-free
  }
  if (impl == GroupedGemmImpl::custom) {
    GHT_EXPECTS(offsets.device != nullptr, "grouped_gemm(var-M, custom): needs device offsets");
    GHT_EXPECTS(offsets.max_rows >= 0, "grouped_gemm(var-M, custom): max_rows < 0");
    GHT_EXPECTS(g.k % 8 == 0 && (g.trans_b || g.n % 8 == 0) && g.lda % 8 == 0 &&
                    g.ldb % 8 == 0 && g.stride_b % 8 == 0 && detail::aligned16(g.a, g.b),
                "grouped_gemm(var-M, custom): k" + std::string(g.trans_b ? "" : ", n") +
                    ", lda, ldb and stride_b must be multiples of 8 and A, B 16-byte aligned");
    const std::int64_t m_tiles = detail::ceil_div(offsets.max_rows, kBM) + E;
    const dim3 grid(grid_dim(m_tiles, "x"), grid_dim(detail::ceil_div(g.n, kBN), "y"));
    const int N = static_cast<int>(g.n), K = static_cast<int>(g.k);
    if (g.c_type == DType::bf16) {
      if (g.trans_b)
        grouped_var_m_kernel<true, bf16><<<grid, kThreads, 0, stream>>>(offsets.device, E, N, K, g.a, g.lda, g.b, g.ldb, g.stride_b, g.c, g.ldc, g.alpha, g.beta);
      else
        grouped_var_m_kernel<false, bf16><<<grid, kThreads, 0, stream>>>(offsets.device, E, N, K, g.a, g.lda, g.b, g.ldb, g.stride_b, g.c, g.ldc, g.alpha, g.beta);
    } else {
      if (g.trans_b)
        grouped_var_m_kernel<true, float><<<grid, kThreads, 0, stream>>>(offsets.device, E, N, K, g.a, g.lda, g.b, g.ldb, g.stride_b, g.c, g.ldc, g.alpha, g.beta);
      else
        grouped_var_m_kernel<false, float><<<grid, kThreads, 0, stream>>>(offsets.device, E, N, K, g.a, g.lda, g.b, g.ldb, g.stride_b, g.c, g.ldc, g.alpha, g.beta);
    }
    GHT_CUDA_CHECK_LAUNCH();
    return;
  }

  const auto off = host_offsets(offsets, stream);
  if (impl == GroupedGemmImpl::cublaslt_loop || impl == GroupedGemmImpl::cublaslt_streams) {
    std::vector<int> busy;
    for (int e = 0; e < E; ++e) {
      if (off[e + 1] > off[e]) busy.push_back(e);
    }
    for_each_group(busy, impl == GroupedGemmImpl::cublaslt_streams, stream, [&](int e, cudaStream_t s) {
      const std::int64_t r0 = off[e], rows = off[e + 1] - off[e];
      GemmArgs a;
      a.m = rows;
      a.n = g.n;
      a.k = g.k;
      a.a = g.a + r0 * g.lda;
      a.lda = g.lda;
      a.b = g.b + e * g.stride_b;
      a.ldb = g.ldb;
      a.trans_b = g.trans_b;
      a.c = byte_ptr(g.c, r0 * g.ldc, g.c_type);
      a.c_type = g.c_type;
      a.ldc = g.ldc;
      a.alpha = g.alpha;
      a.beta = g.beta;
      gemm(a, s);
    });
    return;
  }
  GHT_EXPECTS(impl == GroupedGemmImpl::cublas_grouped, "grouped_gemm: unknown implementation");
  GHT_EXPECTS(g.c_type == DType::bf16,
              "grouped_gemm(var-M, cublas_grouped): cuBLAS has no bf16-input fp32-output grouped "
              "GEMM; use c_type bf16 or another implementation");
  ColMajorBatch cb;
  for (int e = 0; e < E; ++e) {
    const std::int64_t r0 = off[e], rows = off[e + 1] - off[e];
    if (rows <= 0) continue;
    // Row-major C_e(rows, n) = A_e(rows, k)·op(B_e) is column-major C^T = op(B_e)^T·A_e^T.
    cb.add(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, g.n, rows, g.k,
           g.b + e * g.stride_b, g.ldb, g.a + r0 * g.lda, g.lda, byte_ptr(g.c, r0 * g.ldc, g.c_type),
           g.ldc, g.alpha, g.beta);
  }
  run_cublas_grouped(cb, stream);
}

void grouped_gemm(const GroupedGemmVarK& args, const GroupOffsets& offsets, GroupedGemmImpl impl,
                  cudaStream_t stream) {
  GroupedGemmVarK g = args;
  normalise(g);
  check_offsets(offsets, "grouped_gemm(var-K)");
  const int E = offsets.groups;
  GHT_EXPECTS(E == 1 || g.stride_c >= g.m * g.ldc || g.stride_c <= -g.m * g.ldc,
              "grouped_gemm(var-K): stride_c makes the groups' C overlap");

  if (impl == GroupedGemmImpl::cutlass) {
    if (run_cutlass(g, offsets, stream)) return;
    impl = GroupedGemmImpl::custom;  // a call CUTLASS does not cover: our kernel, still sync-free
  }
  if (impl == GroupedGemmImpl::custom) {
    GHT_EXPECTS(offsets.device != nullptr, "grouped_gemm(var-K, custom): needs device offsets");
    GHT_EXPECTS(g.m % 8 == 0 && g.n % 8 == 0 && g.lda % 8 == 0 && g.ldb % 8 == 0 &&
                    detail::aligned16(g.a, g.b),
                "grouped_gemm(var-K, custom): m, n, lda and ldb must be multiples of 8 and A, B "
                "16-byte aligned");
    const std::int64_t m_tiles = detail::ceil_div(g.m, kBM);
    const dim3 grid(grid_dim(m_tiles * E, "x"), grid_dim(detail::ceil_div(g.n, kBN), "y"));
    const int M = static_cast<int>(g.m), N = static_cast<int>(g.n), mt = static_cast<int>(m_tiles);
    if (g.c_type == DType::bf16) {
      grouped_var_k_kernel<bf16><<<grid, kThreads, 0, stream>>>(offsets.device, M, N, mt, g.a, g.lda, g.b, g.ldb, g.c, g.ldc, g.stride_c, g.alpha, g.beta);
    } else {
      grouped_var_k_kernel<float><<<grid, kThreads, 0, stream>>>(offsets.device, M, N, mt, g.a, g.lda, g.b, g.ldb, g.c, g.ldc, g.stride_c, g.alpha, g.beta);
    }
    GHT_CUDA_CHECK_LAUNCH();
    return;
  }

  const auto off = host_offsets(offsets, stream);
  auto empty_group = [&](int e, cudaStream_t s) {
    // No rows: C_e = beta·C_e (a no-op for the usual beta = 1). gemm() handles k = 0.
    if (g.beta == 1.0f) return;
    GemmArgs a;
    a.m = g.m;
    a.n = g.n;
    a.k = 0;
    a.c = byte_ptr(g.c, e * g.stride_c, g.c_type);
    a.c_type = g.c_type;
    a.ldc = g.ldc;
    a.beta = g.beta;
    gemm(a, s);
  };
  if (impl == GroupedGemmImpl::cublaslt_loop || impl == GroupedGemmImpl::cublaslt_streams) {
    std::vector<int> all(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) all[static_cast<std::size_t>(e)] = e;
    for_each_group(all, impl == GroupedGemmImpl::cublaslt_streams, stream, [&](int e, cudaStream_t s) {
      const std::int64_t r0 = off[e], rows = off[e + 1] - off[e];
      if (rows <= 0) {
        empty_group(e, s);
        return;
      }
      GemmArgs a;
      a.m = g.m;
      a.n = g.n;
      a.k = rows;
      a.a = g.a + r0 * g.lda;
      a.lda = g.lda;
      a.trans_a = true;
      a.b = g.b + r0 * g.ldb;
      a.ldb = g.ldb;
      a.c = byte_ptr(g.c, e * g.stride_c, g.c_type);
      a.c_type = g.c_type;
      a.ldc = g.ldc;
      a.alpha = g.alpha;
      a.beta = g.beta;
      gemm(a, s);
    });
    return;
  }
  GHT_EXPECTS(impl == GroupedGemmImpl::cublas_grouped, "grouped_gemm: unknown implementation");
  GHT_EXPECTS(g.c_type == DType::bf16,
              "grouped_gemm(var-K, cublas_grouped): cuBLAS has no bf16-input fp32-output grouped "
              "GEMM; use c_type bf16 or another implementation");
  ColMajorBatch cb;
  for (int e = 0; e < E; ++e) {
    const std::int64_t r0 = off[e], rows = off[e + 1] - off[e];
    if (rows <= 0) {
      empty_group(e, stream);
      continue;
    }
    // Row-major C_e(m, n) = A_e^T·B_e with A_e (rows, m), B_e (rows, n) is column-major
    // C^T(n, m) = B_e^T·A_e: cuBLAS A = B_e (op N, ld ldb), cuBLAS B = A_e (op T, ld lda).
    cb.add(CUBLAS_OP_N, CUBLAS_OP_T, g.n, g.m, rows, g.b + r0 * g.ldb, g.ldb, g.a + r0 * g.lda,
           g.lda, byte_ptr(g.c, e * g.stride_c, g.c_type), g.ldc, g.alpha, g.beta);
  }
  run_cublas_grouped(cb, stream);
}

}  // namespace ght::kernels::cuda
