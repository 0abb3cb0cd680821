// The host STREAM triad (host_triad.hpp) and the probe's choice of its size and team.
#include "tier/host_triad.hpp"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "tier/config.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/detail/triad_simd.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace ght::tier {

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kLineFloats = 16;  // 64-byte cache line: slices never share one

// The loop is tier/detail/triad_simd.cpp (Highway, the best target the CPU runs). Slices start
// and end on cache lines and the arrays are 2 MiB aligned, so every vector up to 64 bytes is
// aligned and x86's stores are non-temporal; other ISAs store plainly.
#if defined(__x86_64__)
constexpr bool kNontemporal = true;
#else
constexpr bool kNontemporal = false;
#endif

std::vector<int> process_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof set, &set);  // unpinned still measures, only less steadily
}

/// [lo, hi) of thread t of nt over n elements, cut on cache lines (n is a multiple of a line).
std::pair<std::size_t, std::size_t> slice(std::size_t n, int t, int nt) {
  const std::size_t lines = n / kLineFloats, tt = static_cast<std::size_t>(t),
                    nn = static_cast<std::size_t>(nt);
  return {lines * tt / nn * kLineFloats, lines * (tt + 1) / nn * kLineFloats};
}

/// One array: anonymous memory aligned to 2 MiB (so whole huge pages cover it), placed on a NUMA
/// node with mbind, optionally advised for huge pages. Untouched until the team's first touch.
class NodeArray {
 public:
  NodeArray(std::size_t bytes, int node, bool huge) : bytes_(bytes), mapped_(bytes + kHugePage) {
    void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      throw ght::out_of_memory("host triad: cannot map " + config::format_bytes(bytes) + ": " +
                               std::strerror(errno));
    }
    base_ = m;
    const auto addr = reinterpret_cast<std::uintptr_t>(m);
    p_ = reinterpret_cast<float*>((addr + kHugePage - 1) / kHugePage * kHugePage);
    if (numa_available() >= 0) numa_tonode_memory(p_, bytes_, node);
    if (huge) (void)advise_huge_pages(p_, bytes_);
  }
  ~NodeArray() { munmap(base_, mapped_); }
  NodeArray(const NodeArray&) = delete;
  NodeArray& operator=(const NodeArray&) = delete;
  [[nodiscard]] float* data() const { return p_; }
  [[nodiscard]] std::size_t huge_bytes() const { return huge_page_bytes(p_, bytes_); }

 private:
  std::size_t bytes_, mapped_;
  void* base_ = nullptr;
  float* p_ = nullptr;
};

/// `threads` std::threads, thread t pinned to cpus[t % size], released together for every pass
/// (the caller waits on the same barriers, so a pass's time is that of its slowest slice).
class Team {
 public:
  Team(int threads, std::vector<int> cpus)
      : threads_(threads), cpus_(std::move(cpus)), start_(threads + 1), done_(threads + 1) {
    try {
      for (int t = 0; t < threads; ++t) workers_.emplace_back([this, t] { loop(t); });
    } catch (...) {  // a thread could not start: release the ones that did, then report it
      for (auto k = workers_.size(); k < static_cast<std::size_t>(threads); ++k) {
        start_.arrive_and_drop();
      }
      stop();
      throw;
    }
  }
  ~Team() { stop(); }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  void run(const TeamBody& body) {
    body_ = &body;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }

 private:
  void loop(int t) {
    pin_to(cpus_[static_cast<std::size_t>(t) % cpus_.size()]);
    for (;;) {
      start_.arrive_and_wait();
      if (stopping_) return;
      (*body_)(t, threads_);
      done_.arrive_and_wait();
    }
  }
  void stop() {
    stopping_ = true;  // written before start_'s phase completes, read after: no race
    start_.arrive_and_wait();
    for (std::thread& w : workers_) w.join();
  }

  int threads_;
  std::vector<int> cpus_;
  const TeamBody* body_ = nullptr;
  bool stopping_ = false;
  std::barrier<> start_, done_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::vector<int> team_cpus(int node) {
  const std::vector<int> allowed = process_cpus();
  std::vector<int> out;
  try {
    for (const NumaNode& n : topology().numa_nodes) {
      if (n.os_index != node) continue;
      for (int c : n.cpus) {
        if (std::find(allowed.begin(), allowed.end(), c) != allowed.end()) out.push_back(c);
      }
    }
  } catch (const std::exception&) {
    out.clear();  // without a usable topology the process mask is still a correct list
  }
  return out.empty() ? allowed : out;
}

bool advise_huge_pages(void* p, std::size_t bytes) {
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + bytes) / kHugePage * kHugePage;
  if (hi <= lo) return false;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
}

std::size_t huge_page_bytes(const void* p, std::size_t bytes) {
  // smaps lists each mapping ("start-end perms ...") followed by its counters; AnonHugePages is
  // per mapping, so clamp it to the part of the mapping inside [p, p + bytes).
  std::ifstream smaps("/proc/self/smaps");
  const auto lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + bytes;
  std::size_t overlap = 0, total = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    std::uintmax_t start = 0, end = 0, kb = 0;
    if (std::sscanf(line.c_str(), "%jx-%jx ", &start, &end) == 2) {  // counters never match
      overlap = std::max<std::uintmax_t>(lo, start) < std::min<std::uintmax_t>(hi, end)
                    ? std::min<std::uintmax_t>(hi, end) - std::max<std::uintmax_t>(lo, start)
                    : 0;
    } else if (overlap > 0 && std::sscanf(line.c_str(), "AnonHugePages: %ju kB", &kb) == 1) {
      total += std::min<std::size_t>(overlap, kb * 1024);
    }
  }
  return total;
}

HostTriadResult measure_host_triad(const HostTriadOptions& o) {
  GHT_EXPECTS(o.parallel || o.threads >= 1,
              "host triad: threads must be >= 1, got " + std::to_string(o.threads));
  GHT_EXPECTS(o.array_bytes >= 4096, "host triad: arrays must be >= 4096 bytes, got " +
                                         std::to_string(o.array_bytes));
  GHT_EXPECTS(o.min_reps >= 1, "host triad: min_reps must be >= 1");
  GHT_EXPECTS(o.node >= 0, "host triad: NUMA node must be >= 0, got " + std::to_string(o.node));
  const std::size_t n = o.array_bytes / sizeof(float) / kLineFloats * kLineFloats;
  const std::size_t bytes = n * sizeof(float);
  const NodeArray a_mem(bytes, o.node, o.huge_pages), b_mem(bytes, o.node, o.huge_pages),
      c_mem(bytes, o.node, o.huge_pages);
  float* const a = a_mem.data();
  float* const b = b_mem.data();
  float* const c = c_mem.data();

  std::optional<Team> own;
  ParallelFor run = o.parallel;
  if (!run) {
    own.emplace(o.threads, o.cpus.empty() ? team_cpus(o.node) : o.cpus);
    run = [&own](const TeamBody& body) { own->run(body); };
  }
  HostTriadResult r;
  r.array_bytes = bytes;
  r.nontemporal = kNontemporal;
  std::atomic<int> team_size{0};
  // First touch with the kernel's split: each thread's pages sit where that thread runs. Small
  // integers keep a = b + 3c exact in fp32, so the check below can ask for equality.
  run([&](int t, int nt) {
    if (t == 0) team_size.store(nt, std::memory_order_relaxed);
    const auto [lo, hi] = slice(n, t, nt);
    for (std::size_t i = lo; i < hi; ++i) {
      a[i] = 0.0f;
      b[i] = static_cast<float>(i % 1021);
      c[i] = static_cast<float>(i % 509);
    }
  });
  r.threads = team_size.load();
  r.huge_page_fraction = static_cast<double>(a_mem.huge_bytes() + b_mem.huge_bytes() +
                                             c_mem.huge_bytes()) /
                         (3.0 * static_cast<double>(bytes));

  const float s = 3.0f;
  const TeamBody kernel = [&](int t, int nt) {
    const auto [lo, hi] = slice(n, t, nt);
    detail::triad(a + lo, b + lo, c + lo, s, hi - lo);
  };
  double timed = 0;
  for (int rep = -1;; ++rep) {  // rep -1 is the untimed warm-up
    const auto t0 = std::chrono::steady_clock::now();
    run(kernel);
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 0) {
      timed += dt;
      r.pass_bps.push_back(3.0 * static_cast<double>(bytes) / std::max(dt, 1e-9));
      if (o.after_pass) o.after_pass(rep);
    }
    const int done = rep + 1;
    if (done >= o.min_reps && (timed >= o.seconds || done >= std::max(100, o.min_reps))) break;
  }

  const std::size_t step = std::max<std::size_t>(1, n / 997);
  for (std::size_t i = 0; i < n; i += step) {
    GHT_EXPECTS(a[i] == b[i] + s * c[i], "host triad: wrong result at element " + std::to_string(i));
  }
  GHT_EXPECTS(a[n - 1] == b[n - 1] + s * c[n - 1], "host triad: wrong result at the last element");
  std::vector<double> sorted = r.pass_bps;
  std::sort(sorted.begin(), sorted.end());
  r.best_bps = sorted.back();
  const std::size_t m = sorted.size();
  r.median_bps = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  return r;
}

namespace detail {

std::size_t triad_array_bytes(const Topology& topo) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // Eight times the largest cache and at least 1 GiB: AMD parts split L3 into many slices, so the
  // largest single cache understates a socket's total; 3 GiB of arrays exceeds any current one.
  std::size_t bytes = std::max<std::size_t>(1024 * kMiB, 8 * topo.l3_bytes);
  bytes = std::min<std::size_t>(bytes, 4096 * kMiB);
  // Never take more than 3/16 of the host node's free memory for the three arrays.
  const std::size_t avail = topo.available(TierKind::host);
  if (avail > 0) bytes = std::min<std::size_t>(bytes, avail / 16);
  bytes = std::max<std::size_t>(bytes, 64 * kMiB);
  return bytes / (2 * kMiB) * (2 * kMiB);
}

int host_threads(const Topology& topo) {
  const auto configured = config::cfg().get_int(config::Key::GHT_CPU_THREADS);
  if (configured > 0) return static_cast<int>(configured);
  for (const auto& n : topo.numa_nodes) {
    if (n.os_index == topo.host_numa_node && !n.cpus.empty()) {
      return static_cast<int>(n.cpus.size());
    }
  }
  return std::max(1, topo.cores);
}

}  // namespace detail
}  // namespace ght::tier
