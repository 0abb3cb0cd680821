#include "bench_common.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "optimizer/cpu_threads.hpp"

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    rc = app.exit(e);
    return false;
  }
  return true;
}

Stats host_triad(int threads, std::size_t elems, int runs, double* bps) {
  HostArray<float> a(elems), b(elems), c(elems);
  float* pa = a.data();
  float* pb = b.data();
  float* pc = c.data();
  // First touch by the pinned team with the timed loop's split: pages sit where they are used.
  optimizer::parallel_pinned(threads, [&](int tid, int nt) {
    const optimizer::Range r = optimizer::thread_range(elems, tid, nt);
    for (std::size_t i = r.begin; i < r.end; ++i) {
      pa[i] = 0.0f;
      pb[i] = 1.0f + static_cast<float>(i % 1021) * 1e-3f;
      pc[i] = 2.0f - static_cast<float>(i % 509) * 1e-3f;
    }
  });
  const float s = 3.0f;
  const Stats st = time_runs(runs, [&] {
    optimizer::parallel_pinned(threads, [&](int tid, int nt) {
      const optimizer::Range r = optimizer::thread_range(elems, tid, nt);
#pragma omp simd
      for (std::size_t i = r.begin; i < r.end; ++i) pa[i] = pb[i] + s * pc[i];
    });
  });
  *bps = 3.0 * sizeof(float) * static_cast<double>(elems) / st.median;
  return st;
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
