// The per-call op cost table (trainer/cuda/op_costs.hpp): the GEMM formulas against the
// parameter count, the optimizer's bytes, and that it knows every op label of the CUDA model.
#include "trainer/cuda/op_costs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "trainer/model_config.hpp"

using namespace ght::trainer;

TEST(OpCosts, LinearLayersCostSixFlopsPerParameterPerToken) {
  // Forward (2) + backward data (2) + backward weights (2) per weight and token, for the fused
  // q/k/v and o projections and the three expert matrices of the top-k experts.
  ModelConfig mc = preset("small");
  mc.micro_batch = 3;
  mc.seq_len = 64;
  const auto t = op_cost_table(mc);
  const double N = mc.micro_batch * mc.seq_len, C = mc.d_model, D = mc.head_dim;
  const double qkv = (mc.heads + 2.0 * mc.kv_heads) * D * C, o = mc.heads * D * C;
  const double experts = mc.top_k * 3.0 * mc.expert_ffn * C;
  double sum = 0;
  for (const char* op : {"q/k/v projection", "q/k/v projection backward", "o_proj", "o_proj backward",
                         "expert gate_up grouped GEMM", "expert down_proj grouped GEMM",
                         "expert down_proj grouped GEMM (backward, data)",
                         "expert down_proj grouped GEMM (backward, weights)",
                         "expert gate_up grouped GEMM (backward, weights)",
                         "expert gate_up grouped GEMM (backward, data)"}) {
    ASSERT_TRUE(t.contains(op)) << op;
    sum += t.at(op).flops;
  }
  EXPECT_DOUBLE_EQ(sum, 6 * N * (qkv + o + experts));
  // Causal attention: 2·B·H·T²·D forward, 2.5× that backward.
  EXPECT_DOUBLE_EQ(t.at("attention forward").flops, 2.0 * mc.micro_batch * mc.heads * 64 * 64 * D);
  EXPECT_DOUBLE_EQ(t.at("attention backward").flops, 2.5 * t.at("attention forward").flops);
  // A dense GEMM's bytes: both operands once and the bf16 output; a weight gradient is
  // accumulated (read and written) at the gradient's width.
  EXPECT_DOUBLE_EQ(t.at("o_proj").bytes, 2 * (N * mc.heads * D + mc.heads * D * C) + 2 * N * C);
  const auto t2 = op_cost_table(mc, {.grad_bytes = 2, .optimizer_state_in_hbm = false});
  EXPECT_DOUBLE_EQ(t.at("o_proj backward").bytes - t2.at("o_proj backward").bytes, 2 * (4 - 2) * C * mc.heads * D);
  // A micro-batch that assigns its gradients (GradWrite::assign) does not read them.
  const auto t0 = op_cost_table(mc, {.grad_bytes = 4, .optimizer_state_in_hbm = false, .grad_read_share = 0});
  EXPECT_DOUBLE_EQ(t.at("o_proj backward").bytes - t0.at("o_proj backward").bytes, 4 * C * mc.heads * D);
  EXPECT_DOUBLE_EQ(t.at("expert gate_up grouped GEMM (backward, weights)").bytes -
                       t0.at("expert gate_up grouped GEMM (backward, weights)").bytes,
                   4.0 * mc.experts * 2 * mc.expert_ffn * C);
  EXPECT_DOUBLE_EQ(t.at("expert gate_up grouped GEMM (backward, weights)").flops,
                   t0.at("expert gate_up grouped GEMM (backward, weights)").flops);
}

TEST(OpCosts, OptimizerBytesOnlyWhenItsStateIsInHbm) {
  const ModelConfig mc = preset("tiny");
  const auto host = op_cost_table(mc, {.grad_bytes = 4, .optimizer_state_in_hbm = false});
  EXPECT_EQ(host.at(kOpUpdate).bytes, 0);
  const auto hbm = op_cost_table(mc, {.grad_bytes = 4, .optimizer_state_in_hbm = true});
  // fp32 gradient read; master, m, v read and written; bf16 weight written.
  EXPECT_DOUBLE_EQ(hbm.at(kOpUpdate).bytes, 30.0 * static_cast<double>(mc.total_params()));
  EXPECT_DOUBLE_EQ(hbm.at(kOpGradNorm).bytes, 4.0 * static_cast<double>(mc.total_params()));
}

TEST(OpCosts, TableKnowsEveryOpOfTheCudaModel) {
  // Every op("...") label in the CUDA model's sources (model_cuda*.cpp) has a row, so a renamed op
  // cannot silently lose its formula in the breakdown.
  const auto dir = std::filesystem::path(GHT_SOURCE_DIR) / "trainer/cuda";
  std::stringstream ss;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("model_cuda") || e.path().extension() != ".cpp") continue;
    std::ifstream f(e.path());
    ASSERT_TRUE(f) << e.path();
    ss << f.rdbuf() << "\n";
    ++files;
  }
  ASSERT_GT(files, 0) << "no model_cuda*.cpp in " << dir;
  const std::string src = ss.str();
  const auto t = op_cost_table(preset("tiny"));
  const std::regex call(R"(\bop\(\s*"([^"]+)\")");
  std::set<std::string> seen;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), call); it != std::sregex_iterator(); ++it) {
    seen.insert((*it)[1].str());
  }
  EXPECT_GT(seen.size(), 30u);
  for (const auto& op : seen) {
    EXPECT_TRUE(t.contains(op)) << "op \"" << op << "\" of the CUDA model is not in op_costs.cpp";
  }
}
