#include "bench_common.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "optimizer/cpu_threads.hpp"
#include "tier/topology.hpp"

namespace ght::bench {

Stats summarize(std::vector<double> samples) {
  Stats s;
  s.samples = samples;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.min = samples.front();
  s.max = samples.back();
  s.spread = s.median > 0 ? (s.max - s.min) / s.median : 0;
  return s;
}

std::string fmt(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string human_params(std::uint64_t n) {
  if (n % (1ull << 20) == 0 && n < (1ull << 30)) return std::to_string(n >> 20) + "Mi";
  if (n >= 1000000000ull && n % 1000000000ull == 0) return std::to_string(n / 1000000000ull) + "B";
  return std::to_string(n);
}

bool parse_args(int argc, char** argv, Args& args, int& rc) {
  CLI::App app{
      "bench_optimizer: AdamW paths and the CPU gradient accumulator, as a fraction of the link "
      "and host-memory rooflines measured in the same run"};
  app.add_option("--sizes", args.sizes, "parameter counts (default 268435456 2000000000)");
  app.add_option("--runs", args.runs, "timed runs per measurement (median and spread)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", args.threads, "host threads (0 = GHT_CPU_THREADS / NUMA-node cores)");
  app.add_option("--json", args.json, "write the full report as JSON to this path");
  app.add_option("--torch", args.torch, "torch_baseline.py JSON to compare with");
  app.add_flag("--skip-cpu", args.skip_cpu, "skip the host benchmarks");
  app.add_flag("--skip-gpu", args.skip_gpu, "skip the GPU benchmarks");
  app.add_option("--split-params", args.split_params,
                 "update split sweep over this many parameters (state on the host, fp32 gradients and bf16 "
                 "weights in HBM; 0 = off)");
  app.add_option("--split-regions", args.split_regions, "equal regions of the split sweep")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--region-params", args.region_params,
                 "device rows also in regions of this many parameters, one launch per region against batched "
                 "(GHT_OPT_BATCH); 0: off");
  app.add_option("--split-shares", args.split_shares,
                 "CPU shares to measure (default: 0, 1, the predicted best and +-0.05, +-0.1, +0.2 around it)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--split-only", args.split_only, "run the split sweep only (the triad and link rooflines still run)");
  app.add_option("--beside-params", args.beside_params,
                 "the gpu_link dma update of this many parameters alone and beside compute loads (0 = off)");
  app.add_flag("--beside-only", args.beside_only, "run the beside-compute rows only (the link rooflines still run)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    rc = app.exit(e);
    return false;
  }
  if (args.split_only || args.beside_only) args.sizes.clear();
  return true;
}

tier::HostTriadResult pinned_triad(int threads, std::size_t array_bytes, int runs,
                                   std::function<void(int)> after_pass) {
  tier::HostTriadOptions o;
  o.after_pass = std::move(after_pass);
  o.node = tier::topology().host_numa_node;
  o.array_bytes = array_bytes;
  o.min_reps = runs;
  o.parallel = [threads](const tier::TeamBody& body) {
    optimizer::parallel_pinned(threads, [&](int tid, int nt) { body(tid, nt); });
  };
  return tier::measure_host_triad(o);
}

AccumulateCase::AccumulateCase(std::size_t n, optimizer::GradType type, int threads)
    : n_(n), type_(type), threads_(threads), dst_(n), src_(n * optimizer::grad_type_size(type)) {
  (void)optimizer::place_accumulator(dst_.data(), n, threads);
  unsigned char* src = src_.data();
  optimizer::parallel_pinned(optimizer::accumulate_team_size(n, threads), [&](int tid, int nt) {
    const optimizer::Range r = optimizer::thread_range(n, tid, nt);
    for (std::size_t i = r.begin; i < r.end; ++i) {
      if (type_ == optimizer::GradType::bf16) {
        reinterpret_cast<std::uint16_t*>(src)[i] = optimizer::float_to_bf16_bits(source_value(i));
      } else {
        reinterpret_cast<float*>(src)[i] = source_value(i);
      }
    }
  });
}

void AccumulateCase::run() const {
  optimizer::accumulate(dst_.data(), src_.data(), type_, n_, optimizer::AccumulateMode::add,
                        threads_);
}

float AccumulateCase::source_value(std::size_t i) const {
  const float x = 1e-3f * static_cast<float>(i % 113);
  return type_ == optimizer::GradType::bf16
             ? optimizer::bf16_bits_to_float(optimizer::float_to_bf16_bits(x))
             : x;
}

void AccumulateCase::check(int passes) const {
  const std::size_t step = std::max<std::size_t>(1, n_ / 997);
  for (std::size_t i = 0; i < n_; i += step) {
    float want = 0.0f;
    for (int k = 0; k < passes; ++k) want = want + source_value(i);
    if (std::memcmp(&want, dst_.data() + i, sizeof want) != 0) {
      throw std::runtime_error("accumulate: wrong sum at element " + std::to_string(i));
    }
  }
}

double AccumulateCase::bytes_per_elem() const {
  return 8.0 + static_cast<double>(optimizer::grad_type_size(type_));
}

std::size_t AccumulateCase::huge_page_bytes() const {
  return tier::huge_page_bytes(dst_.data(), n_ * sizeof(float)) +
         tier::huge_page_bytes(src_.data(), n_ * optimizer::grad_type_size(type_));
}

Stats triad_pass_seconds(const tier::HostTriadResult& r) {
  std::vector<double> s;
  for (double bps : r.pass_bps) s.push_back(3.0 * static_cast<double>(r.array_bytes) / bps);
  return summarize(std::move(s));
}

namespace {

nlohmann::json stats_json(const Stats& s) {
  return {{"median_s", s.median}, {"min_s", s.min}, {"max_s", s.max}, {"spread", s.spread},
          {"samples_s", s.samples}};
}

void attach_torch(const Args& args, Report& report) {
  if (args.torch.empty()) return;
  std::ifstream in(args.torch);
  if (!in) {
    report.notes.push_back("could not open --torch " + args.torch + "; no torch ratios");
    return;
  }
  nlohmann::json t;
  try {
    in >> t;
  } catch (const std::exception& e) {
    report.notes.push_back("could not parse --torch " + args.torch + ": " + e.what());
    return;
  }
  for (Row& r : report.rows) {
    if (r.torch_key.empty() || !t.contains("results")) continue;
    for (const auto& x : t["results"]) {
      if (x.value("path", "") == r.torch_key && x.value("params", 0ull) == r.params) {
        r.torch_gparams = x.value("gparams_median", 0.0);
      }
    }
  }
}

}  // namespace

int finish(const Args& args, Report& report) {
  attach_torch(args, report);
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : report.rows) {
    nlohmann::json j{{"path", r.path},
                     {"params", r.params},
                     {"bytes_per_param", r.bytes_per_param},
                     {"gparams_median", r.gparams()},
                     {"roofline_gparams", r.roof_gparams},
                     {"fraction_of_roofline", r.fraction()},
                     {"roofline_basis", r.roof_basis},
                     {"seconds", stats_json(r.seconds)}};
    if (!r.torch_key.empty()) {
      j["torch_baseline"] = r.torch_key;
      if (r.torch_gparams > 0) {
        j["torch_gparams"] = r.torch_gparams;
        j["ratio_vs_torch"] = r.gparams() / r.torch_gparams;
      }
    }
    rows.push_back(j);
  }
  nlohmann::json out = report.extra;
  out["rows"] = rows;
  out["runs"] = args.runs;
  out["threads"] = optimizer::resolve_cpu_threads(args.threads);
  if (!args.json.empty()) {
    std::ofstream f(args.json);
    f << out.dump(2) << "\n";
    if (!f) {
      std::cerr << "bench_optimizer: cannot write " << args.json << "\n";
      return 1;
    }
  }
  std::cout << "\n";
  for (const std::string& n : report.notes) std::cout << "- " << n << "\n";
  std::cout << "\n| path | params | Gparam/s | spread | roofline Gparam/s | of roofline | roofline basis | vs torch |\n"
            << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Row& r : report.rows) {
    std::string vs = "-";
    if (r.torch_gparams > 0) vs = fmt(r.gparams() / r.torch_gparams, 2) + "x " + r.torch_key;
    std::cout << "| " << r.path << " | " << human_params(r.params) << " | " << fmt(r.gparams())
              << " | " << fmt(100 * r.seconds.spread, 1) << "% | " << fmt(r.roof_gparams) << " | "
              << fmt(100 * r.fraction(), 1) << "% | " << r.roof_basis << " | " << vs << " |\n";
  }
  return 0;
}

}  // namespace ght::bench
