#pragma once
/**
 * @file scratch.hpp
 * @brief A per-(device, stream) scratch buffer for small temporaries of the kernels (partial
 * sums of deterministic reductions, scan carries, CUB temp storage).
 *
 * The buffer is reused by every op on the same stream: it is valid from the call until the next
 * call of stream_scratch() for that stream, which is why an op asks once for all it needs and
 * carves it up. Growth is stream-ordered (cudaFreeAsync of the old buffer, cudaMallocAsync of a
 * new one on the same stream), so it never synchronises; warm the buffer up (run one step)
 * before capturing a CUDA graph, so that no allocation happens inside the capture.
 */
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ght::kernels::cuda {

/**
 * @brief At least `bytes` bytes of device memory (256-byte aligned), usable on `stream`.
 * @throws ght::cuda_error when the allocation fails
 */
[[nodiscard]] void* stream_scratch(cudaStream_t stream, std::size_t bytes);

/// Free every scratch buffer (synchronises the devices). Tests and shutdown only.
void release_stream_scratch();

/// Round `bytes` up to the scratch alignment (for carving several arrays out of one buffer).
[[nodiscard]] constexpr std::size_t scratch_align(std::size_t bytes) noexcept {
  return (bytes + 255) & ~static_cast<std::size_t>(255);
}

}  // namespace ght::kernels::cuda
