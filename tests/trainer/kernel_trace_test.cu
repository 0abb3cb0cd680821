// The CUPTI kernel tracer (trainer/cuda/kernel_trace.hpp) on the GPU: one forward+backward of a
// small CUDA model traced op by op, and `--trace-kernels` in a CUDA training run. Skips without a
// GPU, and with the reason when this build or machine cannot trace (no CUPTI, profiling not
// permitted).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/registry.hpp"
#include "tier/error.hpp"
#include "trainer/cuda/kernel_breakdown.hpp"
#include "trainer/cuda/kernel_trace.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/cuda/op_costs.hpp"
#include "trainer/cuda/train_cuda.hpp"
#include "trainer/train_run_util.hpp"

namespace ght::trainer {
namespace {

using ght::test::TempDir;

// A tracer, or the reason there is none (the test then skips with it).
std::unique_ptr<KernelTracer> try_tracer(std::string& why) {
  if (!kernel_trace_built()) {
    why = "built without CUPTI";
    return nullptr;
  }
  try {
    return std::make_unique<KernelTracer>(alloc::make_default_tiered_allocator());
  } catch (const ght::cuda_error& e) {
    why = std::string("CUPTI unavailable: ") + e.what();
    return nullptr;
  }
}

ModelConfig small_config() {
  ModelConfig c = preset("small");  // d 256, 8 heads, 8 experts of 256, top-2, byte vocabulary
  c.layers = 2;
  c.seq_len = 64;
  c.micro_batch = 2;
  return c;
}

TEST(KernelTrace, AttributesEveryKernelOfAForwardBackwardToItsOp) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = small_config();
  CudaMoEModel model(c);
  model.init(7);
  const int n = c.micro_batch * c.seq_len;
  std::mt19937 gen(3);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  std::vector<std::int32_t> tokens(n), targets(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = tok(gen);
    targets[i] = tok(gen);
  }
  // Warm-up: cuBLAS plans, cuDNN graphs and activation buffers exist before the trace.
  (void)model.forward_backward(tokens.data(), targets.data(), c.micro_batch, c.seq_len, 1.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::string why;
  auto tracer = try_tracer(why);
  if (!tracer) GTEST_SKIP() << why;
  model.set_op_hook([&](const char* op, int) { tracer->set_op(op); });
  TraceWindow w;
  w.start_ns = KernelTracer::now_ns();
  (void)model.forward_backward(tokens.data(), targets.data(), c.micro_batch, c.seq_len, 1.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  w.end_ns = KernelTracer::now_ns();
  model.set_op_hook({});
  const std::vector<GpuActivity> acts = tracer->finish(w);
  tracer.reset();

  ASSERT_FALSE(acts.empty());
  double sum_ms = 0;
  int kernels = 0;
  for (const auto& a : acts) {
    EXPECT_FALSE(a.op.empty()) << a.name << " ran outside any op";
    EXPECT_GE(a.start_ns, w.start_ns) << a.name;
    EXPECT_LE(a.end_ns, w.end_ns) << a.name;
    sum_ms += static_cast<double>(a.end_ns - a.start_ns) / 1e6;
    kernels += a.kind == GpuActivity::Kind::kernel ? 1 : 0;
  }
  const KernelBreakdown b = make_kernel_breakdown(acts, w, op_cost_table(c));
  std::printf("%s\n", b.markdown().c_str());
  EXPECT_EQ(b.dropped_records, 0u);
  EXPECT_EQ(b.kernels, kernels);
  EXPECT_NEAR(b.gpu_ms, sum_ms, 1e-9 * sum_ms);
  double ops_ms = 0;
  for (const auto& o : b.ops) ops_ms += o.gpu_ms;
  EXPECT_NEAR(ops_ms, b.gpu_ms, 1e-9 * b.gpu_ms);
  EXPECT_LE(b.busy_ms, b.window_ms);
  for (const char* gemm : {"q/k/v projection", "o_proj", "expert gate_up grouped GEMM",
                           "expert down_proj grouped GEMM", "q/k/v projection backward",
                           "expert gate_up grouped GEMM (backward, weights)"}) {
    const auto it = std::find_if(b.ops.begin(), b.ops.end(), [&](const OpTime& o) { return o.op == gemm; });
    ASSERT_NE(it, b.ops.end()) << gemm << " has no GPU activity";
    EXPECT_GT(it->gpu_ms, 0.0) << gemm;
    EXPECT_GT(it->kernels, 0) << gemm;
    EXPECT_EQ(it->calls, c.layers) << gemm;
    EXPECT_GT(it->tflops, 0.0) << gemm;
  }
}

TEST(KernelTrace, TrainRunWritesTheBreakdownOfTheLastProfiledStep) {
  GHT_REQUIRE_GPU();
  {
    std::string why;
    if (!try_tracer(why)) GTEST_SKIP() << why;
  }
  // Exact plans only: a plan that delays the update would run step 3's update in step 4, outside
  // the traced step; the trace is checked on the plain schedule.
  const ght::test::ScopedFlag exact("GHT_PLAN_TOLERANCE", "exact");
  const TempDir tmp("ght_kernel_trace");
  test::write_random_corpus(tmp / "data");
  TrainConfig cfg = test::small_run_config(tmp / "data", tmp / "run");
  cfg.backend = "cuda";
  cfg.steps = 4;
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 3;
  run.trace_kernels = true;
  (void)train_cuda(cfg, run);

  std::ifstream pf(tmp / "run/profile.json");
  ASSERT_TRUE(pf.good());
  const auto pj = nlohmann::json::parse(pf);
  ASSERT_EQ(pj.at("steps").size(), 3u);
  EXPECT_FALSE(pj.at("steps")[1].contains("traced"));
  EXPECT_TRUE(pj.at("steps")[2].at("traced").get<bool>());
  // The medians leave out the warm-up step and the traced one: step 2 alone.
  EXPECT_DOUBLE_EQ(pj.at("median_excluding_first_step").at("wall_ms").get<double>(),
                   pj.at("steps")[1].at("wall_ms").get<double>());

  std::ifstream bf(tmp / "run/kernel_breakdown.json");
  ASSERT_TRUE(bf.good()) << "no kernel_breakdown.json";
  const auto bj = nlohmann::json::parse(bf);
  EXPECT_EQ(bj.at("step"), 3);
  EXPECT_EQ(bj.at("dropped_records"), 0);
  double share = 0;
  bool update = false;
  for (const auto& o : bj.at("ops")) {
    share += o.at("share_gpu").get<double>();
    EXPECT_NE(o.at("op"), kNoOpLabel) << "GPU work outside any op";
    update = update || o.at("op") == kOpUpdate;
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_TRUE(update) << "the optimizer update is not in the breakdown";
  std::ifstream mf(tmp / "run/kernel_breakdown.md");
  EXPECT_TRUE(mf.good()) << "no kernel_breakdown.md";
}

}  // namespace
}  // namespace ght::trainer
