// Host benchmarks: triad (the roofline), adamw_cpu and the gradient accumulator, all on the same
// pinned OpenMP team.
//
// Bytes per parameter the rooflines charge:
//   adamw_cpu       read grad 2 (bf16) + read master, m, v 12 + write master, m, v 12 + write w 2
//                   = 28 (tier::adamw_bytes_per_param(2)); with bf16 m and v 20, with q8 16.06
//                   (optimizer::state_bytes_per_param)
//   accumulate bf16 read dst 4 + read src 2 + write dst 4 = 10
//   accumulate fp32 read dst 4 + read src 4 + write dst 4 = 12
// Triad (tier/host_triad.hpp) counts its 3 streams like STREAM and uses non-temporal stores on
// x86-64, so it pays no read-for-ownership either: the rooflines are the best triad pass.
#include <exception>
#include <iostream>

#include "bench_common.hpp"
#include "optimizer/accumulate.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_simd.hpp"
#include "tier/cost_model.hpp"

namespace ght::bench {

namespace {
using optimizer::bf16;
using optimizer::GradType;
using optimizer::StateType;

constexpr std::size_t kTriadBytes = 1ull << 30;  // 3 × 1 GiB: far beyond any last-level cache

}  // namespace

void run_cpu(const Args& args, Report& report) {
  const int threads = optimizer::resolve_cpu_threads(args.threads);
  const tier::HostTriadResult tr = pinned_triad(threads, kTriadBytes, args.runs);
  const Stats triad = triad_pass_seconds(tr);
  const double triad_bps = tr.best_bps;
  std::cout << "host triad (" << tr.threads << " pinned threads): best " << fmt(triad_bps / 1e9, 1)
            << " GB/s, median " << fmt(tr.median_bps / 1e9, 1) << " GB/s, spread "
            << fmt(100 * triad.spread, 1) << "%, huge pages " << fmt(100 * tr.huge_page_fraction, 0)
            << "%" << (tr.nontemporal ? "" : ", plain stores") << "; Highway target "
            << optimizer::simd::active_target() << "\n";
  report.extra["host_triad"] = {{"bytes_per_s", triad_bps},
                                {"median_bytes_per_s", tr.median_bps},
                                {"threads", tr.threads},
                                {"array_bytes", tr.array_bytes},
                                {"spread", triad.spread},
                                {"nontemporal", tr.nontemporal},
                                {"huge_page_fraction", tr.huge_page_fraction},
                                {"cpus", optimizer::pinned_cpu_list()},
                                {"simd_target", optimizer::simd::active_target()}};
  const std::string tb = "triad " + fmt(triad_bps / 1e9, 1) + " GB/s";
  // A measured row against the triad roofline: into the report, and one line on stdout.
  auto add_row = [&](Row& r) {
    r.roof_gparams = triad_bps / r.bytes_per_param / 1e9;
    r.roof_basis = tb + " / " + fmt(r.bytes_per_param, 0) + " B";
    report.rows.push_back(r);
    std::cout << r.path << " " << human_params(r.params) << ": " << fmt(r.gparams()) << " Gparam/s ("
              << fmt(100 * r.fraction(), 1) << "% of triad)\n";
  };

  for (const std::uint64_t n : args.sizes) {
    // One row per state type (GHT_OPT_STATE): the same kernel on fp32, bf16 and q8 m and v.
    for (const StateType st : {StateType::fp32, StateType::bf16, StateType::q8}) {
      HostArray<float> p(n);
      HostArray<unsigned char> m(optimizer::state_bytes(st, n)), v(optimizer::state_bytes(st, n));
      HostArray<std::uint16_t> g(n), w(n);
      optimizer::parallel_pinned(threads, [&](int tid, int nt) {
        const optimizer::Range r = optimizer::thread_range(n, tid, nt);
        for (std::size_t i = r.begin; i < r.end; ++i) {
          p.data()[i] = 0.01f * static_cast<float>(static_cast<int>(i % 2001) - 1000);
          g.data()[i] = optimizer::float_to_bf16_bits(1e-3f * static_cast<float>(i % 97) - 0.05f);
        }
        // Zero bytes are m = v = 0 in fp32 and bf16, and a zero scale in q8: a first step.
        const optimizer::Range b = optimizer::thread_range(optimizer::state_bytes(st, n), tid, nt);
        std::fill(m.data() + b.begin, m.data() + b.end, 0);
        std::fill(v.data() + b.begin, v.data() + b.end, 0);
      });
      const optimizer::StepScalars k =
          optimizer::make_step_scalars(optimizer::AdamWHyper{}, 1e-4, 1, true, 1.0);
      optimizer::AdamWSpan span{p.data(), m.data(), v.data(), g.data(), GradType::bf16,
                                reinterpret_cast<bf16*>(w.data()), n};
      span.state = st;
      Row r;
      r.path = std::string("cpu adamw_cpu (bf16 grad, ") + optimizer::to_string(st) + " m, v)";
      r.torch_key = st == StateType::fp32 ? "torch_foreach_cpu" : "";
      r.params = n;
      r.bytes_per_param = tier::adamw_bytes_per_param(2, optimizer::state_bytes_per_param(st));
      r.seconds = time_runs(args.runs, [&] { optimizer::adamw_cpu(span, k, threads); });
      add_row(r);
    }
    for (const GradType t : {GradType::bf16, GradType::fp32}) {
      const AccumulateCase acc(n, t, threads);
      Row r;
      r.path = std::string("accumulate (") + (t == GradType::bf16 ? "bf16" : "fp32") + " src)";
      r.params = n;
      r.bytes_per_param = acc.bytes_per_elem();
      r.seconds = time_runs(args.runs, [&] { acc.run(); });
      acc.check(args.runs + 1);  // the warm-up pass added too
      add_row(r);
    }
  }
}

int bench_main(int argc, char** argv, const char* build,
               const std::function<void(const Args&, Report&)>& run_device) {
  Args args;
  int rc = 0;
  if (!parse_args(argc, argv, args, rc)) return rc;
  try {
    Report report;
    report.extra["build"] = build;
    if (!args.skip_cpu) run_cpu(args, report);
    run_device(args, report);
    return finish(args, report);
  } catch (const std::exception& e) {
    std::cerr << "bench_optimizer: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ght::bench
