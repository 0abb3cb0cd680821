#pragma once
// Where the GPU optimizer tests put gradients and weights (HBM, mapped pinned host memory), and
// the AdamWOptions they build. CUDA tests only.
#include <cuda_runtime.h>

#include <cstddef>

#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "tier/cuda_check.hpp"

namespace ght::optimizer::test {

struct DeviceMem final : Mem {
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    GHT_CUDA_TRY(cudaMalloc(&p, bytes));
    return p;
  }
  void release(void* p) override { (void)cudaFree(p); }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    GHT_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));  // pageable copies may still be in flight
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    GHT_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
};

struct PinnedMem final : Mem {
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    GHT_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    return p;
  }
  void release(void* p) override { (void)cudaFreeHost(p); }
};

inline AdamWOptions options(PathChoice p, std::size_t chunk = 0, std::size_t staging = 0,
                            LinkMode mode = LinkMode::zero_copy) {
  AdamWOptions o;
  o.path = p;
  o.chunk_elems = chunk;
  o.staging_bytes = staging;
  o.link_mode = mode;
  return o;
}

}  // namespace ght::optimizer::test
