// The link probe: measures every LinkNumbers field on the selected GPU in a few seconds.
//
// What each number moves (bytes) and how it is timed:
//   h2d, d2h        one cudaMemcpyAsync of copy_bytes between pinned host and HBM; CUDA events
//   bidir           an H2D and a D2H of copy_bytes each, at once on two streams; 2*copy_bytes
//   kernel_read     a kernel reading copy_bytes of mapped pinned host memory with 16-byte loads
//   kernel_write    a kernel writing copy_bytes of mapped pinned host memory with 16-byte stores
//   hbm             a kernel reading 2*copy_bytes of HBM, kHbmPasses times per repetition
//   host_triad      a = b + s*c on the host NUMA node (tier/host_triad.hpp), 3 streams, best pass
// Each figure is the median over the repetitions after one warm-up. Compiled only with CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/error.hpp"
#include "tier/host_triad.hpp"
#include "tier/topology.hpp"

namespace ght::tier::detail {

namespace {

constexpr int kBlockThreads = 512;
constexpr int kBlocksPerSm = 4;  // 4 x 512 = 2048 resident threads per SM on Hopper
constexpr int kHbmPasses = 4;    // 4 x 1 GiB per repetition, so one rep lasts about 1 ms
constexpr int kMinReps = 3;
constexpr int kMaxReps = 30;
constexpr unsigned kSinkMagic = 0x9e3779b9u;

// ---- kernels --------------------------------------------------------------------------------

/// Reads n uint4 with four independent loads in flight per thread (a zero-copy read over PCIe is
/// latency-bound: bandwidth needs many outstanding requests), folding them into a value the
/// compiler cannot drop.
__global__ void read_kernel(const uint4* __restrict__ p, std::size_t n, unsigned* __restrict__ sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i];
    const uint4 b = p[i + stride];
    const uint4 c = p[i + 2 * stride];
    const uint4 d = p[i + 3 * stride];
    acc ^= (a.x ^ a.y ^ a.z ^ a.w) + (b.x ^ b.y ^ b.z ^ b.w) + (c.x ^ c.y ^ c.z ^ c.w) +
           (d.x ^ d.y ^ d.z ^ d.w);
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == kSinkMagic) *sink = acc;  // almost never true; keeps every load alive
}

__global__ void write_kernel(uint4* __restrict__ p, std::size_t n, unsigned seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const auto lo = static_cast<unsigned>(i);
    p[i] = make_uint4(lo ^ seed, lo + seed, ~lo, seed);
  }
}

// ---- RAII for CUDA objects; destructors never throw --------------------------------------------

struct PinnedBuffer {
  void* host = nullptr;
  void* dev = nullptr;  // device view of the mapped allocation
  explicit PinnedBuffer(std::size_t bytes) {
    GHT_CUDA_TRY(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    GHT_CUDA_TRY(cudaHostGetDevicePointer(&dev, host, 0));
  }
  ~PinnedBuffer() {
    if (host != nullptr) (void)cudaFreeHost(host);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { GHT_CUDA_TRY(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() {
    if (p != nullptr) (void)cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { GHT_CUDA_TRY(cudaEventCreate(&e)); }
  ~Event() {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

using Clock = std::chrono::steady_clock;

/// Shares what is left of the budget among the measurements still to run, by weight.
class Budget {
 public:
  Budget(double seconds, double total_weight)
      : start_(Clock::now()), seconds_(seconds), weight_left_(total_weight) {}
  /// Seconds this measurement may take.
  double take(double weight) {
    const double left = std::max(0.0, seconds_ - elapsed());
    const double share = weight_left_ > 0 ? left * weight / weight_left_ : 0.0;
    weight_left_ -= weight;
    return share;
  }
  [[nodiscard]] double elapsed() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

 private:
  Clock::time_point start_;
  double seconds_;
  double weight_left_;
};

struct Timing {
  double median_bps = 0;
  int reps = 0;
};

/// Times `enqueue(stream)` between two events, one warm-up then at least kMinReps repetitions
/// and more while within `seconds`; returns the median of bytes / time.
template <typename Enqueue>
Timing time_reps(cudaStream_t s, double bytes, double seconds, Enqueue&& enqueue) {
  Event start, stop;
  std::vector<double> bps;
  const auto t0 = Clock::now();
  for (int rep = -1;; ++rep) {
    GHT_CUDA_TRY(cudaEventRecord(start.e, s));
    enqueue(s);
    GHT_CUDA_TRY(cudaEventRecord(stop.e, s));
    GHT_CUDA_TRY(cudaEventSynchronize(stop.e));
    float ms = 0;
    GHT_CUDA_TRY(cudaEventElapsedTime(&ms, start.e, stop.e));
    if (rep >= 0) bps.push_back(bytes / (std::max(ms, 1e-4f) * 1e-3));
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep + 1 >= kMinReps && (elapsed >= seconds || rep + 1 >= kMaxReps)) break;
  }
  std::sort(bps.begin(), bps.end());
  return {bps[bps.size() / 2], static_cast<int>(bps.size())};
}

/// Bytes per copy: 512 MiB, less when HBM or host memory is short (multiple of 2 MiB).
std::size_t copy_bytes_for(const Topology& topo) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  std::size_t bytes = 512 * kMiB;
  // Two pinned host buffers and 2x bytes of HBM are held at once.
  bytes = std::min<std::size_t>(bytes, topo.available(TierKind::hbm) / 8);
  if (topo.available(TierKind::host) > 0) {
    bytes = std::min<std::size_t>(bytes, topo.available(TierKind::host) / 8);
  }
  bytes = bytes / (2 * kMiB) * (2 * kMiB);
  if (bytes < 64 * kMiB) {
    GHT_FAIL("link probe: too little free memory for the probe buffers (HBM free " +
             config::format_bytes(topo.available(TierKind::hbm)) + ", host available " +
             config::format_bytes(topo.available(TierKind::host)) + "; need about 1 GiB of each)");
  }
  return bytes;
}

/// The GPU measurements; runs on a thread bound to the host NUMA node so the pinned buffers are
/// allocated there.
void probe_gpu(const Topology& topo, const GpuInfo& gpu, Budget& budget, ProbeReport& r) {
  GHT_CUDA_TRY(cudaSetDevice(gpu.ordinal));
  const std::size_t bytes = copy_bytes_for(topo);
  r.copy_bytes = bytes;
  const double b = static_cast<double>(bytes);

  PinnedBuffer host_a(bytes), host_b(bytes);
  DeviceBuffer dev(2 * bytes);  // dev_a = first half, dev_b = second half
  DeviceBuffer sink(sizeof(unsigned));
  char* const dev_a = static_cast<char*>(dev.p);
  char* const dev_b = dev_a + bytes;
  // Non-zero contents everywhere, so nothing is read from pages the OS never backed.
  std::memset(host_a.host, 0x5a, bytes);
  std::memset(host_b.host, 0xa5, bytes);
  Stream s1, s2;
  GHT_CUDA_TRY(cudaMemsetAsync(dev.p, 0x3c, 2 * bytes, s1.s));
  GHT_CUDA_TRY(cudaStreamSynchronize(s1.s));

  const int blocks = std::max(1, gpu.sm_count) * kBlocksPerSm;
  const std::size_t n16 = bytes / sizeof(uint4);
  int reps_min = kMaxReps;
  auto note = [&](const Timing& t) {
    reps_min = std::min(reps_min, t.reps);
    return t.median_bps;
  };

  LinkNumbers& n = r.numbers;
  n.h2d_bps = note(time_reps(s1.s, b, budget.take(1), [&](cudaStream_t s) {
    GHT_CUDA_TRY(cudaMemcpyAsync(dev_a, host_a.host, bytes, cudaMemcpyHostToDevice, s));
  }));
  n.d2h_bps = note(time_reps(s1.s, b, budget.take(1), [&](cudaStream_t s) {
    GHT_CUDA_TRY(cudaMemcpyAsync(host_b.host, dev_b, bytes, cudaMemcpyDeviceToHost, s));
  }));
  {
    // Both directions at once: s2 starts with s1 (waits on an event recorded just before the
    // H2D) and s1 waits for s2 before the timing event, so the interval covers both copies.
    Event fork, join;
    n.bidir_bps = note(time_reps(s1.s, 2 * b, budget.take(1), [&](cudaStream_t s) {
      GHT_CUDA_TRY(cudaEventRecord(fork.e, s));
      GHT_CUDA_TRY(cudaStreamWaitEvent(s2.s, fork.e, 0));
      GHT_CUDA_TRY(cudaMemcpyAsync(dev_a, host_a.host, bytes, cudaMemcpyHostToDevice, s));
      GHT_CUDA_TRY(cudaMemcpyAsync(host_b.host, dev_b, bytes, cudaMemcpyDeviceToHost, s2.s));
      GHT_CUDA_TRY(cudaEventRecord(join.e, s2.s));
      GHT_CUDA_TRY(cudaStreamWaitEvent(s, join.e, 0));
    }));
  }
  auto* const sink_p = static_cast<unsigned*>(sink.p);
  n.kernel_read_bps = note(time_reps(s1.s, b, budget.take(1), [&](cudaStream_t s) {
    read_kernel<<<blocks, kBlockThreads, 0, s>>>(static_cast<const uint4*>(host_a.dev), n16,
                                                 sink_p);
    GHT_CUDA_CHECK_LAUNCH();
  }));
  unsigned seed = 1;
  n.kernel_write_bps = note(time_reps(s1.s, b, budget.take(1), [&](cudaStream_t s) {
    write_kernel<<<blocks, kBlockThreads, 0, s>>>(static_cast<uint4*>(host_b.dev), n16, seed++);
    GHT_CUDA_CHECK_LAUNCH();
  }));
  n.hbm_bps = note(time_reps(s1.s, 2 * b * kHbmPasses, budget.take(1), [&](cudaStream_t s) {
    for (int pass = 0; pass < kHbmPasses; ++pass) {
      read_kernel<<<blocks, kBlockThreads, 0, s>>>(static_cast<const uint4*>(dev.p), 2 * n16,
                                                   sink_p);
      GHT_CUDA_CHECK_LAUNCH();
    }
  }));
  GHT_CUDA_TRY(cudaDeviceSynchronize());

  // The kernel really wrote host memory through the mapping: check a spread of elements of the
  // last write pass against what write_kernel stores.
  const unsigned last_seed = seed - 1;
  const auto* w = static_cast<const uint4*>(host_b.host);
  for (std::size_t i = 0; i < n16; i += std::max<std::size_t>(1, n16 / 1021)) {
    const auto lo = static_cast<unsigned>(i);
    GHT_EXPECTS(w[i].x == (lo ^ last_seed) && w[i].y == lo + last_seed && w[i].z == ~lo &&
                    w[i].w == last_seed,
                "link probe: the GPU's write of mapped host memory is not visible at element " +
                    std::to_string(i));
  }
  r.reps_min = reps_min;
}

}  // namespace

ProbeReport run_probe(double budget_seconds) {
  GHT_EXPECTS(budget_seconds > 0, "link probe: the time budget must be > 0 seconds");
  const Topology& topo = topology();
  const GpuInfo* gpu = topo.gpu();
  GHT_EXPECTS(gpu != nullptr,
              "link probe: no CUDA device found (nothing to measure); use "
              "GHT_LINK_PROFILE=gh200|pcie5|<file.json> to plan for a GPU machine");

  // Six GPU measurements of weight 1; the triad gets 2 because it also first-touches its arrays.
  Budget budget(budget_seconds, 8.0);
  ProbeReport r;
  r.numbers.name = "measured";
  r.numbers.source = "probe";
  r.numbers.kind = topo.link;

  std::exception_ptr error;
  std::thread worker([&] {
    try {
      try {
        bind_thread_to_node(topo.host_numa_node);
      } catch (const ght::logic_error&) {
        // Binding is a placement hint for the pinned buffers; measuring without it still works.
      }
      probe_gpu(topo, *gpu, budget, r);
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);

  // The triad runs after the GPU buffers are freed, so the two never compete for memory.
  r.triad_bytes = triad_array_bytes(topo);
  r.triad_threads = host_threads(topo);
  // Its allocation and first touch take about as long as the timed loop; give the loop half.
  const double triad_seconds = std::max(0.05, 0.5 * budget.take(2));
  HostTriadOptions triad;
  triad.node = topo.host_numa_node;
  triad.threads = r.triad_threads;
  triad.array_bytes = r.triad_bytes;
  triad.min_reps = kMinReps;
  triad.seconds = triad_seconds;
  r.numbers.host_triad_bps = measure_host_triad(triad).best_bps;
  r.seconds = budget.elapsed();
  return r;
}

}  // namespace ght::tier::detail
