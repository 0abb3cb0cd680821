// Host-memory STREAM triad for the link probe. Lives in a .cpp (not probe.cu) so CPU-only
// builds can run it too. Plain std::threads, not OpenMP: tier/ is part of the allocator library
// (libghtier_alloc), which must not pull an OpenMP runtime into a process beside PyTorch's.
#include <numa.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "tier/config.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace ght::tier::detail {

namespace {

/// One array placed on a NUMA node (libnuma), or plain aligned memory without NUMA support.
class NodeArray {
 public:
  NodeArray(std::size_t bytes, int node) : bytes_(bytes), numa_(numa_available() >= 0) {
    p_ = numa_ ? numa_alloc_onnode(bytes, node) : std::aligned_alloc(4096, round_up(bytes));
    if (p_ == nullptr) {
      throw ght::out_of_memory("host triad: cannot allocate " + config::format_bytes(bytes) +
                               " on NUMA node " + std::to_string(node));
    }
  }
  ~NodeArray() {
    if (numa_) {
      numa_free(p_, bytes_);
    } else {
      std::free(p_);
    }
  }
  NodeArray(const NodeArray&) = delete;
  NodeArray& operator=(const NodeArray&) = delete;
  [[nodiscard]] double* data() const { return static_cast<double*>(p_); }

 private:
  static std::size_t round_up(std::size_t b) { return (b + 4095) / 4096 * 4096; }
  std::size_t bytes_;
  bool numa_;
  void* p_ = nullptr;
};

/// `threads` workers (the calling thread is worker 0), each owning one static slice of [0, n),
/// released together for every pass so a pass's time is that of its slowest slice.
class Team {
 public:
  Team(int threads, std::size_t n)
      : n_(n), threads_(threads), start_(threads), done_(threads) {
    try {
      for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { loop(t); });
    } catch (...) {  // a thread could not start: release the ones that did, then report it
      for (auto k = workers_.size() + 1; k < static_cast<std::size_t>(threads); ++k) {
        start_.arrive_and_drop();
      }
      stop_ = true;
      start_.arrive_and_wait();
      for (std::thread& w : workers_) w.join();
      throw;
    }
  }
  ~Team() {
    stop_ = true;
    start_.arrive_and_wait();
    for (std::thread& w : workers_) w.join();
  }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  /// Run fn(begin, end) on every slice and return when all are done.
  template <typename Fn>
  void run(Fn fn) {
    body_ = [&fn](std::size_t b, std::size_t e) { fn(b, e); };
    start_.arrive_and_wait();
    slice(0);
    done_.arrive_and_wait();
  }

 private:
  void loop(int t) {
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) return;
      slice(t);
      done_.arrive_and_wait();
    }
  }
  void slice(int t) {
    const auto tt = static_cast<std::size_t>(t), nt = static_cast<std::size_t>(threads_);
    body_(n_ * tt / nt, n_ * (tt + 1) / nt);
  }

  std::size_t n_;
  int threads_;
  std::function<void(std::size_t, std::size_t)> body_;
  bool stop_ = false;  // written before start_'s phase completes, read after: no race
  std::barrier<> start_, done_;
  std::vector<std::thread> workers_;
};

double run_triad(int node, int threads, std::size_t array_bytes, double seconds, int min_reps) {
  try {
    bind_thread_to_node(node);  // the team's threads inherit this thread's affinity and policy
  } catch (const ght::logic_error&) {
    // A CPU-less node (or none): the arrays are still placed on it; threads stay unbound.
  }
  const std::size_t n = array_bytes / sizeof(double);
  const NodeArray a_mem(n * sizeof(double), node), b_mem(n * sizeof(double), node),
      c_mem(n * sizeof(double), node);
  double* const a = a_mem.data();
  double* const b = b_mem.data();
  double* const c = c_mem.data();
  Team team(threads, n);

  // First touch with the same slices as the timed loop, so each thread's pages sit where that
  // thread runs.
  team.run([&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      a[i] = 0.0;
      b[i] = 1.0 + static_cast<double>(i % 1021) * 1e-3;
      c[i] = 2.0 - static_cast<double>(i % 509) * 1e-3;
    }
  });

  const double s = 3.0;
  std::vector<double> bps;
  const auto t_start = std::chrono::steady_clock::now();
  for (int rep = -1;; ++rep) {  // rep -1 is the untimed warm-up
    const auto t0 = std::chrono::steady_clock::now();
    team.run([&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
    });
    const auto t1 = std::chrono::steady_clock::now();
    if (rep >= 0) {
      const double dt = std::chrono::duration<double>(t1 - t0).count();
      // STREAM convention: 3 streams (read b, read c, write a), no write-allocate traffic.
      bps.push_back(3.0 * static_cast<double>(n * sizeof(double)) / std::max(dt, 1e-9));
    }
    const double elapsed = std::chrono::duration<double>(t1 - t_start).count();
    if (rep + 1 >= min_reps && (elapsed >= seconds || rep + 1 >= 100)) break;
  }

  // A triad that computed nothing would report any speed; check a spread of elements.
  const std::size_t step = std::max<std::size_t>(1, n / 997);
  for (std::size_t i = 0; i < n; i += step) {
    const double want = b[i] + s * c[i];
    GHT_EXPECTS(std::fabs(a[i] - want) <= 1e-12 * std::fabs(want),
                "host triad: wrong result at element " + std::to_string(i));
  }
  std::sort(bps.begin(), bps.end());
  return bps[bps.size() / 2];
}

}  // namespace

double host_triad_bps(int node, int threads, std::size_t array_bytes, double seconds,
                      int min_reps) {
  GHT_EXPECTS(threads >= 1, "host triad: threads must be >= 1, got " + std::to_string(threads));
  GHT_EXPECTS(array_bytes >= 4096, "host triad: arrays must be >= 4096 bytes, got " +
                                       std::to_string(array_bytes));
  GHT_EXPECTS(min_reps >= 1, "host triad: min_reps must be >= 1");
  // A worker thread carries the NUMA binding, so the caller's affinity and memory policy are
  // left as they were.
  double result = 0;
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      result = run_triad(node, threads, array_bytes, seconds, min_reps);
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return result;
}

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

}  // namespace ght::tier::detail
