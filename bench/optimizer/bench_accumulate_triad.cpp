// bench_accumulate_triad: is the CPU gradient accumulator as steady as host memory allows?
//
// In one process, on one pinned team (optimizer::parallel_pinned, the CPU AdamW's), with arrays of
// the same size (--bytes per array, default 1 GiB):
//   triad       a = b + s·c (tier/host_triad.hpp): 3 streams of `bytes`, non-temporal stores on
//               x86-64, so the 3 counted streams are the traffic
//   accumulate  dst += src (optimizer::accumulate) over n = bytes / 4 elements: read dst 4 + read
//               src 2 (bf16) or 4 (fp32) + write dst 4 bytes per element, no write-allocate read
//               since dst is read first; fp32 moves exactly the triad's 3 streams
// Each kernel: one untimed warm-up, then --runs timed passes (default 20), interleaved pass by
// pass (triad, then each accumulator). Prints every pass in
// GB/s, then per kernel median, min, max and spread = (max - min) / median of the pass GB/s,
// and the accumulator's median as a fraction of the best triad pass; table last, --json FILE.
// No FLOPs worth stating: 1 add (accumulate) or 1 multiply-add (triad) per element.
#include <CLI/CLI.hpp>

#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "optimizer/accumulate.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_simd.hpp"
#include "tier/config.hpp"

namespace {

using namespace ght::bench;
using ght::optimizer::GradType;

struct Series {
  std::string kernel;
  double bytes_per_pass = 0;
  std::vector<double> gbps;  ///< every timed pass, in order
  Stats stats;               ///< of gbps (not seconds)
  double huge_page_fraction = 0;
};

Series make_series(std::string kernel, double bytes_per_pass, const std::vector<double>& seconds,
                   double huge_fraction) {
  Series s{std::move(kernel), bytes_per_pass, {}, {}, huge_fraction};
  for (double t : seconds) s.gbps.push_back(bytes_per_pass / t / 1e9);
  s.stats = summarize(s.gbps);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 20, threads = 0;
  std::string bytes_text = "1GiB", json, grads = "both";
  CLI::App app{"bench_accumulate_triad: run-to-run spread of the CPU gradient accumulator next to "
               "the host triad, same pinned team, same array size"};
  app.add_option("--runs", runs, "timed passes per kernel (default 20)")->check(CLI::Range(1, 1000));
  app.add_option("--bytes", bytes_text, "bytes per array (default 1GiB; K/M/G suffixes)");
  app.add_option("--threads", threads, "host threads (0 = GHT_CPU_THREADS / NUMA-node cores)");
  app.add_option("--grad", grads, "accumulator source type: bf16, fp32 or both (default)")
      ->check(CLI::IsMember({"bf16", "fp32", "both"}));
  app.add_option("--json", json, "write the full results as JSON to this path");
  CLI11_PARSE(app, argc, argv);
  try {
    const std::uint64_t bytes = ght::config::parse_size("--bytes", bytes_text).bytes;
    const int team = ght::optimizer::resolve_cpu_threads(threads);
    const std::size_t n = bytes / sizeof(float);
    std::cout << "pinned team: " << team << " threads on cpus";
    for (int c : ght::optimizer::pinned_cpu_list()) std::cout << " " << c;
    std::cout << "; arrays of " << ght::config::format_bytes(bytes) << ", " << runs
              << " timed passes each after a warm-up; Highway target "
              << ght::optimizer::simd::active_target() << "\n";

    // Interleaved: after each timed triad pass, one timed pass of each accumulator, so that a
    // machine whose bandwidth drifts (other tenants) moves all series alike.
    std::vector<std::unique_ptr<AccumulateCase>> cases;
    std::vector<std::string> names;
    for (const GradType t : {GradType::bf16, GradType::fp32}) {
      const bool bf = t == GradType::bf16;
      if (grads != "both" && grads != (bf ? "bf16" : "fp32")) continue;
      cases.push_back(std::make_unique<AccumulateCase>(n, t, team));
      names.push_back(std::string("accumulate (") + (bf ? "bf16" : "fp32") + " src)");
    }
    for (const auto& c : cases) c->run();  // untimed warm-up, as the triad's
    std::vector<std::vector<double>> acc_seconds(cases.size());
    const ght::tier::HostTriadResult tr = pinned_triad(team, bytes, runs, [&](int) {
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        cases[k]->run();
        acc_seconds[k].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    });
    std::vector<Series> series;
    series.push_back(make_series(std::string("triad") + (tr.nontemporal ? "" : " (plain stores)"),
                                 3.0 * static_cast<double>(tr.array_bytes),
                                 triad_pass_seconds(tr).samples, tr.huge_page_fraction));
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const AccumulateCase& c = *cases[k];
      c.check(runs + 1);  // the warm-up pass added too
      const double arrays = static_cast<double>(n) * (c.bytes_per_elem() - 4.0);  // dst + src
      series.push_back(make_series(names[k], c.bytes_per_elem() * static_cast<double>(n),
                                   acc_seconds[k],
                                   static_cast<double>(c.huge_page_bytes()) / arrays));
    }

    const double best_triad = series.front().stats.max;
    std::cout << "\npass";
    for (const Series& s : series) std::cout << " | " << s.kernel << " GB/s";
    std::cout << "\n";
    for (int i = 0; i < runs; ++i) {
      std::cout << i + 1;
      for (const Series& s : series) std::cout << " | " << fmt(s.gbps[static_cast<std::size_t>(i)], 2);
      std::cout << "\n";
    }

    nlohmann::json out{{"runs", runs},
                       {"array_bytes", bytes},
                       {"threads", team},
                       {"cpus", ght::optimizer::pinned_cpu_list()},
                       {"best_triad_gbps", best_triad}};
    nlohmann::json js = nlohmann::json::array();
    for (const Series& s : series) {
      js.push_back({{"kernel", s.kernel},
                    {"bytes_per_pass", s.bytes_per_pass},
                    {"gbps", s.gbps},
                    {"median_gbps", s.stats.median},
                    {"min_gbps", s.stats.min},
                    {"max_gbps", s.stats.max},
                    {"spread", s.stats.spread},
                    {"median_of_best_triad", s.stats.median / best_triad},
                    {"huge_page_fraction", s.huge_page_fraction}});
    }
    out["series"] = js;
    if (!json.empty()) {
      std::ofstream f(json);
      f << out.dump(2) << "\n";
      if (!f) throw std::runtime_error("cannot write " + json);
    }

    std::cout << "\n| kernel | bytes/pass | median GB/s | min | max | spread | median / best triad | huge pages |\n"
              << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const Series& s : series) {
      std::cout << "| " << s.kernel << " | " << ght::config::format_bytes(static_cast<std::uint64_t>(s.bytes_per_pass))
                << " | " << fmt(s.stats.median, 2) << " | " << fmt(s.stats.min, 2) << " | "
                << fmt(s.stats.max, 2) << " | " << fmt(100 * s.stats.spread, 1) << "% | "
                << fmt(100 * s.stats.median / best_triad, 1) << "% | "
                << fmt(100 * s.huge_page_fraction, 0) << "% |\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_accumulate_triad: " << e.what() << "\n";
    return 1;
  }
}
