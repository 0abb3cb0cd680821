#pragma once
/**
 * @file sm_copy.hpp
 * @brief A copy done by the SMs instead of the copy engines, for small transfers that must not
 * wait behind bulk DMA.
 *
 * cudaMemcpyAsync between host and device goes through the copy engines, whose queues are
 * first-in first-out: a 64 KiB token upload issued while the optimizer's dma path streams
 * gigabytes of master, m and v through the same engines waits for what is queued before it
 * (bench/kernels/bench_copy_contention.cu measures it). A kernel that reads or writes mapped
 * pinned (or, on c2c, plain) host memory moves the bytes over the link as SM loads and stores,
 * interleaved with the DMA traffic instead of queued behind it.
 *
 * Either pointer may be device memory or a device-accessible alias of host memory (the mapped
 * pointer of pinned memory, cudaHostGetDevicePointer / cudaPointerGetAttributes). The copy is
 * ordered on `stream` like any kernel; host memory it writes is visible to the host once an
 * event recorded after it has completed.
 */
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ght::kernels::cuda {

/// dst[0..bytes) := src[0..bytes) on `stream` by a kernel. bytes == 0 launches nothing.
/// @throws ght::cuda_error when the launch fails
void sm_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

/// The address a kernel uses for host pointer `p` (pinned and mapped, or plain memory the GPU
/// reads directly on c2c); nullptr when the GPU cannot reach it (pageable memory over PCIe).
[[nodiscard]] void* mapped_device_pointer(void* p);

}  // namespace ght::kernels::cuda
