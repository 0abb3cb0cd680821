// Per-(device, stream) scratch buffers (see scratch.hpp).
#include "kernels/cuda/scratch.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "tier/cuda_check.hpp"

namespace ght::kernels::cuda {
namespace {

struct Scratch {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

struct ScratchState {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, Scratch> buffers;
};

ScratchState& scratch_state() {
  static auto* s = new ScratchState;  // leaked: no device frees from static destructors
  return *s;
}

}  // namespace

void* stream_scratch(cudaStream_t stream, std::size_t bytes) {
  int dev = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  auto& s = scratch_state();
  std::lock_guard<std::mutex> lock(s.mu);
  Scratch& b = s.buffers[{dev, stream}];
  if (bytes <= b.bytes && b.ptr != nullptr) return b.ptr;
  // Grow geometrically so a sequence of slightly larger requests does not reallocate each time.
  std::size_t want = scratch_align(bytes < 4096 ? 4096 : bytes);
  if (want < 2 * b.bytes) want = 2 * b.bytes;
  if (b.ptr != nullptr) {
    GHT_CUDA_TRY(cudaFreeAsync(b.ptr, stream));
    b.ptr = nullptr;
    b.bytes = 0;
  }
  GHT_CUDA_TRY(cudaMallocAsync(&b.ptr, want, stream));
  b.bytes = want;
  return b.ptr;
}

void release_stream_scratch() {
  auto& s = scratch_state();
  std::lock_guard<std::mutex> lock(s.mu);
  int current = 0;
  (void)cudaGetDevice(&current);
  for (auto& [key, b] : s.buffers) {
    if (b.ptr == nullptr) continue;
    // Not cudaFreeAsync: the owning stream may already be destroyed. cudaFree of stream-ordered
    // memory is legal once the device is idle.
    (void)cudaSetDevice(key.first);
    (void)cudaDeviceSynchronize();
    (void)cudaFree(b.ptr);
  }
  (void)cudaSetDevice(current);
  s.buffers.clear();
}

}  // namespace ght::kernels::cuda
