// GHT_CUDA_GRAPHS (trainer/cuda/graph_choice.hpp): the registry's parsing, the run-level decision
// and the per-micro-batch predicate of which hooks act. No GPU: the GPU side is
// tests/trainer/cuda_graphs_train_test.cu.
#include "trainer/cuda/graph_choice.hpp"

#include <gtest/gtest.h>

#include <string>

#include "common/registry.hpp"
#include "tier/error.hpp"

namespace ght::trainer {
namespace {

using ght::test::registry_with;

TEST(CudaGraphsConfig, ParsesAutoOnOffAndDefaultsToAuto) {
  EXPECT_EQ(cuda_graphs_mode(registry_with({})), CudaGraphsMode::automatic);
  EXPECT_EQ(cuda_graphs_mode(registry_with({"GHT_CUDA_GRAPHS=on"})), CudaGraphsMode::on);
  EXPECT_EQ(cuda_graphs_mode(registry_with({"GHT_CUDA_GRAPHS=OFF"})), CudaGraphsMode::off);
  EXPECT_EQ(cuda_graphs_mode(registry_with({"GHT_CUDA_GRAPHS=auto"})), CudaGraphsMode::automatic);
  for (CudaGraphsMode m : {CudaGraphsMode::automatic, CudaGraphsMode::on, CudaGraphsMode::off}) {
    EXPECT_EQ(cuda_graphs_mode(registry_with({"GHT_CUDA_GRAPHS=" + std::string(to_string(m))})), m);
  }
}

TEST(CudaGraphsConfig, RejectsABadValueNamingTheVariable) {
  for (const char* bad : {"GHT_CUDA_GRAPHS=sometimes", "GHT_CUDA_GRAPHS=1", "GHT_CUDA_GRAPHS="}) {
    try {
      (void)registry_with({bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("GHT_CUDA_GRAPHS"), std::string::npos) << e.what();
    }
  }
}

CudaGraphRunFacts usable() {
  CudaGraphRunFacts f;
  f.expert_impl = "cutlass";
  f.grad_accum = 4;
  return f;
}

TEST(CudaGraphsChoice, OnWhereUsableInAutoAndOn) {
  for (CudaGraphsMode m : {CudaGraphsMode::automatic, CudaGraphsMode::on}) {
    const CudaGraphChoice c = choose_cuda_graphs(m, usable());
    EXPECT_TRUE(c.on) << to_string(m);
    EXPECT_TRUE(c.why_off.empty()) << c.why_off;
  }
  const CudaGraphChoice off = choose_cuda_graphs(CudaGraphsMode::off, usable());
  EXPECT_FALSE(off.on);
  EXPECT_EQ(off.why_off, "GHT_CUDA_GRAPHS=off");
}

TEST(CudaGraphsChoice, AutoTurnsOffWithTheReasonAndOnRefuses) {
  struct Case {
    CudaGraphRunFacts f;
    const char* reason_part;
  };
  CudaGraphRunFacts host_offsets = usable();
  host_offsets.expert_offsets_on_host = true;
  host_offsets.expert_impl = "cublaslt_streams";
  CudaGraphRunFacts streamed = usable();
  streamed.stream_grads = true;
  CudaGraphRunFacts one_micro = usable();
  one_micro.grad_accum = 1;
  for (const Case& c : {Case{host_offsets, "cublaslt_streams"}, Case{streamed, "streams the gradients"},
                        Case{one_micro, "grad_accum is 1"}}) {
    const CudaGraphChoice a = choose_cuda_graphs(CudaGraphsMode::automatic, c.f);
    EXPECT_FALSE(a.on);
    EXPECT_NE(a.why_off.find(c.reason_part), std::string::npos) << a.why_off;
    try {
      (void)choose_cuda_graphs(CudaGraphsMode::on, c.f);
      ADD_FAILURE() << "GHT_CUDA_GRAPHS=on accepted a run that cannot replay: " << c.reason_part;
    } catch (const config_error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("GHT_CUDA_GRAPHS=on"), std::string::npos) << w;
      EXPECT_NE(w.find(c.reason_part), std::string::npos) << w;
    }
    EXPECT_FALSE(choose_cuda_graphs(CudaGraphsMode::off, c.f).on);
  }
}

TEST(CudaGraphsHooks, OnlyTheMiddleMicroBatchesOfAPlainStepAreQuiet) {
  MicroBatchHooks h;
  h.grad_accum = 4;
  for (int m = 0; m < 4; ++m) {
    h.micro = m;
    EXPECT_EQ(hooks_busy_reason(h) == nullptr, m > 0) << "micro-batch " << m;
  }
  h.micro = 0;
  EXPECT_NE(std::string(hooks_busy_reason(h)).find("waits for the previous update"), std::string::npos);
}

TEST(CudaGraphsHooks, EachHookDutyMakesItsMicroBatchesBusy) {
  MicroBatchHooks base;
  base.grad_accum = 3;
  auto busy = [](MicroBatchHooks h, int m) {
    h.micro = m;
    return hooks_busy_reason(h) != nullptr;
  };
  MicroBatchHooks stream = base;
  stream.stream_grads = true;
  MicroBatchHooks tracing = base;
  tracing.tracing = true;
  MicroBatchHooks zero1 = base;
  zero1.zero1 = true;
  MicroBatchHooks spec = base;
  spec.speculate = true;
  for (int m = 0; m < 3; ++m) {
    EXPECT_TRUE(busy(stream, m)) << "stream, micro-batch " << m;
    EXPECT_TRUE(busy(tracing, m)) << "tracing, micro-batch " << m;
  }
  for (const MicroBatchHooks& h : {zero1, spec}) {
    EXPECT_TRUE(busy(h, 0));
    EXPECT_FALSE(busy(h, 1)) << "only the last micro-batch reduces or speculates";
    EXPECT_TRUE(busy(h, 2));
  }
}

}  // namespace
}  // namespace ght::trainer
