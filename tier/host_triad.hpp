#pragma once
/**
 * @file host_triad.hpp
 * @brief The host-memory STREAM triad: the one measurement of host DRAM bandwidth that the link
 * probe (LinkNumbers::host_triad_bps) and the benchmarks (bench/optimizer) compare against.
 *
 * Measured the way STREAM measures, so that "x% of triad" means what it says:
 *  - fp32 arrays a, b, c, each first touched by the thread that later runs the kernel on that
 *    part (the same static split for the touch and the kernel), so every page sits on the node
 *    of the core that streams it;
 *  - threads pinned one per core of the NUMA node (or the caller's own pinned team, see
 *    HostTriadOptions::parallel);
 *  - one untimed warm-up pass, then timed passes; the best is the figure (STREAM reports the
 *    best), every pass is kept for spreads;
 *  - non-temporal (streaming) stores on x86-64. a = b + s·c writes a without reading it; a
 *    normal store first reads each line of a into the cache (write-allocate), so the memory
 *    moves 4 streams while STREAM counts 3. With non-temporal stores no write-allocate read
 *    happens and the 3 counted streams are the traffic. The old triad used normal stores and
 *    so read about 3/4 of the bandwidth, which is why a read-modify-write kernel (CPU AdamW,
 *    a += b, which pays no write-allocate: its lines are already read) could run at 134% of it.
 *    aarch64: plain stores (Neoverse cores such as Grace's switch to a write-streaming mode on
 *    full-line writes and skip most allocate reads themselves; STNP is only a hint); whether
 *    streaming stores were used is HostTriadResult::nontemporal. The loop is Google Highway's
 *    (tier/detail/triad_simd.cpp): the widest vectors the CPU runs, AVX2 or AVX-512 on x86-64.
 *  - transparent huge pages asked for with madvise(MADV_HUGEPAGE) before the first touch; how
 *    much the kernel granted is reported (/proc/self/smaps AnonHugePages), since with 4 KiB
 *    pages a 1 GiB array needs 262,144 TLB entries.
 * Bandwidth counts 3 streams: 3 · array_bytes per pass.
 *
 * Plain std::threads, not OpenMP: tier/ is part of the allocator library (libghtier_alloc),
 * which must not pull an OpenMP runtime into a process beside PyTorch's. The arrays are mapped
 * here rather than by alloc/'s map_host because tier/ sits below alloc/.
 */
#include <cstddef>
#include <functional>
#include <vector>

namespace ght::tier {

/// Runs body(tid, nthreads) once on each thread of a team and returns when all are done.
using TeamBody = std::function<void(int tid, int nthreads)>;
using ParallelFor = std::function<void(const TeamBody& body)>;

struct HostTriadOptions {
  int node = 0;               ///< NUMA node the arrays are placed on (mbind)
  int threads = 1;            ///< size of the triad's own team (ignored with `parallel`)
  /// Cores the own team's thread t is pinned to: cpus[t % size]. Empty: team_cpus(node).
  std::vector<int> cpus;
  std::size_t array_bytes = std::size_t{1} << 30;  ///< bytes per array (rounded down to 64 B)
  int min_reps = 3;           ///< timed passes at least (after one untimed warm-up)
  double seconds = 0;         ///< more passes while the timed ones took less than this (<= 100)
  bool huge_pages = true;     ///< madvise(MADV_HUGEPAGE) the arrays before the first touch
  /// An existing pinned team to run on (e.g. ght::optimizer::parallel_pinned), so that the triad
  /// and a kernel it is compared with use the same threads. Empty: the triad's own team.
  ParallelFor parallel;
  /// Called after each timed pass (0-based), outside its timing: a benchmark runs a pass of the
  /// kernel it compares with here, so both see the same machine even when it drifts.
  std::function<void(int pass)> after_pass;
};

struct HostTriadResult {
  double best_bps = 0;              ///< fastest pass, 3 streams counted
  double median_bps = 0;
  std::vector<double> pass_bps;     ///< every timed pass, in order
  int threads = 0;                  ///< team size that ran it
  std::size_t array_bytes = 0;      ///< bytes per array as run
  bool nontemporal = false;         ///< streaming stores used (x86-64)
  double huge_page_fraction = 0;    ///< share of the arrays' bytes backed by huge pages
};

/**
 * @brief Run the triad a = b + s·c and check its result.
 * @throws ght::logic_error on bad options or a wrong result (a triad that computed nothing would
 *         report any speed); ght::out_of_memory when the arrays cannot be allocated.
 */
[[nodiscard]] HostTriadResult measure_host_triad(const HostTriadOptions& options);

/// The cores pinned teams run on for memory on NUMA node `node`: the node's cores (OS index of
/// the first PU of each, hwloc order) that the process may run on; the process's allowed CPUs
/// when there are none (a CPU-less node such as GH200's HBM, a cpuset excluding the node, or no
/// usable topology). Never empty.
[[nodiscard]] std::vector<int> team_cpus(int node);

/// Ask for transparent huge pages on [p, p + bytes) (whole 2 MiB pages inside the range);
/// false when the kernel refused (THP disabled or unsupported). Call before the first touch.
bool advise_huge_pages(void* p, std::size_t bytes);

/// Bytes of [p, p + bytes) currently backed by transparent huge pages (0 when unknown).
[[nodiscard]] std::size_t huge_page_bytes(const void* p, std::size_t bytes);

}  // namespace ght::tier
