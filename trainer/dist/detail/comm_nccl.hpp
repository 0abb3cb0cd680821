#pragma once
// The NCCL-staged host Communicator (trainer/dist/nccl/comm_nccl.cpp, built only with
// GHT_HAVE_NCCL): what make_cuda_host_communicator returns for a torchrun-style launch.
#include <chrono>
#include <cstddef>
#include <memory>

#include "alloc/resource.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/gpu_comm.hpp"
#include "trainer/dist/launch.hpp"

namespace ght::dist::detail {

/// Staging chunk: the device scratch buffer and its pinned host twin hold this much each.
inline constexpr std::size_t kStagingChunkBytes = std::size_t{64} << 20;

/**
 * @brief Collectives on host buffers through a GpuCommunicator: each chunk of at most
 * `chunk_bytes` is copied into pinned host memory, up to a device scratch buffer, all-reduced or
 * broadcast there in place by `gpu` on a private stream, copied back down and out; gpu.wait()
 * bounds every chunk by the deadline (and aborts the communicator past it). Chunks run one after
 * another (no overlap between the copies and the collective). Runs even at world size 1 (the
 * Communicator front skips collectives there; the GPU test calls this directly).
 */
class HostStaging {
 public:
  /// On gpu.device(); allocates 2 × chunk_bytes (device and pinned, through alloc/'s
  /// device_direct and pinned_host resources) and a stream.
  explicit HostStaging(GpuCommunicator& gpu, std::size_t chunk_bytes = kStagingChunkBytes);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  /// x[0..n) := the sum over ranks (bf16: NCCL's bf16 sum, each partial sum rounded to bf16).
  void allreduce_sum(void* x, std::size_t n, Communicator::Type t);
  /// `bytes` bytes at x from rank `root`.
  void broadcast(void* x, std::size_t bytes, int root);
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_; }
  /// Chunks moved so far (tests: that a buffer went in several).
  [[nodiscard]] std::size_t chunks() const noexcept { return chunks_; }

 private:
  template <class Enqueue>
  void staged(void* x, std::size_t bytes, std::size_t elem, bool copy_in, bool copy_out, Enqueue&& enqueue);
  void release() noexcept;
  GpuCommunicator& gpu_;
  std::size_t chunk_;
  std::unique_ptr<alloc::memory_resource> device_mem_;
  std::unique_ptr<alloc::memory_resource> host_mem_;
  std::size_t chunks_ = 0;
  void* dev_ = nullptr;
  void* pinned_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

#ifdef GHT_HAVE_NCCL
/**
 * @brief A Communicator whose collectives run on `gpu` through HostStaging: all-reduce (the
 * reduce-scatter too: it sums the whole buffer, so each rank's block holds its sum), broadcast,
 * all-gather (a broadcast from each block's rank), barrier (a one-float all-reduce). The
 * background all-reduce completes inside start_allreduce_sum (no overlap yet).
 */
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<GpuCommunicator> gpu,
                                                       std::size_t chunk_bytes = kStagingChunkBytes);

/// When `host` is a staged communicator: a GpuCommunicator over its NCCL communicator (shared,
/// so that one NCCL communicator serves both; make_gpu_communicator returns it). Else nullptr.
/// @throws ght::logic_error when choice.device is not that communicator's device
std::unique_ptr<GpuCommunicator> shared_gpu_communicator(Communicator& host, const GpuChoice& choice);

/// make_cuda_host_communicator's torchrun-style half: this rank's GPU (choose_gpu), the store at
/// MASTER_ADDR:MASTER_PORT, the NCCL communicator set up through it. `timeout` is resolved.
std::unique_ptr<Communicator> make_store_nccl_communicator(const Launch& l, std::chrono::duration<double> timeout);
#endif

}  // namespace ght::dist::detail
