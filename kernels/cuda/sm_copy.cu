// SM-driven copies (see sm_copy.hpp).
#include "kernels/cuda/sm_copy.hpp"

#include <algorithm>
#include <cstdint>

#include "tier/cuda_check.hpp"

namespace ght::kernels::cuda {

namespace {

// 16-byte words where both pointers allow it, then the tail byte by byte. A grid-stride loop:
// the inputs are small (a micro-batch's tokens and targets, the loss slot), so a few blocks
// suffice and the copy never holds many SMs.
__global__ void sm_copy_kernel(char* __restrict__ dst, const char* __restrict__ src, std::size_t bytes) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t head = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) == 0) {
    const std::size_t words = bytes / 16;
    auto* d4 = reinterpret_cast<int4*>(dst);
    const auto* s4 = reinterpret_cast<const int4*>(src);
    for (std::size_t i = t; i < words; i += stride) d4[i] = s4[i];
    head = words * 16;
  }
  for (std::size_t i = head + t; i < bytes; i += stride) dst[i] = src[i];
}

}  // namespace

void sm_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  constexpr int kThreads = 256;
  constexpr std::size_t kMaxBlocks = 32;
  const std::size_t blocks = std::min(kMaxBlocks, (bytes / 16 + kThreads - 1) / kThreads + 1);
  sm_copy_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<char*>(dst),
                                                                           static_cast<const char*>(src), bytes);
  GHT_CUDA_TRY(cudaGetLastError());
}

void* mapped_device_pointer(void* p) {
  if (p == nullptr) return nullptr;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      return p;
    case cudaMemoryTypeHost:
      return a.devicePointer;  // null when the registration is not mapped
    default: {
      int dev = 0, pageable = 0;
      if (cudaGetDevice(&dev) != cudaSuccess ||
          cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      return pageable != 0 ? p : nullptr;  // c2c: the GPU reads plain host memory
    }
  }
}

}  // namespace ght::kernels::cuda
