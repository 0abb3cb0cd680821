// Grouping of a traced step's GPU activities by op (see kernel_breakdown.hpp).
#include "trainer/cuda/kernel_breakdown.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace ght::trainer {

namespace {

using Interval = std::pair<std::uint64_t, std::uint64_t>;

// Length of the union of [first, second) intervals; sorts v.
std::uint64_t union_length(std::vector<Interval>& v) {
  std::sort(v.begin(), v.end());
  std::uint64_t total = 0, lo = 0, hi = 0;
  bool open = false;
  for (const auto& [s, e] : v) {
    if (open && s <= hi) {
      hi = std::max(hi, e);
      continue;
    }
    if (open) total += hi - lo;
    lo = s;
    hi = e;
    open = true;
  }
  if (open) total += hi - lo;
  return total;
}

double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string pct(double share) { return fmt("%.1f%%", 100 * share); }

// A markdown table cell: no pipes, at most `width` characters.
std::string cell(const std::string& s, std::size_t width = 90) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  if (out.size() > width) out = out.substr(0, width - 3) + "...";
  return out;
}

}  // namespace

KernelBreakdown make_kernel_breakdown(std::span<const GpuActivity> acts, const TraceWindow& window,
                                      const std::map<std::string, OpCost, std::less<>>& costs,
                                      std::size_t top_kernels) {
  std::uint64_t w0 = window.start_ns, w1 = window.end_ns;
  if (w1 <= w0 && !acts.empty()) {
    w0 = acts.front().start_ns;
    w1 = acts.front().end_ns;
    for (const auto& a : acts) {
      w0 = std::min(w0, a.start_ns);
      w1 = std::max(w1, a.end_ns);
    }
  }
  struct OpAcc {
    OpTime t;
    std::uint64_t gpu_ns = 0;
    std::vector<Interval> iv;
  };
  struct NameAcc {
    std::int64_t count = 0;
    std::uint64_t gpu_ns = 0;
    std::map<std::string, std::uint64_t> by_op;
  };
  std::map<std::string, OpAcc> by_op;
  std::map<std::string, NameAcc> by_name;
  std::vector<Interval> all;
  KernelBreakdown r;
  std::uint64_t gpu_ns = 0;
  for (const auto& a : acts) {
    const std::uint64_t s = std::max(a.start_ns, w0), e = std::min(a.end_ns, w1);
    if (e <= s) continue;  // outside the window (or empty)
    const std::string& op = a.op.empty() ? std::string(kNoOpLabel) : a.op;
    OpAcc& o = by_op[op];
    const bool kernel = a.kind == GpuActivity::Kind::kernel;
    (kernel ? o.t.kernels : o.t.copies) += 1;
    (kernel ? r.kernels : r.copies) += 1;
    o.gpu_ns += e - s;
    o.iv.emplace_back(s, e);
    all.emplace_back(s, e);
    gpu_ns += e - s;
    NameAcc& n = by_name[a.name];
    n.count += 1;
    n.gpu_ns += e - s;
    n.by_op[op] += e - s;
  }
  r.window_ms = w1 > w0 ? ms(w1 - w0) : 0;
  r.gpu_ms = ms(gpu_ns);
  r.busy_ms = ms(union_length(all));
  r.idle_ms = r.window_ms - r.busy_ms;
  r.dropped_records = window.dropped_records;

  for (auto& [op, o] : by_op) {
    OpTime t = o.t;
    t.op = op;
    t.gpu_ms = ms(o.gpu_ns);
    t.busy_ms = ms(union_length(o.iv));
    t.share_gpu = gpu_ns > 0 ? static_cast<double>(o.gpu_ns) / static_cast<double>(gpu_ns) : 0;
    t.share_window = r.window_ms > 0 ? t.busy_ms / r.window_ms : 0;
    if (const auto c = window.op_calls.find(op); c != window.op_calls.end()) t.calls = c->second;
    if (const auto c = costs.find(op); c != costs.end()) {
      t.flops = c->second.flops * static_cast<double>(t.calls);
      t.bytes = c->second.bytes * static_cast<double>(t.calls);
    }
    const double busy_s = t.busy_ms / 1e3;
    if (t.has_flops()) t.tflops = t.flops / busy_s / 1e12;
    if (t.has_bytes()) t.gbps = t.bytes / busy_s / 1e9;
    r.ops.push_back(std::move(t));
  }
  std::sort(r.ops.begin(), r.ops.end(), [](const OpTime& a, const OpTime& b) {
    return a.gpu_ms != b.gpu_ms ? a.gpu_ms > b.gpu_ms : a.op < b.op;
  });

  for (auto& [name, n] : by_name) {
    KernelTime k;
    k.name = name;
    k.count = n.count;
    k.gpu_ms = ms(n.gpu_ns);
    k.share_gpu = gpu_ns > 0 ? static_cast<double>(n.gpu_ns) / static_cast<double>(gpu_ns) : 0;
    k.top_op = std::max_element(n.by_op.begin(), n.by_op.end(), [](const auto& a, const auto& b) {
                 return a.second < b.second;
               })->first;
    r.top_kernels.push_back(std::move(k));
  }
  std::sort(r.top_kernels.begin(), r.top_kernels.end(), [](const KernelTime& a, const KernelTime& b) {
    return a.gpu_ms != b.gpu_ms ? a.gpu_ms > b.gpu_ms : a.name < b.name;
  });
  if (r.top_kernels.size() > top_kernels) r.top_kernels.resize(top_kernels);
  return r;
}

nlohmann::ordered_json KernelBreakdown::json() const {
  using J = nlohmann::ordered_json;
  J j;
  j["window_ms"] = window_ms;
  j["gpu_ms"] = gpu_ms;
  j["busy_ms"] = busy_ms;
  j["idle_ms"] = idle_ms;
  j["idle_share"] = window_ms > 0 ? idle_ms / window_ms : 0;
  j["kernels"] = kernels;
  j["copies"] = copies;
  j["dropped_records"] = dropped_records;
  j["roofline"] = {{"bf16_dense_datasheet_tflops", Roofline::bf16_dense_datasheet_flops / 1e12},
                   {"cublas_measured_tflops", Roofline::cublas_measured_flops / 1e12},
                   {"hbm_read_measured_tbps", Roofline::hbm_read_measured_bytes / 1e12},
                   {"source", Roofline::source}};
  j["definitions"] = {
      {"window_ms", "the traced step on the GPU clock: from its start (previous update finished) until its own "
                    "update finished"},
      {"gpu_ms", "sum of kernel, memcpy and memset durations (overlapping streams count twice)"},
      {"busy_ms", "length of the union of the activities' intervals (all streams together; per op: that op's)"},
      {"idle_ms", "window_ms - busy_ms: no kernel or copy running on any stream"},
      {"calls", "times the op was entered in the step (layers x micro-batches)"},
      {"share_gpu", "gpu_ms / total gpu_ms"},
      {"share_window", "busy_ms / window_ms"},
      {"flops, bytes", "cost per call (trainer/cuda/op_costs.cpp, kernels/cuda/README.md) x calls; null: no formula"},
      {"tflops, gbps", "flops or bytes / busy_ms"},
      {"of_datasheet, of_cublas, of_hbm", "tflops / datasheet bf16 peak, tflops / measured cuBLAS ceiling, "
                                          "gbps / measured HBM read bandwidth"}};
  J ops_j = J::array();
  for (const auto& o : ops) {
    J e = {{"op", o.op},           {"calls", o.calls},         {"kernels", o.kernels},
           {"copies", o.copies},   {"gpu_ms", o.gpu_ms},       {"busy_ms", o.busy_ms},
           {"share_gpu", o.share_gpu}, {"share_window", o.share_window}};
    e["flops"] = o.flops > 0 ? J(o.flops) : J(nullptr);
    e["bytes"] = o.bytes > 0 ? J(o.bytes) : J(nullptr);
    e["tflops"] = o.has_flops() ? J(o.tflops) : J(nullptr);
    e["of_datasheet"] = o.has_flops() ? J(o.tflops * 1e12 / Roofline::bf16_dense_datasheet_flops) : J(nullptr);
    e["of_cublas"] = o.has_flops() ? J(o.tflops * 1e12 / Roofline::cublas_measured_flops) : J(nullptr);
    e["gbps"] = o.has_bytes() ? J(o.gbps) : J(nullptr);
    e["of_hbm"] = o.has_bytes() ? J(o.gbps * 1e9 / Roofline::hbm_read_measured_bytes) : J(nullptr);
    ops_j.push_back(std::move(e));
  }
  j["ops"] = std::move(ops_j);
  J k_j = J::array();
  for (const auto& k : top_kernels) {
    k_j.push_back({{"name", k.name}, {"count", k.count}, {"gpu_ms", k.gpu_ms}, {"share_gpu", k.share_gpu},
                   {"top_op", k.top_op}});
  }
  j["top_kernels"] = std::move(k_j);
  return j;
}

std::string KernelBreakdown::markdown() const {
  const std::string dash = "–";
  std::string s = "Kernel time of one training step (CUPTI): window " + fmt("%.1f", window_ms) + " ms, GPU busy " +
                  fmt("%.1f", busy_ms) + " ms (" + pct(window_ms > 0 ? busy_ms / window_ms : 0) + "), idle " +
                  fmt("%.1f", idle_ms) + " ms (" + pct(window_ms > 0 ? idle_ms / window_ms : 0) + "); " +
                  fmt("%.1f", gpu_ms) + " ms summed over " + std::to_string(kernels) + " kernels and " +
                  std::to_string(copies) + " copies/memsets on all streams; " + std::to_string(dropped_records) +
                  " records dropped.\n\n";
  s += "| op | calls | kernels | GPU ms | share | busy ms | of window | TFLOP/s | of 989.4 | of 788 | GB/s | "
       "of 4.43 TB/s |\n";
  s += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& o : ops) {
    const bool f = o.has_flops(), b = o.has_bytes();
    s += "| " + cell(o.op) + " | " + std::to_string(o.calls) + " | " + std::to_string(o.kernels + o.copies) + " | " +
         fmt("%.2f", o.gpu_ms) + " | " + pct(o.share_gpu) + " | " + fmt("%.2f", o.busy_ms) + " | " +
         pct(o.share_window) + " | " + (f ? fmt("%.1f", o.tflops) : dash) + " | " +
         (f ? pct(o.tflops * 1e12 / Roofline::bf16_dense_datasheet_flops) : dash) + " | " +
         (f ? pct(o.tflops * 1e12 / Roofline::cublas_measured_flops) : dash) + " | " +
         (b ? fmt("%.0f", o.gbps) : dash) + " | " + (b ? pct(o.gbps * 1e9 / Roofline::hbm_read_measured_bytes) : dash) +
         " |\n";
  }
  s += "\nTop kernels by GPU time:\n\n| kernel | count | GPU ms | share | top op |\n"
       "| --- | ---: | ---: | ---: | --- |\n";
  for (const auto& k : top_kernels) {
    s += "| " + cell(k.name) + " | " + std::to_string(k.count) + " | " + fmt("%.2f", k.gpu_ms) + " | " +
         pct(k.share_gpu) + " | " + cell(k.top_op) + " |\n";
  }
  s += std::string("\nkernels: kernels + copies/memsets; share: of the summed GPU time; busy ms: union of the op's "
                   "intervals over all streams (TFLOP/s and GB/s use it); of window: busy / window. Ceilings: ") +
       Roofline::source + ".\n";
  return s;
}

}  // namespace ght::trainer
