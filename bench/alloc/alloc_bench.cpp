// alloc_bench: what ghtier's allocators cost against the CUDA runtime's own.
//
//   1. Cached alloc+free pairs, 64 KiB .. 256 MiB: device_pool (and the tiered allocator on
//      it) against cudaMallocAsync on the device's default pool and against cudaMalloc/cudaFree.
//      "sync" variants synchronise the stream after each pair, as a training step does: the
//      default pool (release threshold 0) then hands memory back to the driver, ours keeps it.
//      Bytes moved: none; the floor is a few hundred ns of bookkeeping.
//   2. Pinned host allocation of 1, 8 and 32 GiB (sizes that do not fit in free memory are
//      skipped): pinned_host with parallel chunked registration and with one cudaHostRegister
//      call, against cudaHostAlloc(Mapped|Portable). Bytes moved: every page is faulted and
//      zeroed once, so the floor is size / host memset bandwidth; GB/s is reported.
//   3. Mixed host workload (issue 16): eight threads each keep 8 blocks live and replace a random
//      one per op (free it, allocate 1 B .. 64 MiB log-uniform, write its first and last byte).
//      system_host with its large-block cache, and without it, against glibc's aligned_alloc;
//      pinned_host likewise on a GPU machine. An op is one allocation and one free; ops/s and
//      the process's user and system CPU seconds are reported. Goal: >= 0.5x glibc's ops/s.
//      --ght_mixed_ops=N sets the ops per thread (default 200000: long enough that filling the
//      cache, a few hundred misses, is amortised; uncached runs do a twentieth of that, pinned
//      uncached a two-hundredth, since each op there maps, faults and registers a block).
//   Without CUDA (or without a GPU) only host benchmarks run: system_host against malloc/mmap.
//
// Prints a ratio table last (baseline time / ghtier time: above 1 means ghtier is faster) and
// writes every run and the ratios as JSON: --ght_json=PATH (default alloc_bench.json).
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "alloc/detail/host_memory.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "alloc/device_pool.hpp"
#endif

namespace {

using namespace ght::alloc;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

std::string size_name(std::size_t b) {
  if (b >= GiB) return std::to_string(b / GiB) + "GiB";
  if (b >= MiB) return std::to_string(b / MiB) + "MiB";
  if (b >= KiB) return std::to_string(b / KiB) + "KiB";
  return std::to_string(b) + "B";
}

int host_node() { return ght::alloc::detail::numa_node_usable(0) ? 0 : -1; }

// ---- host-only benchmarks (every build) ---------------------------------------------------------

void bm_system_host_pair(benchmark::State& st, std::size_t bytes) {
  system_host r(host_node());
  r.deallocate(r.allocate(bytes), bytes);  // warm: slabs exist
  for (auto _ : st) {
    void* p = r.allocate(bytes);
    benchmark::DoNotOptimize(p);
    r.deallocate(p, bytes);
  }
}

void bm_malloc_pair(benchmark::State& st, std::size_t bytes) {
  for (auto _ : st) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

void bm_mmap_pair(benchmark::State& st, std::size_t bytes) {
  for (auto _ : st) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    benchmark::DoNotOptimize(p);
    munmap(p, bytes);
  }
}

// ---- mixed sizes from eight threads (issue 16) ---------------------------------------------------

constexpr int kMixedThreads = 8;
constexpr int kMixedLive = 8;  // blocks each thread keeps live
constexpr std::size_t kMixedMax = 64 * MiB;
long g_mixed_ops = 200000;  // per thread, --ght_mixed_ops

double cpu_seconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec); }

/// Runs the mixed workload through alloc/free, `ops` per thread; returns wall seconds and sets
/// the user and system CPU seconds the process spent.
double run_mixed(const std::function<void*(std::size_t)>& alloc,
                 const std::function<void(void*, std::size_t)>& free_fn, long ops, double* user_s,
                 double* sys_s) {
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  const auto t0 = clock_type::now();
  std::vector<std::thread> th;
  for (int t = 0; t < kMixedThreads; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(t));
      // Log-uniform: every order of magnitude equally likely.
      std::uniform_real_distribution<double> log_size(0.0, std::log(static_cast<double>(kMixedMax) + 1.0));
      std::array<std::pair<char*, std::size_t>, kMixedLive> live{};
      for (long i = 0; i < ops; ++i) {
        auto& [p, n] = live[rng() % kMixedLive];
        if (p != nullptr) free_fn(p, n);
        n = std::clamp<std::size_t>(static_cast<std::size_t>(std::exp(log_size(rng))), 1, kMixedMax);
        p = static_cast<char*>(alloc(n));
        p[0] = 1;
        p[n - 1] = 1;
      }
      for (auto& [p, n] : live) {
        if (p != nullptr) free_fn(p, n);
      }
    });
  }
  for (auto& x : th) x.join();
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  getrusage(RUSAGE_SELF, &r1);
  *user_s = cpu_seconds(r1.ru_utime) - cpu_seconds(r0.ru_utime);
  *sys_s = cpu_seconds(r1.ru_stime) - cpu_seconds(r0.ru_stime);
  return wall;
}

void report_mixed(benchmark::State& st, double wall, long ops, double user_s, double sys_s) {
  st.SetIterationTime(wall);
  const double total = static_cast<double>(ops) * kMixedThreads;
  st.counters["ops/s"] = total / wall;
  st.counters["ops"] = total;
  st.counters["user_s"] = user_s;
  st.counters["sys_s"] = sys_s;
}

/// `cache` false: the cache off, as the host resources were before it existed.
/// `divisor`: run g_mixed_ops / divisor ops per thread (slow variants).
template <typename Resource>
void bm_mixed_resource(benchmark::State& st, std::unique_ptr<Resource> (*make)(bool), bool cache,
                       long divisor) {
  const long ops = std::max(1L, g_mixed_ops / divisor);
  for (auto _ : st) {
    std::unique_ptr<Resource> r = make(cache);
    double user_s = 0, sys_s = 0;
    const double wall = run_mixed([&](std::size_t n) { return r->allocate(n); },
                                  [&](void* p, std::size_t n) { r->deallocate(p, n); }, ops,
                                  &user_s, &sys_s);
    report_mixed(st, wall, ops, user_s, sys_s);
    const detail::HostCacheStats cs = r->cache_stats();
    const double lookups = static_cast<double>(cs.hits + cs.misses);
    st.counters["hit_rate"] = lookups > 0 ? static_cast<double>(cs.hits) / lookups : 0.0;
    st.counters["released_MiB"] = static_cast<double>(cs.released_bytes) / MiB;
  }
}

std::unique_ptr<system_host> make_system_host(bool cache) {
  detail::HostCacheOptions o;
  if (!cache) o.max_bytes = 0;
  return std::make_unique<system_host>(host_node(), true, o);
}

void bm_mixed_aligned_alloc(benchmark::State& st) {
  for (auto _ : st) {
    double user_s = 0, sys_s = 0;
    const double wall = run_mixed([](std::size_t n) { return std::aligned_alloc(256, (n + 255) / 256 * 256); },
                                  [](void* p, std::size_t) { std::free(p); }, g_mixed_ops, &user_s, &sys_s);
    report_mixed(st, wall, g_mixed_ops, user_s, sys_s);
  }
}

#ifdef GHT_HAVE_CUDA
std::unique_ptr<pinned_host> make_pinned_host(bool cache) {
  PinnedHostOptions o;
  o.numa_node = host_node();
  if (!cache) o.cache.max_bytes = 0;
  return std::make_unique<pinned_host>(o);
}

// ---- cached device alloc+free pairs -------------------------------------------------------------

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s); }
};

void bm_pool_pair(benchmark::State& st, std::size_t bytes, bool sync) {
  device_pool pool;
  Stream s;
  pool.deallocate(pool.allocate(bytes, 256, s.s), bytes, 256, s.s);
  for (auto _ : st) {
    void* p = pool.allocate(bytes, 256, s.s);
    pool.deallocate(p, bytes, 256, s.s);
    if (sync) cudaStreamSynchronize(s.s);
  }
  cudaStreamSynchronize(s.s);
}

void bm_tiered_pair(benchmark::State& st, std::size_t bytes, bool sync) {
  std::array<TierSetup, ght::kNumTiers> tiers;
  tiers[0].resource = std::make_unique<device_pool>();
  tiered_allocator t(std::move(tiers));
  Stream s;
  const AllocRequest req{ght::TensorClass::activation, "bench", ght::TierKind::hbm, false};
  t.deallocate(t.allocate(bytes, req, s.s), s.s);
  for (auto _ : st) {
    void* p = t.allocate(bytes, req, s.s);
    t.deallocate(p, s.s);
    if (sync) cudaStreamSynchronize(s.s);
  }
  cudaStreamSynchronize(s.s);
}

void bm_malloc_async_pair(benchmark::State& st, std::size_t bytes, bool sync) {
  Stream s;
  void* w = nullptr;
  cudaMallocAsync(&w, bytes, s.s);
  cudaFreeAsync(w, s.s);
  for (auto _ : st) {
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, s.s) != cudaSuccess) st.SkipWithError("cudaMallocAsync failed");
    cudaFreeAsync(p, s.s);
    if (sync) cudaStreamSynchronize(s.s);
  }
  cudaStreamSynchronize(s.s);
}

void bm_cuda_malloc_pair(benchmark::State& st, std::size_t bytes) {
  for (auto _ : st) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) st.SkipWithError("cudaMalloc failed");
    cudaFree(p);
  }
}

// ---- pinned host allocation ---------------------------------------------------------------------

void bm_pinned_alloc(benchmark::State& st, std::size_t bytes, std::size_t chunk) {
  PinnedHostOptions o;
  o.numa_node = host_node();
  o.register_chunk_bytes = chunk;
  pinned_host r(o);
  double free_s = 0;
  for (auto _ : st) {
    const auto t0 = clock_type::now();
    void* p = r.allocate(bytes);
    const auto t1 = clock_type::now();
    st.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    r.deallocate(p, bytes);
    free_s += std::chrono::duration<double>(clock_type::now() - t1).count();
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                           benchmark::Counter::kIsIterationInvariantRate);
  st.counters["free_ms"] = 1e3 * free_s / static_cast<double>(st.iterations());
  st.counters["chunked"] = r.chunked_registration() ? 1 : 0;
}

void bm_cuda_host_alloc(benchmark::State& st, std::size_t bytes) {
  double free_s = 0;
  for (auto _ : st) {
    void* p = nullptr;
    const auto t0 = clock_type::now();
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    const auto t1 = clock_type::now();
    if (err != cudaSuccess) {
      st.SkipWithError("cudaHostAlloc failed");
      break;
    }
    st.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    cudaFreeHost(p);
    free_s += std::chrono::duration<double>(clock_type::now() - t1).count();
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                           benchmark::Counter::kIsIterationInvariantRate);
  st.counters["free_ms"] = 1e3 * free_s / static_cast<double>(std::max<benchmark::IterationCount>(st.iterations(), 1));
}

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}
#endif

// ---- collecting what ran, for the table and the JSON --------------------------------------------

class Collector : public benchmark::ConsoleReporter {
 public:
  struct Result {
    double ns = 0;  // real time per iteration
    benchmark::IterationCount iterations = 0;
    std::map<std::string, double> counters;
  };
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      Result res;
      res.ns = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit) * 1e9;
      res.iterations = r.iterations;
      for (const auto& [k, c] : r.counters) res.counters[k] = c.value;
      // The registered name: benchmark_name() appends "/iterations:N/manual_time" and the like.
      results[r.run_name.function_name] = res;
    }
  }
  std::map<std::string, Result> results;
};

double ns_of(const Collector& c, const std::string& name) {
  const auto it = c.results.find(name);
  return it == c.results.end() ? 0.0 : it->second.ns;
}

double ratio(double base, double ours) { return ours > 0 && base > 0 ? base / ours : 0.0; }

/// The benchmarks main registered: their sizes and names, for the ratio table.
struct Registered {
  std::vector<std::size_t> small_sizes = {64, 1 * KiB, 16 * KiB, 128 * KiB};
  std::vector<std::string> mixed_names = {"system_host", "system_host_nocache"};
  std::vector<std::size_t> pair_sizes, pinned_sizes;
  bool gpu = false;
};

/// Takes --ght_json=PATH and --ght_mixed_ops=N out of argv; the rest go to `args`. Returns the JSON path.
std::string take_ght_args(int argc, char** argv, std::vector<char*>& args) {
  std::string json_path = "alloc_bench.json";
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--ght_json=", 11) == 0) {
      json_path = argv[i] + 11;
    } else if (std::strncmp(argv[i], "--ght_mixed_ops=", 16) == 0) {
      g_mixed_ops = std::max(1L, std::atol(argv[i] + 16));
    } else {
      args.push_back(argv[i]);
    }
  }
  return json_path;
}

void mixed(benchmark::internal::Benchmark* b) { b->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond); }

void register_host(const Registered& reg) {
  for (std::size_t b : reg.small_sizes) {
    benchmark::RegisterBenchmark(("host_pair/system_host/" + size_name(b)).c_str(),
                                 bm_system_host_pair, b);
    benchmark::RegisterBenchmark(("host_pair/aligned_alloc/" + size_name(b)).c_str(),
                                 bm_malloc_pair, b);
  }
  benchmark::RegisterBenchmark("host_pair/system_host/64MiB", bm_system_host_pair, 64 * MiB);
  benchmark::RegisterBenchmark("host_pair/mmap/64MiB", bm_mmap_pair, 64 * MiB);

  // Mixed workload: glibc first and last, so a machine that slows down during the run shows.
  mixed(benchmark::RegisterBenchmark("mixed8/aligned_alloc", bm_mixed_aligned_alloc));
  mixed(benchmark::RegisterBenchmark("mixed8/system_host", bm_mixed_resource<system_host>, make_system_host, true, 1L));
  mixed(benchmark::RegisterBenchmark("mixed8/system_host_nocache", bm_mixed_resource<system_host>, make_system_host, false, 20L));
  mixed(benchmark::RegisterBenchmark("mixed8/aligned_alloc_again", bm_mixed_aligned_alloc));
}

#ifdef GHT_HAVE_CUDA
void register_device(Registered& reg) {
  for (std::size_t b = 64 * KiB; b <= 256 * MiB; b *= 4) reg.pair_sizes.push_back(b);
  for (std::size_t b : reg.pair_sizes) {
    const std::string s = size_name(b);
    for (bool sync : {false, true}) {
      const std::string v = sync ? "sync/" : "nosync/";
      benchmark::RegisterBenchmark(("pair/" + v + "ght_pool/" + s).c_str(), bm_pool_pair, b, sync);
      benchmark::RegisterBenchmark(("pair/" + v + "ght_tiered/" + s).c_str(), bm_tiered_pair, b, sync);
      benchmark::RegisterBenchmark(("pair/" + v + "cudaMallocAsync/" + s).c_str(), bm_malloc_async_pair, b, sync);
    }
    benchmark::RegisterBenchmark(("pair/sync/cudaMalloc/" + s).c_str(), bm_cuda_malloc_pair, b);
  }
  mixed(benchmark::RegisterBenchmark("mixed8/pinned_host", bm_mixed_resource<pinned_host>, make_pinned_host, true, 1L));
  mixed(benchmark::RegisterBenchmark("mixed8/pinned_host_nocache", bm_mixed_resource<pinned_host>, make_pinned_host, false, 200L));
  reg.mixed_names.push_back("pinned_host");
  reg.mixed_names.push_back("pinned_host_nocache");
  // Pinned sizes that fit: leave a quarter of the free memory for everything else.
  const std::uint64_t free_b = ght::alloc::detail::numa_node_free_bytes(host_node());
  for (std::size_t b : {1 * GiB, 8 * GiB, 32 * GiB}) {
    if (free_b != UINT64_MAX && b > free_b / 4 * 3) {
      std::printf("skipping pinned %s: %.1f GiB available on the host node\n", size_name(b).c_str(),
                  static_cast<double>(free_b) / GiB);
      continue;
    }
    reg.pinned_sizes.push_back(b);
    const std::string s = size_name(b);
    const benchmark::IterationCount it = b >= 32 * GiB ? 1 : b >= 8 * GiB ? 2 : 5;
    benchmark::RegisterBenchmark(("pinned/ght_chunked/" + s).c_str(), bm_pinned_alloc, b, std::size_t{1} * GiB)
        ->UseManualTime()->Iterations(it)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("pinned/ght_single/" + s).c_str(), bm_pinned_alloc, b, std::size_t{0})
        ->UseManualTime()->Iterations(it)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("pinned/cudaHostAlloc/" + s).c_str(), bm_cuda_host_alloc, b)
        ->UseManualTime()->Iterations(it)->Unit(benchmark::kMillisecond);
  }
}
#endif

void report_host_pairs(const Collector& rep, const Registered& reg, nlohmann::json& ratios) {
  std::printf("host alloc+free pairs (ns)\n%-8s %12s %14s %8s\n", "size", "system_host", "aligned_alloc", "ratio");
  for (std::size_t b : reg.small_sizes) {
    const std::string s = size_name(b);
    const double ours = ns_of(rep, "host_pair/system_host/" + s);
    const double base = ns_of(rep, "host_pair/aligned_alloc/" + s);
    std::printf("%-8s %12.1f %14.1f %8.2f\n", s.c_str(), ours, base, ratio(base, ours));
    ratios["host_pair"][s] = {{"system_host_ns", ours}, {"aligned_alloc_ns", base}, {"ratio", ratio(base, ours)}};
  }
}

void report_mixed(const Collector& rep, const Registered& reg, nlohmann::json& ratios) {
  const auto counter = [&](const std::string& name, const char* key) {
    const auto it = rep.results.find("mixed8/" + name);
    if (it == rep.results.end()) return 0.0;
    const auto c = it->second.counters.find(key);
    return c == it->second.counters.end() ? 0.0 : c->second;
  };
  // The baseline is the mean of glibc's two runs.
  const double g1 = counter("aligned_alloc", "ops/s"), g2 = counter("aligned_alloc_again", "ops/s");
  const double glibc = g1 > 0 && g2 > 0 ? (g1 + g2) / 2 : std::max(g1, g2);
  std::printf("mixed sizes 1 B..64 MiB, %d threads x %d live blocks (ops/s; goal: ratio >= 0.5)\n"
              "%-20s %12s %8s %8s %8s %9s\n", kMixedThreads, kMixedLive, "resource", "ops/s",
              "user_s", "sys_s", "hit_rate", "vs_glibc");
  for (const std::string& name : {std::string("aligned_alloc"), std::string("aligned_alloc_again")}) {
    std::printf("%-20s %12.0f %8.2f %8.2f %8s %9s\n", name.c_str(), counter(name, "ops/s"),
                counter(name, "user_s"), counter(name, "sys_s"), "-", "-");
  }
  ratios["mixed8"]["aligned_alloc_ops_per_s"] = glibc;
  for (const std::string& name : reg.mixed_names) {
    const double ops = counter(name, "ops/s");
    const double r = glibc > 0 ? ops / glibc : 0.0;
    std::printf("%-20s %12.0f %8.2f %8.2f %8.3f %9.3f\n", name.c_str(), ops, counter(name, "user_s"),
                counter(name, "sys_s"), counter(name, "hit_rate"), r);
    ratios["mixed8"][name] = {{"ops_per_s", ops}, {"vs_aligned_alloc", r},
                              {"hit_rate", counter(name, "hit_rate")}};
  }
}

void report_device_pairs(const Collector& rep, const Registered& reg, nlohmann::json& ratios) {
  if (reg.pair_sizes.empty()) return;
  for (const char* v : {"nosync", "sync"}) {
    std::printf("device alloc+free pairs, %s (ns)\n%-8s %10s %10s %16s %8s %12s %8s\n", v, "size",
                "ght_pool", "ght_tiered", "cudaMallocAsync", "ratio", "cudaMalloc", "ratio");
    for (std::size_t b : reg.pair_sizes) {
      const std::string s = size_name(b), pre = std::string("pair/") + v + "/";
      const double pool = ns_of(rep, pre + "ght_pool/" + s);
      const double tiered = ns_of(rep, pre + "ght_tiered/" + s);
      const double async = ns_of(rep, pre + "cudaMallocAsync/" + s);
      const double direct = ns_of(rep, "pair/sync/cudaMalloc/" + s);
      std::printf("%-8s %10.0f %10.0f %16.0f %8.2f %12.0f %8.2f\n", s.c_str(), pool, tiered, async,
                  ratio(async, pool), direct, ratio(direct, pool));
      ratios[std::string("pair_") + v][s] = {{"ght_pool_ns", pool}, {"ght_tiered_ns", tiered},
                                            {"cudaMallocAsync_ns", async}, {"cudaMalloc_ns", direct},
                                            {"vs_cudaMallocAsync", ratio(async, pool)},
                                            {"vs_cudaMalloc", ratio(direct, pool)}};
    }
  }
}

void report_pinned(const Collector& rep, const Registered& reg, nlohmann::json& ratios) {
  if (reg.pinned_sizes.empty()) return;
  std::printf("pinned host allocation (ms; goal: ratio >= 2 from 8 GiB)\n%-6s %12s %12s %14s %8s %8s\n",
              "size", "ght_chunked", "ght_single", "cudaHostAlloc", "ratio_c", "ratio_s");
  for (std::size_t b : reg.pinned_sizes) {
    const std::string s = size_name(b);
    const double c = ns_of(rep, "pinned/ght_chunked/" + s) * 1e-6;
    const double one = ns_of(rep, "pinned/ght_single/" + s) * 1e-6;
    const double base = ns_of(rep, "pinned/cudaHostAlloc/" + s) * 1e-6;
    std::printf("%-6s %12.1f %12.1f %14.1f %8.2f %8.2f\n", s.c_str(), c, one, base, ratio(base, c), ratio(base, one));
    ratios["pinned"][s] = {{"ght_chunked_ms", c}, {"ght_single_ms", one}, {"cudaHostAlloc_ms", base},
                           {"ratio_chunked", ratio(base, c)}, {"ratio_single", ratio(base, one)}};
  }
}

void write_json(const std::string& json_path, const Collector& rep, bool gpu, const nlohmann::json& ratios) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& [name, r] : rep.results) {
    runs.push_back({{"name", name}, {"real_time_ns", r.ns}, {"iterations", r.iterations}, {"counters", r.counters}});
  }
  std::ofstream out(json_path);
  out << nlohmann::json{{"benchmark", "alloc_bench"}, {"gpu", gpu}, {"runs", runs}, {"ratios", ratios}}.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  const std::string json_path = take_ght_args(argc, argv, args);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());

  Registered reg;
  register_host(reg);
#ifdef GHT_HAVE_CUDA
  reg.gpu = have_gpu();
  if (reg.gpu) {
    register_device(reg);
  } else {
    std::printf("no CUDA device: device and pinned benchmarks skipped\n");
  }
#else
  std::printf("built without CUDA: device and pinned benchmarks skipped\n");
#endif

  Collector rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  // ---- ratio table (baseline / ghtier) --------------------------------------------------------
  nlohmann::json ratios = nlohmann::json::object();
  std::printf("\n== ratios: baseline time / ghtier time (above 1: ghtier faster) ==\n");
  report_host_pairs(rep, reg, ratios);
  report_mixed(rep, reg, ratios);
  report_device_pairs(rep, reg, ratios);
  report_pinned(rep, reg, ratios);
  write_json(json_path, rep, reg.gpu, ratios);
  benchmark::Shutdown();
  return 0;
}
