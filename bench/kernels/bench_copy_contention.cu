// Copy-engine contention: how long a micro-batch's small host-to-device upload (tokens and
// targets) and its loss read-back take while the optimizer's dma path streams master, m and v
// through the copy engines, by three methods:
//
//   pageable  cudaMemcpyAsync from pageable memory (what the model did before GHT_INPUT_COPY)
//   pinned    cudaMemcpyAsync from pinned memory
//   sm        a kernel that reads (or writes) mapped pinned memory (kernels/cuda/sm_copy.hpp)
//
// The background load mimics AdamW's dma path (optimizer/adamw.cpp): chunks of `--chunk-mib`
// copied host-to-device and device-to-host on two streams of their own, `--queued` chunks kept
// in flight each way, for the whole measurement. Each probe is enqueued on a third stream and
// timed from the host (enqueue to event completion), `--probes` times per method, idle and
// under load. Prints a table last.
//
//   bench_copy_contention [--probe-kib 128] [--chunk-mib 48] [--queued 32] [--probes 30]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/sm_copy.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;
using clock_type = std::chrono::steady_clock;

struct Args {
  std::size_t probe_bytes = 128 << 10;
  std::size_t chunk_bytes = std::size_t{48} << 20;
  int queued = 32;
  int probes = 30;
};

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

// Background DMA traffic like the optimizer's dma path: `queued` chunks in flight each way,
// re-enqueued as they complete, until `stop`.
class DmaLoad {
 public:
  DmaLoad(const Args& a) : a_(a) {
    const std::size_t total = a.chunk_bytes * static_cast<std::size_t>(a.queued);
    GHT_CUDA_TRY(cudaHostAlloc(&host_up_, total, cudaHostAllocDefault));
    GHT_CUDA_TRY(cudaHostAlloc(&host_down_, total, cudaHostAllocDefault));
    GHT_CUDA_TRY(cudaMalloc(&dev_up_, total));
    GHT_CUDA_TRY(cudaMalloc(&dev_down_, total));
    std::memset(host_up_, 1, total);
    GHT_CUDA_TRY(cudaMemset(dev_down_, 2, total));
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
  }
  ~DmaLoad() {
    stop();
    (void)cudaStreamDestroy(up_);
    (void)cudaStreamDestroy(down_);
    (void)cudaFreeHost(host_up_);
    (void)cudaFreeHost(host_down_);
    (void)cudaFree(dev_up_);
    (void)cudaFree(dev_down_);
  }
  void start() {
    stop_ = false;
    bytes_ = 0;
    t0_ = clock_type::now();
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
    GHT_CUDA_TRY(cudaStreamSynchronize(up_));
    GHT_CUDA_TRY(cudaStreamSynchronize(down_));
    seconds_ = std::chrono::duration<double>(clock_type::now() - t0_).count();
  }
  /// Both directions' bytes per second over the load's life.
  [[nodiscard]] double gbps() const { return seconds_ > 0 ? static_cast<double>(bytes_) / seconds_ / 1e9 : 0; }

 private:
  void loop() {
    GHT_CUDA_TRY(cudaSetDevice(0));
    // Enqueue chunk after chunk, `queued` in flight per direction: a chunk's buffer is reused once
    // the copy that last used it has completed.
    const auto q = static_cast<std::size_t>(a_.queued);
    std::vector<cudaEvent_t> ev(2 * q);
    for (cudaEvent_t& e : ev) GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (std::size_t i = 0; !stop_; ++i) {
      const std::size_t slot = i % q, off = slot * a_.chunk_bytes;
      if (i >= q) {
        GHT_CUDA_TRY(cudaEventSynchronize(ev[slot]));
        GHT_CUDA_TRY(cudaEventSynchronize(ev[q + slot]));
      }
      GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(dev_up_) + off, static_cast<char*>(host_up_) + off,
                                   a_.chunk_bytes, cudaMemcpyHostToDevice, up_));
      GHT_CUDA_TRY(cudaEventRecord(ev[slot], up_));
      GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(host_down_) + off, static_cast<char*>(dev_down_) + off,
                                   a_.chunk_bytes, cudaMemcpyDeviceToHost, down_));
      GHT_CUDA_TRY(cudaEventRecord(ev[q + slot], down_));
      bytes_ += 2 * a_.chunk_bytes;
    }
    GHT_CUDA_TRY(cudaStreamSynchronize(up_));
    GHT_CUDA_TRY(cudaStreamSynchronize(down_));
    for (cudaEvent_t e : ev) (void)cudaEventDestroy(e);
  }
  Args a_;
  void *host_up_ = nullptr, *host_down_ = nullptr, *dev_up_ = nullptr, *dev_down_ = nullptr;
  cudaStream_t up_ = nullptr, down_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> bytes_{0};
  clock_type::time_point t0_;
  double seconds_ = 0;
};

struct Result {
  std::string method, direction, load;
  double p50_us = 0, p90_us = 0, max_us = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) throw std::runtime_error(k + " needs a value");
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (k == "--probe-kib") a.probe_bytes = static_cast<std::size_t>(next()) << 10;
    else if (k == "--chunk-mib") a.chunk_bytes = static_cast<std::size_t>(next()) << 20;
    else if (k == "--queued") a.queued = static_cast<int>(next());
    else if (k == "--probes") a.probes = static_cast<int>(next());
    else throw std::runtime_error("unknown argument " + k + " (see the file comment)");
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines survive a timeout's kill
  GHT_CUDA_TRY(cudaSetDevice(0));
  cudaDeviceProp prop{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d async engines; probe %zu KiB, load %d x %zu MiB chunks each way\n", prop.name,
              prop.asyncEngineCount, a.probe_bytes >> 10, a.queued, a.chunk_bytes >> 20);

  std::vector<char> pageable(a.probe_bytes, 3);
  void* pinned = nullptr;
  GHT_CUDA_TRY(cudaHostAlloc(&pinned, a.probe_bytes, cudaHostAllocMapped));
  std::memset(pinned, 3, a.probe_bytes);
  void* pinned_dev = kc::mapped_device_pointer(pinned);
  if (pinned_dev == nullptr) throw std::runtime_error("pinned memory is not GPU-mapped");
  void* dev = nullptr;
  GHT_CUDA_TRY(cudaMalloc(&dev, a.probe_bytes));
  cudaStream_t probe = nullptr;
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking));
  cudaEvent_t done = nullptr;
  GHT_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

  struct Method {
    const char* name;
    const char* direction;
    void (*run)(void* dev, void* pageable, void* pinned, void* pinned_dev, std::size_t n, cudaStream_t s);
  };
  const Method methods[] = {
      {"pageable cudaMemcpyAsync", "h2d",
       [](void* d, void* pg, void*, void*, std::size_t n, cudaStream_t s) {
         GHT_CUDA_TRY(cudaMemcpyAsync(d, pg, n, cudaMemcpyHostToDevice, s));
       }},
      {"pinned cudaMemcpyAsync", "h2d",
       [](void* d, void*, void* pn, void*, std::size_t n, cudaStream_t s) {
         GHT_CUDA_TRY(cudaMemcpyAsync(d, pn, n, cudaMemcpyHostToDevice, s));
       }},
      {"sm_copy from mapped pinned", "h2d",
       [](void* d, void*, void*, void* pd, std::size_t n, cudaStream_t s) { kc::sm_copy(d, pd, n, s); }},
      {"pinned cudaMemcpyAsync", "d2h",
       [](void* d, void*, void* pn, void*, std::size_t n, cudaStream_t s) {
         GHT_CUDA_TRY(cudaMemcpyAsync(pn, d, n, cudaMemcpyDeviceToHost, s));
       }},
      {"sm_copy to mapped pinned", "d2h",
       [](void* d, void*, void*, void* pd, std::size_t n, cudaStream_t s) { kc::sm_copy(pd, d, n, s); }},
  };

  auto measure = [&](const Method& m) {
    std::vector<double> us;
    for (int p = 0; p < a.probes; ++p) {
      const auto t0 = clock_type::now();
      m.run(dev, pageable.data(), pinned, pinned_dev, a.probe_bytes, probe);
      GHT_CUDA_TRY(cudaEventRecord(done, probe));
      GHT_CUDA_TRY(cudaEventSynchronize(done));
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return us;
  };

  std::vector<Result> results;
  DmaLoad load(a);
  for (const char* phase : {"idle", "under dma load"}) {
    const bool loaded = std::strcmp(phase, "idle") != 0;
    if (loaded) {
      load.start();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the queues fill
    }
    for (const Method& m : methods) {
      (void)measure(m);  // warm-up pass (first-use costs)
      const std::vector<double> us = measure(m);
      results.push_back({m.name, m.direction, phase, pct(us, 0.5), pct(us, 0.9), pct(us, 1.0)});
      std::printf("  %s, %s %s: p50 %.1f us\n", phase, m.name, m.direction, results.back().p50_us);
    }
    if (loaded) load.stop();
  }

  std::printf("\nbackground dma load: %.1f GB/s (both directions)\n\n", load.gbps());
  std::printf("| probe | dir | load | p50 us | p90 us | max us |\n|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %s | %s | %.1f | %.1f | %.1f |\n", r.method.c_str(), r.direction.c_str(), r.load.c_str(),
                r.p50_us, r.p90_us, r.max_us);
  }
  (void)cudaEventDestroy(done);
  (void)cudaStreamDestroy(probe);
  (void)cudaFree(dev);
  (void)cudaFreeHost(pinned);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_copy_contention: %s\n", e.what());
  return 1;
}
