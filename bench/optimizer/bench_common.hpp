#pragma once
// Shared pieces of bench_optimizer: timing with median and spread, result rows against a
// roofline measured in the same run, the markdown table and the JSON report.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optimizer/accumulate.hpp"
#include "tier/host_triad.hpp"

namespace ght::bench {

/// Seconds of each timed run and their summary; spread = (max - min) / median.
struct Stats {
  std::vector<double> samples;
  double median = 0, min = 0, max = 0, spread = 0;
};
Stats summarize(std::vector<double> samples);

/// One untimed warm-up call, then `runs` timed calls of f().
template <typename F>
Stats time_runs(int runs, F&& f) {
  f();
  std::vector<double> s;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return summarize(std::move(s));
}

/// Uninitialised host array, 2 MiB aligned with transparent huge pages asked for: the pinned
/// team's first touch decides page placement (as for the triad's arrays).
template <typename T>
class HostArray {
 public:
  explicit HostArray(std::size_t n) : n_(n) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = (std::max<std::size_t>(n, 1) * sizeof(T) + kHuge - 1) / kHuge * kHuge;
    p_ = static_cast<T*>(std::aligned_alloc(kHuge, bytes));
    if (p_ == nullptr) throw std::bad_alloc();
    (void)tier::advise_huge_pages(p_, bytes);
  }
  ~HostArray() { std::free(p_); }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  [[nodiscard]] T* data() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

/// One accumulator pass as the trainer's host path runs it: dst (fp32, placed by
/// place_accumulator) += src (bf16 or fp32, first touched with accumulate()'s split), on the
/// pinned team of `threads`. Bytes per element: read dst 4 + read src 2|4 + write dst 4.
class AccumulateCase {
 public:
  AccumulateCase(std::size_t n, optimizer::GradType type, int threads);
  void run() const;
  [[nodiscard]] double bytes_per_elem() const;
  [[nodiscard]] std::size_t huge_page_bytes() const;  ///< of dst and src together
  /// Check dst[i] against a scalar sum of `passes` additions of src[i] onto zero, bit for bit
  /// at a spread of elements, so a kernel that computed nothing cannot report a speed.
  /// @throws std::runtime_error naming the first wrong element
  void check(int passes) const;

 private:
  [[nodiscard]] float source_value(std::size_t i) const;  ///< src[i] as accumulate widens it
  std::size_t n_;
  optimizer::GradType type_;
  int threads_;
  HostArray<float> dst_;
  HostArray<unsigned char> src_;
};

/// A throughput result: `params` parameters per call, against a roofline in Gparam/s.
struct Row {
  std::string path;              ///< e.g. "gpu_link update"
  std::string torch_key;         ///< torch baseline to compare with ("" = none)
  std::uint64_t params = 0;
  double bytes_per_param = 0;    ///< bytes the roofline charges per parameter
  Stats seconds;
  double roof_gparams = 0;       ///< roofline in Gparam/s
  std::string roof_basis;        ///< e.g. "triad 101.2 GB/s / 28 B"
  double torch_gparams = 0;      ///< filled from --torch (0 = not available)

  [[nodiscard]] double gparams() const {
    return seconds.median > 0 ? static_cast<double>(params) / seconds.median / 1e9 : 0;
  }
  [[nodiscard]] double fraction() const {
    return roof_gparams > 0 ? gparams() / roof_gparams : 0;
  }
};

struct Args {
  std::vector<std::uint64_t> sizes{256ull << 20, 2000000000ull};
  int runs = 10;
  int threads = 0;      ///< host team; 0 = GHT_CPU_THREADS / cores of the host NUMA node
  std::string json;     ///< write the full report here
  std::string torch;    ///< torch_baseline.py JSON to compare with
  bool skip_cpu = false;
  bool skip_gpu = false;
  /// The update split sweep (GHT_OPTIMIZER=split at several CPU shares): parameters (0 = off),
  /// split into this many equal regions; shares to measure (empty: 0, 1, the predicted best and
  /// around it); --split-only skips the per-size rows (the triad and the link still run).
  std::uint64_t split_params = 0;
  int split_regions = 512;
  std::uint64_t region_params = 2097152;  ///< device rows in regions of this many parameters too (0: off)
  std::vector<double> split_shares;
  bool split_only = false;
  /// The gpu_link dma update of this many parameters alone and beside compute loads on another
  /// stream (persistent GEMMs on every SM or on fewer, short GEMMs, an HBM stream); 0 = off;
  /// --beside-only skips the per-size rows.
  std::uint64_t beside_params = 0;
  bool beside_only = false;
};

struct Report {
  std::vector<Row> rows;
  nlohmann::json extra = nlohmann::json::object();  ///< measured ceilings, predictions, machine
  std::vector<std::string> notes;                   ///< printed before the table
};

/// Parse the command line; returns false (with rc set) when the program should exit now.
bool parse_args(int argc, char** argv, Args& args, int& rc);
/// The host triad (tier/host_triad.hpp) on the pinned team the host kernels use
/// (optimizer::parallel_pinned with `threads`), `runs` timed passes after a warm-up;
/// `after_pass` runs after each timed pass, untimed (HostTriadOptions::after_pass).
tier::HostTriadResult pinned_triad(int threads, std::size_t array_bytes, int runs,
                                   std::function<void(int)> after_pass = {});
/// Seconds of each pass of a triad result, summarised (for spreads next to other kernels).
Stats triad_pass_seconds(const tier::HostTriadResult& r);
/// CPU rows: triad, adamw_cpu, accumulate (bf16 and fp32 sources).
void run_cpu(const Args& args, Report& report);
/// Attach torch ratios, print notes and the markdown table (last), write JSON.
int finish(const Args& args, Report& report);
/// main of both builds: the arguments, the CPU rows unless --skip-cpu, then `run_device` (the
/// accelerator's rows, or a note why there are none), then finish(); an error is printed and
/// returns 1. `build` goes in the JSON ("cuda", "cpu-only").
int bench_main(int argc, char** argv, const char* build,
               const std::function<void(const Args&, Report&)>& run_device);

std::string fmt(double x, int digits = 3);
std::string human_params(std::uint64_t n);

}  // namespace ght::bench
