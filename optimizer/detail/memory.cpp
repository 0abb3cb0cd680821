#include "optimizer/detail/memory.hpp"

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

void* device_address(const void* p) {
#ifdef GHT_HAVE_CUDA
  if (p == nullptr || !gpu_available()) return nullptr;
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
      return a.devicePointer;  // null when the registration is not mapped
    default:
      return gpu_reads_pageable() ? const_cast<void*>(p) : nullptr;
  }
#else
  (void)p;
  return nullptr;
#endif
}

void* device_alias(const void* p, const std::string& what) {
#ifdef GHT_HAVE_CUDA
  GHT_EXPECTS(gpu_available(), what + ": no GPU to read it from");
  if (p == nullptr) return nullptr;
  void* d = device_address(p);
  GHT_EXPECTS(d != nullptr,
              what + ": the GPU cannot reach this host memory over PCIe (pageable, or pinned but "
                     "not mapped); allocate it through the tiered allocator's host tier (pinned)");
  return d;
#else
  (void)p;
  GHT_FAIL(what + ": built without CUDA");
#endif
}

}  // namespace ght::optimizer::detail
