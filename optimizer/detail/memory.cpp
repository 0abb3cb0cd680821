#include "optimizer/detail/memory.hpp"

#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/sm_copy.hpp"
#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer::detail {

bool gpu_available() {
  static const bool available = [] {
#ifdef GHT_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
#else
    return false;
#endif
  }();
  return available;
}

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
  return kernels::cuda::mapped_device_pointer(const_cast<void*>(p));  // the one rule (sm_copy.hpp)
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
