// LM head + cross-entropy, chunked over rows (see lm_head_ce.hpp).
#include "kernels/cuda/lm_head_ce.hpp"

#include <algorithm>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr int kRowThreads = 1024;

__device__ __forceinline__ bool target_ok(std::int32_t tg, int V, std::int32_t ignore) {
  return tg != ignore && tg >= 0 && tg < V;
}

__device__ __forceinline__ int block_sum_int(int v, int* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void count_valid_kernel(const std::int32_t* __restrict__ targets, std::int64_t N, int V,
                                   std::int32_t ignore, int* __restrict__ valid) {
  __shared__ int red[32];
  int c = 0;
  for (std::int64_t i = threadIdx.x; i < N; i += blockDim.x) c += target_ok(targets[i], V, ignore);
  c = block_sum_int(c, red);
  if (threadIdx.x == 0) *valid = c;
}

// One block per row of the chunk. Pass 1: an online max/sum per thread, combined over the
// block, gives lse. BACKWARD pass 2 overwrites the row with dlogits = (softmax − onehot)·scale.
template <int VEC, bool BACKWARD>
__global__ void __launch_bounds__(kRowThreads)
    ce_row_kernel(bf16* __restrict__ logits, const std::int32_t* __restrict__ targets, int V,
                  std::int32_t ignore, float* __restrict__ lse_out, float* __restrict__ row_loss,
                  const int* __restrict__ valid, float dloss) {
  __shared__ float red[32];
  __shared__ float s_target_logit;
  const std::int64_t r = blockIdx.x;
  bf16* row = logits + r * V;
  const std::int32_t tg = targets[r];
  const bool ok = target_ok(tg, V, ignore);
  float m = -INFINITY, s = 0.0f;
  for (int c = threadIdx.x * VEC; c < V; c += blockDim.x * VEC) {
    float v[VEC];
    detail::load_vec<VEC>(row + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (v[j] > m) {
        s = s * expf(m - v[j]) + 1.0f;
        m = v[j];
      } else {
        s += expf(v[j] - m);
      }
    }
  }
  const float M = detail::block_max(m, red);
  const float S = detail::block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), red);
  const float lse = M + logf(S);
  if (threadIdx.x == 0) {
    s_target_logit = ok ? __bfloat162float(row[tg]) : 0.0f;
    lse_out[r] = lse;
  }
  __syncthreads();  // the target logit is read before pass 2 overwrites the row
  if (threadIdx.x == 0) row_loss[r] = ok ? lse - s_target_logit : 0.0f;
  if constexpr (BACKWARD) {
    const int n_valid = *valid;
    const float scale = (ok && n_valid > 0) ? dloss / static_cast<float>(n_valid) : 0.0f;
    for (int c = threadIdx.x * VEC; c < V; c += blockDim.x * VEC) {
      float v[VEC];
      detail::load_vec<VEC>(row + c, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = expf(v[j] - lse) * scale;
        if (c + j == tg) v[j] -= scale;
      }
      detail::store_vec<VEC>(row + c, v);
    }
  }
}

// Mean over valid rows, summed in a fixed order (deterministic).
__global__ void loss_reduce_kernel(const float* __restrict__ row_loss, std::int64_t N,
                                   const int* __restrict__ valid, float* __restrict__ loss,
                                   std::int32_t* __restrict__ valid_out) {
  __shared__ float red[32];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < N; i += blockDim.x) s += row_loss[i];
  s = detail::block_sum(s, red);
  if (threadIdx.x == 0) {
    const int n = *valid;
    if (loss != nullptr) *loss = n > 0 ? s / static_cast<float>(n) : 0.0f;
    if (valid_out != nullptr) *valid_out = n;
  }
}

__global__ void find_bad_target_kernel(const std::int32_t* __restrict__ targets, std::int64_t N,
                                       int V, std::int32_t ignore,
                                       unsigned long long* __restrict__ first_bad) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t t = targets[i];
    if (t != ignore && (t < 0 || t >= V)) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

void check(const char* op, std::int64_t N, int C, int V, std::int64_t chunk_rows,
           std::size_t workspace_bytes, const void* workspace) {
  GHT_EXPECTS(N >= 0 && C > 0 && V > 0, std::string(op) + ": need N >= 0, C > 0, V > 0, got N=" +
                                            std::to_string(N) + " C=" + std::to_string(C) +
                                            " V=" + std::to_string(V));
  GHT_EXPECTS(chunk_rows > 0 && chunk_rows <= 0x7fffffff,
              std::string(op) + ": chunk_rows must be in [1, 2^31), got " + std::to_string(chunk_rows));
  const std::int64_t rows = std::min<std::int64_t>(std::max<std::int64_t>(N, 1), chunk_rows);
  const std::size_t need = lm_head_ce_workspace_bytes(rows, V);
  GHT_EXPECTS(N == 0 || (workspace != nullptr && workspace_bytes >= need),
              std::string(op) + ": workspace of " + std::to_string(workspace_bytes) +
                  " bytes is smaller than the " + std::to_string(need) + " needed for " +
                  std::to_string(rows) + " rows of V=" + std::to_string(V));
}

template <bool BACKWARD, typename DW>
void run(const CeOutputs& out, bf16* dx, DW* dw, const bf16* x, const bf16* w,
         const std::int32_t* targets, std::int64_t N, int C, int V, float dloss,
         std::int32_t ignore, std::int64_t chunk_rows, void* workspace,
         std::size_t workspace_bytes, cudaStream_t stream, float dw_beta = 1.0f) {
  check(BACKWARD ? "lm_head_ce_forward_backward" : "lm_head_ce_forward", N, C, V, chunk_rows,
        workspace_bytes, workspace);
  GHT_EXPECTS(dw_beta == 0.0f || dw_beta == 1.0f,
              "lm_head_ce_forward_backward: dw_beta must be 0 (assign dW) or 1 (add to it), not " +
                  std::to_string(dw_beta));
  if (N == 0) {
    if (out.loss != nullptr) GHT_CUDA_TRY(cudaMemsetAsync(out.loss, 0, sizeof(float), stream));
    if (out.valid != nullptr) GHT_CUDA_TRY(cudaMemsetAsync(out.valid, 0, sizeof(std::int32_t), stream));
    if (BACKWARD && dw_beta == 0.0f) {  // no rows: the gradient is zero
      GHT_CUDA_TRY(cudaMemsetAsync(dw, 0, static_cast<std::size_t>(V) * C * sizeof(DW), stream));
    }
    return;
  }
  const std::size_t n_bytes = scratch_align(static_cast<std::size_t>(N) * sizeof(float));
  auto* base = static_cast<char*>(stream_scratch(stream, 2 * n_bytes + 256));
  auto* row_loss = reinterpret_cast<float*>(base);
  float* lse = out.lse != nullptr ? out.lse : reinterpret_cast<float*>(base + n_bytes);
  auto* valid = reinterpret_cast<int*>(base + 2 * n_bytes);
  count_valid_kernel<<<1, 1024, 0, stream>>>(targets, N, V, ignore, valid);
  GHT_CUDA_CHECK_LAUNCH();

  auto* logits = static_cast<bf16*>(workspace);
  const bool vec = V % 8 == 0 && detail::aligned16(logits);
  for (std::int64_t i0 = 0; i0 < N; i0 += chunk_rows) {
    const std::int64_t rows = std::min(chunk_rows, N - i0);
    GemmArgs g;  // logits (rows, V) = x_chunk (rows, C) · W (V, C)^T
    g.m = rows;
    g.n = V;
    g.k = C;
    g.a = x + i0 * C;
    g.b = w;
    g.trans_b = true;
    g.c = logits;
    gemm(g, stream);
    const auto grid = static_cast<unsigned>(rows);
    if (vec) {
      ce_row_kernel<8, BACKWARD><<<grid, kRowThreads, 0, stream>>>(logits, targets + i0, V, ignore, lse + i0, row_loss + i0, valid, dloss);
    } else {
      ce_row_kernel<1, BACKWARD><<<grid, kRowThreads, 0, stream>>>(logits, targets + i0, V, ignore, lse + i0, row_loss + i0, valid, dloss);
    }
    GHT_CUDA_CHECK_LAUNCH();
    if constexpr (BACKWARD) {
      GemmArgs d;  // dx_chunk (rows, C) = dlogits (rows, V) · W (V, C)
      d.m = rows;
      d.n = C;
      d.k = V;
      d.a = logits;
      d.b = w;
      d.c = dx + i0 * C;
      gemm(d, stream);
      GemmArgs h;  // dW (V, C) = beta·dW + dlogits^T (V, rows) · x_chunk (rows, C)
      h.m = V;
      h.n = C;
      h.k = rows;
      h.a = logits;
      h.trans_a = true;
      h.b = x + i0 * C;
      h.c = dw;
      h.c_type = sizeof(DW) == 4 ? DType::f32 : DType::bf16;
      h.beta = i0 == 0 ? dw_beta : 1.0f;
      gemm(h, stream);
    }
  }
  loss_reduce_kernel<<<1, 1024, 0, stream>>>(row_loss, N, valid, out.loss, out.valid);
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::size_t lm_head_ce_workspace_bytes(std::int64_t chunk_rows, int V) {
  return scratch_align(static_cast<std::size_t>(std::max<std::int64_t>(chunk_rows, 0)) *
                       static_cast<std::size_t>(std::max(V, 0)) * sizeof(bf16));
}

void lm_head_ce_forward(const CeOutputs& out, const bf16* x, const bf16* w,
                        const std::int32_t* targets, std::int64_t N, int C, int V,
                        std::int32_t ignore_index, std::int64_t chunk_rows, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream) {
  run<false, float>(out, nullptr, nullptr, x, w, targets, N, C, V, 0.0f, ignore_index, chunk_rows,
                    workspace, workspace_bytes, stream);
}

void lm_head_ce_forward_backward(const CeOutputs& out, bf16* dx, float* dw, const bf16* x,
                                 const bf16* w, const std::int32_t* targets, std::int64_t N, int C,
                                 int V, float dloss, std::int32_t ignore_index,
                                 std::int64_t chunk_rows, void* workspace,
                                 std::size_t workspace_bytes, cudaStream_t stream, float dw_beta) {
  run<true>(out, dx, dw, x, w, targets, N, C, V, dloss, ignore_index, chunk_rows, workspace,
            workspace_bytes, stream, dw_beta);
}

void lm_head_ce_forward_backward(const CeOutputs& out, bf16* dx, bf16* dw, const bf16* x,
                                 const bf16* w, const std::int32_t* targets, std::int64_t N, int C,
                                 int V, float dloss, std::int32_t ignore_index,
                                 std::int64_t chunk_rows, void* workspace,
                                 std::size_t workspace_bytes, cudaStream_t stream, float dw_beta) {
  run<true>(out, dx, dw, x, w, targets, N, C, V, dloss, ignore_index, chunk_rows, workspace,
            workspace_bytes, stream, dw_beta);
}

void lm_head_ce_check_targets(const std::int32_t* targets, std::int64_t N, int V,
                              std::int32_t ignore_index, cudaStream_t stream) {
  GHT_EXPECTS(N >= 0 && V > 0, "lm_head_ce_check_targets: need N >= 0 and V > 0");
  if (N == 0) return;
  auto* d_bad = static_cast<unsigned long long*>(stream_scratch(stream, sizeof(unsigned long long)));
  const unsigned long long none = ~0ull;
  GHT_CUDA_TRY(cudaMemcpyAsync(d_bad, &none, sizeof(none), cudaMemcpyHostToDevice, stream));
  find_bad_target_kernel<<<detail::grid_for(N, 256, 1024), 256, 0, stream>>>(targets, N, V,
                                                                             ignore_index, d_bad);
  GHT_CUDA_CHECK_LAUNCH();
  unsigned long long bad = none;
  GHT_CUDA_TRY(cudaMemcpyAsync(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  if (bad == none) return;
  std::int32_t t = 0;
  GHT_CUDA_TRY(cudaMemcpy(&t, targets + bad, sizeof(t), cudaMemcpyDeviceToHost));
  GHT_FAIL("cross-entropy: target " + std::to_string(t) + " at row " + std::to_string(bad) +
           " is outside the vocabulary [0, " + std::to_string(V) + ") and is not the ignore index " +
           std::to_string(ignore_index));
}

}  // namespace ght::kernels::cuda
