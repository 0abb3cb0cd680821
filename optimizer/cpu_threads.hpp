#pragma once
/**
 * @file cpu_threads.hpp
 * @brief Pinned OpenMP teams for the host kernels (CPU AdamW, gradient accumulator, triad).
 *
 * Why pin: the seed's CPU gradient step wandered between 22% and 32% MFU from run to run because
 * its threads migrated. Every host kernel here runs on an OpenMP team whose thread `t` is pinned
 * to core `t` of the host NUMA node (tier::Topology::host_numa_node), work is split statically,
 * and the calling thread's own affinity is restored afterwards. OMP_PLACES/OMP_PROC_BIND are not
 * needed (libgomp ignores the proc_bind clause without a place list, so we set affinity ourselves
 * with sched_setaffinity, which works the same on x86-64 and aarch64).
 */
#include <omp.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace ght::optimizer {

/// The threads a host kernel uses: `requested` if > 0, else GHT_CPU_THREADS if > 0, else the
/// number of cores of the host NUMA node (at least 1).
[[nodiscard]] int resolve_cpu_threads(int requested = 0);

/// The cores (OS indices) teams are pinned to, in order: those of the host NUMA node allowed by
/// the process affinity mask; the process mask itself when topology discovery fails
/// (tier::team_cpus, the list the host triad pins to as well).
[[nodiscard]] const std::vector<int>& pinned_cpu_list();

namespace detail {
/// Pin the calling thread to pinned_cpu_list()[tid % size]; cheap when already pinned there.
void pin_team_thread(int tid);
/// Saves the calling thread's affinity mask on construction and restores it on destruction.
class AffinityGuard {
 public:
  AffinityGuard();
  ~AffinityGuard();
  AffinityGuard(const AffinityGuard&) = delete;
  AffinityGuard& operator=(const AffinityGuard&) = delete;

 private:
  std::vector<unsigned long> mask_;
  bool saved_ = false;
};
}  // namespace detail

/// Half-open element range [begin, end) of thread `tid` of `nthreads` over n elements. Cuts fall
/// on multiples of `align` elements so threads never share a cache line (align=16 fp32 = 64 B).
struct Range {
  std::size_t begin = 0, end = 0;
};
[[nodiscard]] inline Range thread_range(std::size_t n, int tid, int nthreads,
                                        std::size_t align = 16) {
  const std::size_t blocks = (n + align - 1) / align;
  const std::size_t per = blocks / static_cast<std::size_t>(nthreads);
  const std::size_t extra = blocks % static_cast<std::size_t>(nthreads);
  const std::size_t t = static_cast<std::size_t>(tid);
  const std::size_t b0 = t * per + (t < extra ? t : extra);
  const std::size_t b1 = b0 + per + (t < extra ? 1 : 0);
  Range r{b0 * align, b1 * align};
  if (r.begin > n) r.begin = n;
  if (r.end > n) r.end = n;
  return r;
}

/**
 * @brief Run fn(tid, nthreads) on a pinned OpenMP team of resolve_cpu_threads(threads) threads
 * (a team of one runs fn(0, 1) inline on the caller, unpinned).
 * @param threads requested team size (0 = default, see resolve_cpu_threads)
 * Exceptions must not escape fn (OpenMP regions cannot propagate them).
 */
template <typename Fn>
void parallel_pinned(int threads, Fn&& fn) {
  const int n = resolve_cpu_threads(threads);
  if (n == 1) {  // small work: no team, no affinity system calls (a few microseconds saved)
    fn(0, 1);
    return;
  }
  detail::AffinityGuard guard;  // the caller's thread is team member 0; give its mask back
#pragma omp parallel num_threads(n)
  {
    const int tid = omp_get_thread_num();
    detail::pin_team_thread(tid);
    fn(tid, omp_get_num_threads());
  }
}

/// Zero `bytes` at p with the pinned team (statically split on 64-byte lines): the first touch
/// places plain memory's pages on the host NUMA node, split as the kernels will access it.
void zero_host(void* p, std::size_t bytes, int threads = 0);

/// memcpy of `bytes` from src to dst (not overlapping) by the pinned team, split the same way.
void copy_host(void* dst, const void* src, std::size_t bytes, int threads = 0);

}  // namespace ght::optimizer
