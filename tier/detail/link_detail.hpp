#pragma once
/**
 * @file link_detail.hpp
 * @brief Internals of the link model shared by link.cpp, host_triad.cpp and probe.cu, and the
 * hooks the tests use to check the probe against their own measurements.
 */
#include <cstddef>
#include <string>

#include "tier/link.hpp"
#include "tier/topology.hpp"

namespace ght::tier::detail {

/// What one probe run measured and how.
struct ProbeReport {
  LinkNumbers numbers;          ///< source "probe", name "measured"
  std::size_t copy_bytes = 0;   ///< bytes per memcpy and per zero-copy kernel pass
  std::size_t triad_bytes = 0;  ///< bytes per triad array
  int triad_threads = 0;
  int reps_min = 0;             ///< fewest timed repetitions of any measurement
  double seconds = 0;           ///< wall time of the whole probe
};

/// Triad array size for this machine: well above the last-level cache, capped by host memory.
[[nodiscard]] std::size_t triad_array_bytes(const Topology& topo);

/// Threads for host kernels: GHT_CPU_THREADS, else the cores of the host NUMA node.
[[nodiscard]] int host_threads(const Topology& topo);

#ifdef GHT_HAVE_CUDA
/// Measure every LinkNumbers field on the selected GPU within `budget_seconds` (probe.cu).
/// @throws ght::logic_error without a GPU; ght::cuda_error on a CUDA failure.
[[nodiscard]] ProbeReport run_probe(double budget_seconds);
#endif

/// Write `text` to `path` atomically (temp file in the same directory, fsync, rename), creating
/// the directory. @throws ght::io_error naming the path.
void write_file_atomically(const std::string& path, const std::string& text);

/// JSON of a probe cache: the numbers plus a "meta" object naming the GPU, driver and host.
[[nodiscard]] std::string probe_cache_json(const ProbeReport& report, const Topology& topo);

/// Directory of the probe cache: GHT_CACHE_DIR, else $XDG_CACHE_HOME/ghtier, else
/// ~/.cache/ghtier.
[[nodiscard]] std::string cache_dir();

}  // namespace ght::tier::detail
