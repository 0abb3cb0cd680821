#pragma once
// Shared pieces of bench_optimizer: timing with median and spread, result rows against a
// roofline measured in the same run, the markdown table and the JSON report.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

/// Uninitialised page-aligned host array: the pinned team's first touch decides page placement.
template <typename T>
class HostArray {
 public:
  explicit HostArray(std::size_t n) : n_(n) {
    const std::size_t bytes = (std::max<std::size_t>(n, 1) * sizeof(T) + 4095) / 4096 * 4096;
    p_ = static_cast<T*>(std::aligned_alloc(4096, bytes));
    if (p_ == nullptr) throw std::bad_alloc();
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
};

struct Report {
  std::vector<Row> rows;
  nlohmann::json extra = nlohmann::json::object();  ///< measured ceilings, predictions, machine
  std::vector<std::string> notes;                   ///< printed before the table
};

/// Parse the command line; returns false (with rc set) when the program should exit now.
bool parse_args(int argc, char** argv, Args& args, int& rc);
/// Host memory triad a[i] = b[i] + s·c[i] on the pinned team, bytes/s counting 3 streams.
Stats host_triad(int threads, std::size_t elems, int runs, double* bps);
/// CPU rows: triad, adamw_cpu, accumulate (bf16 and fp32 sources).
void run_cpu(const Args& args, Report& report);
/// Attach torch ratios, print notes and the markdown table (last), write JSON.
int finish(const Args& args, Report& report);

std::string fmt(double x, int digits = 3);
std::string human_params(std::uint64_t n);

}  // namespace ght::bench
