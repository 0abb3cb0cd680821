// Embedding forward and deterministic backward (see embedding.hpp).
#include "kernels/cuda/embedding.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

// One warp per token row; lanes move VEC-wide chunks.
template <int VEC>
__global__ void embedding_forward_kernel(bf16* __restrict__ out, const std::int32_t* __restrict__ tokens,
                                         const bf16* __restrict__ wte, std::int64_t N, int C, int V,
                                         unsigned long long* first_bad) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (i >= N) return;
  const int lane = threadIdx.x % 32;
  const std::int32_t id = tokens[i];
  const bool ok = id >= 0 && id < V;
  if (!ok && lane == 0 && first_bad != nullptr) atomicMin(first_bad, static_cast<unsigned long long>(i));
  bf16* dst = out + i * C;
  const bf16* src = wte + static_cast<std::int64_t>(ok ? id : 0) * C;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    if (ok) {
      detail::load_vec<VEC>(src + c, v);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = 0.0f;
    }
    detail::store_vec<VEC>(dst + c, v);
  }
}

__global__ void find_bad_token_kernel(const std::int32_t* __restrict__ tokens, std::int64_t N, int V,
                                      unsigned long long* first_bad) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t id = tokens[i];
    if (id < 0 || id >= V) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

__global__ void iota_kernel(std::int32_t* __restrict__ v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    v[i] = static_cast<std::int32_t>(i);
  }
}

// blockIdx.x = index j in the sorted order; only the first index of each run of equal ids works.
// blockIdx.y = a 32·VEC-column tile; one warp per block sums the run's rows in position order.
template <int VEC, typename DW>
__global__ void embedding_backward_kernel(DW* __restrict__ dwte, const bf16* __restrict__ dout,
                                          const std::int32_t* __restrict__ sorted_ids,
                                          const std::int32_t* __restrict__ sorted_pos,
                                          std::int64_t N, int C, int V) {
  const std::int64_t j = blockIdx.x;
  const std::int32_t id = sorted_ids[j];
  if (j > 0 && sorted_ids[j - 1] == id) return;
  if (id < 0 || id >= V) return;
  const int c = (blockIdx.y * 32 + threadIdx.x) * VEC;
  if (c >= C) return;
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  for (std::int64_t r = j; r < N && sorted_ids[r] == id; ++r) {
    float v[VEC];
    detail::load_vec<VEC>(dout + static_cast<std::int64_t>(sorted_pos[r]) * C + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] += v[k];
  }
  DW* dst = dwte + static_cast<std::int64_t>(id) * C + c;
#pragma unroll
  for (int k = 0; k < VEC; ++k) dst[k] = detail::from_float<DW>(detail::to_float(dst[k]) + acc[k]);
}

void check(const char* op, std::int64_t N, int C, int V) {
  GHT_EXPECTS(N >= 0 && C > 0 && V > 0, std::string(op) + ": need N >= 0, C > 0, V > 0, got N=" +
                                            std::to_string(N) + " C=" + std::to_string(C) +
                                            " V=" + std::to_string(V));
  // cub's sort and our grid take int counts.
  GHT_EXPECTS(N <= 0x7fffffff, std::string(op) + ": N=" + std::to_string(N) + " is too large");
}

template <typename DW>
void backward_impl(DW* dwte, const bf16* dout, const std::int32_t* tokens, std::int64_t N, int C,
                   int V, cudaStream_t stream) {
  check("embedding_backward", N, C, V);
  if (N == 0) return;
  const int n = static_cast<int>(N);
  std::size_t sort_bytes = 0;
  GHT_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes,
                                               static_cast<const std::int32_t*>(nullptr),
                                               static_cast<std::int32_t*>(nullptr),
                                               static_cast<const std::int32_t*>(nullptr),
                                               static_cast<std::int32_t*>(nullptr), n, 0,
                                               32, stream));
  const std::size_t arr = scratch_align(static_cast<std::size_t>(n) * sizeof(std::int32_t));
  auto* base = static_cast<char*>(stream_scratch(stream, 3 * arr + scratch_align(sort_bytes)));
  auto* pos_in = reinterpret_cast<std::int32_t*>(base);
  auto* ids_out = reinterpret_cast<std::int32_t*>(base + arr);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + 2 * arr);
  void* temp = base + 3 * arr;
  iota_kernel<<<detail::grid_for(N, 256, 1024), 256, 0, stream>>>(pos_in, N);
  GHT_CUDA_CHECK_LAUNCH();
  // Radix sort is stable, so equal ids keep increasing positions: the CPU op's summation order.
  // All 32 key bits are sorted (not just log2(V)), so even invalid ids form contiguous runs and
  // can never split a valid id's run into two blocks writing the same row.
  GHT_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, tokens, ids_out, pos_in, pos_out,
                                               n, 0, 32, stream));
  const bool vec = C % 8 == 0 && detail::aligned16(dout);
  const int vw = vec ? 8 : 1;
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(detail::ceil_div(C, 32 * vw)));
  if (vec) {
    embedding_backward_kernel<8, DW><<<grid, 32, 0, stream>>>(dwte, dout, ids_out, pos_out, N, C, V);
  } else {
    embedding_backward_kernel<1, DW><<<grid, 32, 0, stream>>>(dwte, dout, ids_out, pos_out, N, C, V);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, std::int64_t N,
                       int C, int V, unsigned long long* first_bad, cudaStream_t stream) {
  check("embedding_forward", N, C, V);
  if (N == 0) return;
  const int warps = 8;
  const unsigned grid = static_cast<unsigned>(detail::ceil_div(N, warps));
  if (C % 8 == 0 && detail::aligned16(out, wte)) {
    embedding_forward_kernel<8><<<grid, warps * 32, 0, stream>>>(out, tokens, wte, N, C, V, first_bad);
  } else {
    embedding_forward_kernel<1><<<grid, warps * 32, 0, stream>>>(out, tokens, wte, N, C, V, first_bad);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void embedding_check_tokens(const std::int32_t* tokens, std::int64_t N, int V, cudaStream_t stream) {
  check("embedding_check_tokens", N, 1, V);
  if (N == 0) return;
  auto* d_bad = static_cast<unsigned long long*>(stream_scratch(stream, sizeof(unsigned long long)));
  const unsigned long long none = ~0ull;
  GHT_CUDA_TRY(cudaMemcpyAsync(d_bad, &none, sizeof(none), cudaMemcpyHostToDevice, stream));
  find_bad_token_kernel<<<detail::grid_for(N, 256, 1024), 256, 0, stream>>>(tokens, N, V, d_bad);
  GHT_CUDA_CHECK_LAUNCH();
  unsigned long long bad = none;
  GHT_CUDA_TRY(cudaMemcpyAsync(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  if (bad == none) return;
  std::int32_t id = 0;
  GHT_CUDA_TRY(cudaMemcpy(&id, tokens + bad, sizeof(id), cudaMemcpyDeviceToHost));
  GHT_FAIL("embedding: token id " + std::to_string(id) + " at position " + std::to_string(bad) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

void embedding_backward(float* dwte, const bf16* dout, const std::int32_t* tokens, std::int64_t N,
                        int C, int V, cudaStream_t stream) {
  backward_impl(dwte, dout, tokens, N, C, V, stream);
}

void embedding_backward(bf16* dwte, const bf16* dout, const std::int32_t* tokens, std::int64_t N,
                        int C, int V, cudaStream_t stream) {
  backward_impl(dwte, dout, tokens, N, C, V, stream);
}

}  // namespace ght::kernels::cuda
