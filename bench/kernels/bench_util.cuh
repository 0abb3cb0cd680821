#pragma once
// Helpers the kernel benchmarks share (each benchmark is one translation unit of its own
// program, so these live in an unnamed namespace): a median event timer, device allocation,
// a deterministic bf16 fill and JSON string escaping.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tier/cuda_check.hpp"

namespace {

// Median milliseconds of `iters` runs of f on `stream`, after two warm-up runs.
double time_ms(cudaStream_t stream, int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  GHT_CUDA_TRY(cudaEventCreate(&a));
  GHT_CUDA_TRY(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    GHT_CUDA_TRY(cudaEventRecord(a, stream));
    f();
    GHT_CUDA_TRY(cudaEventRecord(b, stream));
    GHT_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    GHT_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* dev_alloc(std::size_t n) {
  void* p = nullptr;
  GHT_CUDA_TRY(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

__global__ void fill_kernel(__nv_bfloat16* p, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65535.0f - 0.5f) * 0.2f);
  }
}

// Uniform values in [-0.1, 0.1], a hash of (index, seed).
void fill(__nv_bfloat16* p, std::size_t n, unsigned seed) {
  fill_kernel<<<1024, 256>>>(p, n, seed);
  GHT_CUDA_CHECK_LAUNCH();
}

// `--json PATH` and `--iters N` (at least 3) into json_path and iters; false, after printing the
// usage, for anything else.
bool parse_json_iters(int argc, char** argv, std::string& json_path, int& iters) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(3, std::atoi(argv[++i]));
    else { std::fprintf(stderr, "usage: %s [--json PATH] [--iters N]\n", argv[0]); return false; }
  }
  return true;
}

// Device 0's properties, printed as the output's first line.
cudaDeviceProp device_banner() {
  cudaDeviceProp prop{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  return prop;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (ch == '\n') { o += "\\n"; continue; }
    o += ch;
  }
  return o;
}

}  // namespace
