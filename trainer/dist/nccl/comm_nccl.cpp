// The NCCL-staged host Communicator (detail/comm_nccl.hpp): a torchrun-style launch of the CUDA
// backend has no MPI, so its host-side collectives (losses, norms, barriers, checkpoint
// coordination, DiLoCo's outer all-reduce) go through NCCL, staged through device memory.
#include "trainer/dist/detail/comm_nccl.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "alloc/device_direct.hpp"
#include "alloc/pinned_host.hpp"
#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"
#include "trainer/dist/detail/gpu_comm_nccl.hpp"
#include "trainer/dist/store.hpp"

namespace ght::dist::detail {

namespace {

GpuType gpu_type(Communicator::Type t) {
  switch (t) {
    case Communicator::Type::f32: return GpuType::f32;
    case Communicator::Type::f64: return GpuType::f64;
    case Communicator::Type::bf16: return GpuType::bf16;
  }
  return GpuType::f32;
}

// The staging device is current while a collective runs; the caller's device comes back after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    GHT_CUDA_TRY(cudaGetDevice(&prev_));
    if (prev_ != device) GHT_CUDA_TRY(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

// The two buffers come from alloc/'s resources (the ones the tiered allocator's tiers are made
// of): the run's allocator does not exist yet when the communicator is made (its HBM budget is
// measured after NCCL's buffers and these, so it leaves them out), and they live as long as the
// communicator. One block each, for the communicator's life: cudaMalloc per block and pinned,
// NUMA-bound host memory near the GPU.
HostStaging::HostStaging(GpuCommunicator& gpu, std::size_t chunk_bytes) : gpu_(gpu), chunk_(chunk_bytes) {
  GHT_EXPECTS(chunk_bytes >= sizeof(double), "HostStaging: a chunk must hold one element (8 bytes)");
  const DeviceScope on(gpu.device());
  device_mem_ = std::make_unique<alloc::device_direct>(gpu.device());
  alloc::PinnedHostOptions host;
  host.numa_node = tier::topology().host_numa_node;
  host.device = gpu.device();
  host.cache.max_bytes = 0;  // one block, never freed before the communicator
  host_mem_ = std::make_unique<alloc::pinned_host>(host);
  try {
    dev_ = device_mem_->allocate(chunk_);
    pinned_ = host_mem_->allocate(chunk_);
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  } catch (...) {
    release();
    throw;
  }
}

void HostStaging::release() noexcept {
  try {
    if (dev_ != nullptr) device_mem_->deallocate(dev_, chunk_);
    if (pinned_ != nullptr) host_mem_->deallocate(pinned_, chunk_);
  } catch (...) {  // a CUDA error at shutdown: nothing left to do
  }
  dev_ = nullptr;
  pinned_ = nullptr;
}

HostStaging::~HostStaging() {
  const int device = gpu_.device();
  int prev = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device) (void)cudaSetDevice(device);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  release();
  (void)cudaSetDevice(prev);
}

// Chunk by chunk: host -> pinned -> device, the collective in place, device -> pinned -> host.
// Pinned memory keeps every copy asynchronous, so that gpu_.wait() (the deadline) is the only
// place this blocks.
template <class Enqueue>
void HostStaging::staged(void* x, std::size_t bytes, std::size_t elem, bool copy_in, bool copy_out, Enqueue&& enqueue) {
  const DeviceScope on(gpu_.device());
  const std::size_t per = chunk_ / elem * elem;
  auto* h = static_cast<char*>(x);
  for (std::size_t at = 0; at < bytes; at += per) {
    const std::size_t len = std::min(per, bytes - at);
    if (copy_in) {
      std::memcpy(pinned_, h + at, len);
      GHT_CUDA_TRY(cudaMemcpyAsync(dev_, pinned_, len, cudaMemcpyHostToDevice, stream_));
    }
    enqueue(dev_, len / elem);
    if (copy_out) GHT_CUDA_TRY(cudaMemcpyAsync(pinned_, dev_, len, cudaMemcpyDeviceToHost, stream_));
    gpu_.wait(stream_);
    if (copy_out) std::memcpy(h + at, pinned_, len);
    ++chunks_;
  }
}

void HostStaging::allreduce_sum(void* x, std::size_t n, Communicator::Type t) {
  const GpuType g = gpu_type(t);
  const std::size_t elem = element_size(g);
  staged(x, n * elem, elem, true, true,
         [&](void* d, std::size_t count) { gpu_.allreduce(d, count, g, GpuReduce::sum, stream_); });
}

void HostStaging::broadcast(void* x, std::size_t bytes, int root) {
  const bool root_here = gpu_.rank() == root;
  staged(x, bytes, 1, root_here, !root_here,
         [&](void* d, std::size_t count) { gpu_.broadcast(d, count, root, stream_); });
}

namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<GpuCommunicator> gpu, std::size_t chunk_bytes)
      : Communicator(gpu->rank(), gpu->size(), gpu->timeout()), gpu_(std::move(gpu)), staging_(*gpu_, chunk_bytes) {}

  [[nodiscard]] std::string name() const override { return "nccl-staged (" + gpu_->name() + ")"; }
  [[nodiscard]] const std::shared_ptr<GpuCommunicator>& gpu() const noexcept { return gpu_; }

 protected:
  void do_allreduce_sum(void* x, std::size_t n, Type t) override { staging_.allreduce_sum(x, n, t); }
  // Summing the whole buffer leaves every block's sum everywhere: this rank's block is right,
  // the others are allowed to hold anything. (The CUDA backend's ZeRO-1 reduces on the GPU.)
  void do_reduce_scatter_sum(void* x, std::span<const std::size_t> counts, Type t) override {
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    staging_.allreduce_sum(x, total, t);
  }
  void do_all_gather(void* x, std::span<const std::size_t> counts, Type t) override {
    const std::size_t elem = element_size(gpu_type(t));
    std::size_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      staging_.broadcast(static_cast<char*>(x) + at * elem, counts[r] * elem, static_cast<int>(r));
      at += counts[r];
    }
  }
  void do_broadcast(void* data, std::size_t bytes, int root) override { staging_.broadcast(data, bytes, root); }
  void do_barrier() override {
    float one = 1;
    staging_.allreduce_sum(&one, 1, Type::f32);
  }
  // Done at once: a chunked NCCL all-reduce driven in the background would have to keep the
  // order of NCCL calls the same on every rank while other collectives run (not done yet).
  void do_start_allreduce_sum(void* x, std::size_t n, Type t) override { staging_.allreduce_sum(x, n, t); }
  bool do_test_allreduce() override { return true; }
  void do_wait_allreduce() override {}

 private:
  std::shared_ptr<GpuCommunicator> gpu_;  // before staging_, which uses it
  HostStaging staging_;
};

// The staged communicator's NCCL communicator, for the CUDA backend's GPU collectives: one NCCL
// communicator used from several streams (as ZeRO-1 already does), not two used at once, which
// NCCL does not promise to order.
class SharedGpuCommunicator final : public GpuCommunicator {
 public:
  explicit SharedGpuCommunicator(std::shared_ptr<GpuCommunicator> g)
      : GpuCommunicator(g->rank(), g->size(), g->device(), g->timeout()), g_(std::move(g)) {}
  [[nodiscard]] std::string name() const override { return g_->name(); }

 protected:
  void do_allreduce(void* x, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s, const std::string&) override {
    g_->allreduce(x, n, t, op, s);
  }
  void do_reduce_scatter(const void* in, void* out, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s,
                         const std::string&) override {
    g_->reduce_scatter(in, out, n, t, op, s);
  }
  void do_all_gather(const void* in, void* out, std::size_t n, GpuType t, cudaStream_t s, const std::string&) override {
    g_->all_gather(in, out, n, t, s);
  }
  void do_broadcast(void* x, std::size_t bytes, int root, cudaStream_t s, const std::string&) override {
    g_->broadcast(x, bytes, root, s);
  }
  void do_wait(cudaStream_t s) override { g_->wait(s); }

 private:
  std::shared_ptr<GpuCommunicator> g_;
};

}  // namespace

std::unique_ptr<GpuCommunicator> shared_gpu_communicator(Communicator& host, const GpuChoice& choice) {
  const auto* staged = dynamic_cast<const StagedCommunicator*>(&host);
  if (staged == nullptr) return nullptr;
  GHT_EXPECTS(choice.device == staged->gpu()->device(),
              "make_gpu_communicator: device " + std::to_string(choice.device) + ", but the host communicator's NCCL "
              "runs on device " + std::to_string(staged->gpu()->device()));
  return std::make_unique<SharedGpuCommunicator>(staged->gpu());
}

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<GpuCommunicator> gpu, std::size_t chunk_bytes) {
  GHT_EXPECTS(gpu != nullptr, "make_staged_communicator: no GPU communicator");
  return std::make_unique<StagedCommunicator>(std::move(gpu), chunk_bytes);
}

std::unique_ptr<Communicator> make_store_nccl_communicator(const Launch& l, std::chrono::duration<double> timeout) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) {
    (void)cudaGetLastError();
    visible = 0;
  }
  const Env env = process_env();
  const GpuChoice choice = choose_gpu(l, configured_device(), visible, env);
  GHT_CUDA_TRY(cudaSetDevice(choice.device));
  TcpStore store(l, timeout);
  // The GPU check and NCCL's unique id go over the store; then no rank needs it any more.
  std::unique_ptr<GpuCommunicator> gpu = make_nccl_communicator(*make_store_communicator(store), choice, timeout);
  store.barrier("nccl-ready");
  return make_staged_communicator(std::move(gpu));
}

}  // namespace ght::dist::detail
