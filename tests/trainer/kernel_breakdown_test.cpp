// The kernel-time breakdown (trainer/cuda/kernel_breakdown.hpp) on synthetic activities: no GPU
// needed. Times are whole microseconds so every expected value is exact.
#include "trainer/cuda/kernel_breakdown.hpp"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/cuda/op_costs.hpp"

using namespace ght::trainer;

namespace {

constexpr std::uint64_t kUs = 1000;  // ns
constexpr std::uint64_t kMs = 1000 * kUs;

GpuActivity act(std::string op, std::string name, std::uint32_t stream, std::uint64_t start, std::uint64_t end,
                GpuActivity::Kind kind = GpuActivity::Kind::kernel) {
  GpuActivity a;
  a.kind = kind;
  a.op = std::move(op);
  a.name = std::move(name);
  a.stream = stream;
  a.start_ns = start;
  a.end_ns = end;
  return a;
}

const OpTime& find_op(const KernelBreakdown& b, const std::string& op) {
  for (const auto& o : b.ops) {
    if (o.op == op) return o;
  }
  throw std::runtime_error("no op " + op);
}

}  // namespace

TEST(KernelBreakdown, SharesSumToOneAndOpsSortByTime) {
  const std::vector<GpuActivity> acts = {
      act("a", "k1", 7, 0, 300 * kUs),
      act("b", "k2", 7, 300 * kUs, 400 * kUs),
      act("a", "k1", 8, 100 * kUs, 250 * kUs),
      act("c", "memcpy HtoD", 7, 500 * kUs, 530 * kUs, GpuActivity::Kind::memcpy),
      act("b", "k3", 9, 600 * kUs, 1000 * kUs),
      act("c", "memset", 7, 530 * kUs, 531 * kUs, GpuActivity::Kind::memset)};
  TraceWindow w;
  w.start_ns = 0;
  w.end_ns = 2 * kMs;
  const KernelBreakdown b = make_kernel_breakdown(acts, w, {});
  ASSERT_EQ(b.ops.size(), 3u);
  double share = 0;
  for (const auto& o : b.ops) share += o.share_gpu;
  EXPECT_NEAR(share, 1.0, 1e-12);
  // b: 100 + 400 us; a: 300 + 150 us; c: 31 us.
  EXPECT_EQ(b.ops[0].op, "b");
  EXPECT_EQ(b.ops[1].op, "a");
  EXPECT_EQ(b.ops[2].op, "c");
  EXPECT_DOUBLE_EQ(b.ops[0].gpu_ms, 0.5);
  EXPECT_DOUBLE_EQ(b.ops[1].gpu_ms, 0.45);
  EXPECT_DOUBLE_EQ(b.ops[1].busy_ms, 0.3);  // the second stream's kernel lies inside the first's
  EXPECT_EQ(b.ops[1].kernels, 2);
  EXPECT_EQ(b.ops[2].kernels, 0);
  EXPECT_EQ(b.ops[2].copies, 2);
  EXPECT_EQ(b.kernels, 4);
  EXPECT_EQ(b.copies, 2);
  EXPECT_DOUBLE_EQ(b.gpu_ms, 0.981);
  EXPECT_DOUBLE_EQ(b.ops[1].share_window, 0.3 / 2.0);
}

TEST(KernelBreakdown, IdleIsWindowMinusTheUnionOverAllStreams) {
  // Stream 1 [1, 4] ms and stream 2 [2, 5] ms overlap; [7, 8] alone; [9.5, 10.5] is cut at the
  // window's end; [11, 12] lies outside it. Busy: 4 + 1 + 0.5 ms of the 10 ms window.
  const std::vector<GpuActivity> acts = {
      act("x", "k", 1, 1 * kMs, 4 * kMs), act("y", "k", 2, 2 * kMs, 5 * kMs), act("x", "k", 1, 7 * kMs, 8 * kMs),
      act("y", "k", 2, 9500 * kUs, 10500 * kUs), act("x", "k", 1, 11 * kMs, 12 * kMs)};
  TraceWindow w;
  w.start_ns = 0;
  w.end_ns = 10 * kMs;
  const KernelBreakdown b = make_kernel_breakdown(acts, w, {});
  EXPECT_DOUBLE_EQ(b.window_ms, 10.0);
  EXPECT_DOUBLE_EQ(b.busy_ms, 5.5);
  EXPECT_DOUBLE_EQ(b.idle_ms, 4.5);
  EXPECT_DOUBLE_EQ(b.gpu_ms, 3 + 3 + 1 + 0.5);  // overlap counted on both streams
  EXPECT_EQ(b.kernels, 4);                      // the one outside the window is not counted
  EXPECT_DOUBLE_EQ(find_op(b, "y").gpu_ms, 3.5);
  EXPECT_DOUBLE_EQ(b.json()["idle_share"].get<double>(), 0.45);
}

TEST(KernelBreakdown, EmptyWindowSpansTheActivities) {
  const std::vector<GpuActivity> acts = {act("x", "k", 1, 3 * kMs, 4 * kMs), act("x", "k", 1, 6 * kMs, 7 * kMs)};
  const KernelBreakdown b = make_kernel_breakdown(acts, TraceWindow{}, {});
  EXPECT_DOUBLE_EQ(b.window_ms, 4.0);
  EXPECT_DOUBLE_EQ(b.idle_ms, 2.0);
}

TEST(KernelBreakdown, PerOpRatesUseBusyTimeAndCallCount) {
  // Two calls of 1 TFLOP and 4 GB each on two overlapping streams: busy 2 ms, summed 3 ms.
  const std::vector<GpuActivity> acts = {act("gemm", "nvjet", 1, 0, 2 * kMs), act("gemm", "nvjet", 2, 1 * kMs, 2 * kMs),
                                         act("copy", "memcpy DtoH", 1, 2 * kMs, 3 * kMs, GpuActivity::Kind::memcpy),
                                         act("", "stray", 3, 3 * kMs, 4 * kMs)};
  TraceWindow w;
  w.start_ns = 0;
  w.end_ns = 4 * kMs;
  w.op_calls = {{"gemm", 2}, {"copy", 1}};
  std::map<std::string, OpCost, std::less<>> costs = {{"gemm", {1e12, 4e9}}, {"copy", {0, 0}}};
  const KernelBreakdown b = make_kernel_breakdown(acts, w, costs);
  const OpTime g = find_op(b, "gemm");
  EXPECT_EQ(g.calls, 2);
  EXPECT_DOUBLE_EQ(g.busy_ms, 2.0);
  EXPECT_DOUBLE_EQ(g.gpu_ms, 3.0);
  EXPECT_DOUBLE_EQ(g.flops, 2e12);
  EXPECT_DOUBLE_EQ(g.bytes, 8e9);
  EXPECT_DOUBLE_EQ(g.tflops, 1000.0);  // 2e12 FLOP / 2 ms
  EXPECT_DOUBLE_EQ(g.gbps, 4000.0);    // 8e9 B / 2 ms
  const OpTime c = find_op(b, "copy");
  EXPECT_FALSE(c.has_flops());
  EXPECT_FALSE(c.has_bytes());
  // Work launched outside any op keeps its own row, with no calls and no formula.
  const OpTime stray = find_op(b, kNoOpLabel);
  EXPECT_EQ(stray.calls, 0);
  EXPECT_DOUBLE_EQ(stray.gpu_ms, 1.0);

  const auto j = b.json();
  ASSERT_EQ(j["ops"][0]["op"], "gemm");
  EXPECT_DOUBLE_EQ(j["ops"][0]["of_datasheet"].get<double>(), 1000e12 / Roofline::bf16_dense_datasheet_flops);
  EXPECT_DOUBLE_EQ(j["ops"][0]["of_cublas"].get<double>(), 1000e12 / Roofline::cublas_measured_flops);
  EXPECT_DOUBLE_EQ(j["ops"][0]["of_hbm"].get<double>(), 4000e9 / Roofline::hbm_read_measured_bytes);
  for (const auto& o : j["ops"]) {
    if (o["op"] != "gemm") {
      EXPECT_TRUE(o["tflops"].is_null()) << o.dump();
      EXPECT_TRUE(o["gbps"].is_null()) << o.dump();
    }
  }
  // The markdown table: the GEMM's rates, dashes where there is no formula.
  const std::string md = b.markdown();
  EXPECT_NE(md.find("| gemm | 2 | 2 | 3.00 | 60.0% | 2.00 | 50.0% | 1000.0 | 101.1% | 126.9% | 4000 | 90.3% |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| copy | 1 | 1 | 1.00 | 20.0% | 1.00 | 25.0% | – | – | – | – | – |"), std::string::npos)
      << md;
}

TEST(KernelBreakdown, TopKernelsByTimeWithTheirMainOp) {
  std::vector<GpuActivity> acts;
  for (int i = 0; i < 5; ++i) acts.push_back(act("attn", "flash|kernel", 1, i * kMs, i * kMs + 500 * kUs));
  acts.push_back(act("mlp", "flash|kernel", 1, 6 * kMs, 6 * kMs + 100 * kUs));
  acts.push_back(act("mlp", "gemm_kernel", 1, 7 * kMs, 8 * kMs));
  acts.push_back(act("mlp", "tiny", 1, 9 * kMs, 9 * kMs + kUs));
  const KernelBreakdown b = make_kernel_breakdown(acts, TraceWindow{}, {}, 2);
  ASSERT_EQ(b.top_kernels.size(), 2u);
  EXPECT_EQ(b.top_kernels[0].name, "flash|kernel");
  EXPECT_EQ(b.top_kernels[0].count, 6);
  EXPECT_DOUBLE_EQ(b.top_kernels[0].gpu_ms, 2.6);
  EXPECT_EQ(b.top_kernels[0].top_op, "attn");
  EXPECT_EQ(b.top_kernels[1].name, "gemm_kernel");
  EXPECT_NE(b.markdown().find("flash\\|kernel"), std::string::npos);  // a pipe cannot break the table
}
