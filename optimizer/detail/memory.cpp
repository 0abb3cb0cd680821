#include "optimizer/detail/memory.hpp"

#include <cstdlib>
#include <mutex>

#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer::detail {

namespace {
struct GpuFacts {
  bool available = false;
  bool pageable = false;
};

const GpuFacts& facts() {
  static const GpuFacts f = [] {
    GpuFacts g;
#ifdef GHT_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      return g;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return g;
    }
    g.available = true;
    int pageable = 0;
    if (cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccessUsesHostPageTables,
                               dev) == cudaSuccess) {
      g.pageable = pageable != 0;
    } else {
      (void)cudaGetLastError();
    }
#endif
    return g;
  }();
  return f;
}
}  // namespace

bool gpu_available() { return facts().available; }
bool gpu_reads_pageable() { return facts().pageable; }

bool is_device_memory(const void* p) {
#ifdef GHT_HAVE_CUDA
  if (p == nullptr || !gpu_available()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#else
  (void)p;
  return false;
#endif
}

void* device_alias(const void* p, const std::string& what) {
#ifdef GHT_HAVE_CUDA
  GHT_EXPECTS(gpu_available(), what + ": no GPU to read it from");
  if (p == nullptr) return nullptr;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    a.type = cudaMemoryTypeUnregistered;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      return const_cast<void*>(p);
    case cudaMemoryTypeHost:
      GHT_EXPECTS(a.devicePointer != nullptr,
                  what + ": pinned host memory is not mapped into the device address space");
      return a.devicePointer;
    default:
      GHT_EXPECTS(gpu_reads_pageable(),
                  what + ": pageable host memory cannot be read by the GPU over PCIe; allocate "
                         "it pinned (cudaHostAlloc/cudaHostRegister) or through ght alloc");
      return const_cast<void*>(p);
  }
#else
  (void)p;
  GHT_FAIL(what + ": built without CUDA");
#endif
}

void* alloc_staging(std::size_t bytes, bool* pinned) {
  *pinned = false;
  if (bytes == 0) bytes = 64;
#ifdef GHT_HAVE_CUDA
  if (gpu_available()) {
    void* p = nullptr;
    const cudaError_t err =
        cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw ght::out_of_memory("cudaHostAlloc of " + std::to_string(bytes) +
                               " bytes of pinned staging failed: " + cudaGetErrorString(err));
    }
    *pinned = true;
    return p;
  }
#endif
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    throw ght::out_of_memory("aligned_alloc of " + std::to_string(rounded) + " bytes failed");
  }
  return p;
}

void free_staging(void* p, bool pinned) noexcept {
  if (p == nullptr) return;
#ifdef GHT_HAVE_CUDA
  if (pinned) {
    (void)cudaFreeHost(p);
    return;
  }
#endif
  (void)pinned;
  std::free(p);
}

}  // namespace ght::optimizer::detail
