// GHT_FP8's sizes and time as the model allocates them and the plan counts them
// (trainer/fp8_experts.hpp), checked against the shapes written out by hand.
#include "trainer/fp8_experts.hpp"

#include <gtest/gtest.h>

#include <string>

#include "common/registry.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"

namespace ght::trainer {
namespace {

TEST(Fp8Experts, Seed21bSizesAreOneBytePerExpertWeightAndOneScalePerBlockOrTile) {
  const ModelConfig c = preset("seed-21b");  // d 4096, F 800, 64 experts, top-4, 30 layers, 4,096 tokens
  const Fp8ExpertSizes s = fp8_expert_sizes(c);
  EXPECT_EQ(s.weight_codes, 30ull * 64 * 3 * 4096 * 800);
  // gate/up (1600, 4096): 13 x 32 blocks; down (4096, 800): 32 x 7 blocks.
  EXPECT_EQ(fp8_gate_up_scales(c), 13u * 32);
  EXPECT_EQ(fp8_down_scales(c), 32u * 7);
  EXPECT_EQ(s.weight_scales, 30ull * 64 * (13 * 32 + 32 * 7) * 4);
  // 4,096 tokens x top-4 rows of the wider operand (d = 4096), 32 tiles of 128 per row.
  EXPECT_EQ(s.act_codes, 16384ull * 4096);
  EXPECT_EQ(s.act_scales, 16384ull * 32 * 4);
  EXPECT_EQ(s.total(), s.weight_codes + s.weight_scales + s.act_codes + s.act_scales);
  // Capacity for other micro-batches: rows scale with the tokens.
  EXPECT_EQ(fp8_expert_sizes(c, 8192).act_codes, 2 * s.act_codes);
}

TEST(Fp8Experts, SavedSecondsAreTheExpertForwardAtTheSpeedupLessOneWeightPass) {
  ModelConfig c = preset("bench-h200");
  c.grad_accum = 16;
  const double flops = 2.0 * 3 * 4096 * 800 * static_cast<double>(c.tokens_per_step()) * c.top_k * c.layers;
  EXPECT_DOUBLE_EQ(fp8_expert_forward_flops(c), flops);
  const Fp8ExpertSizes s = fp8_expert_sizes(c);
  const double quant = static_cast<double>(3 * s.weight_codes + s.weight_scales) / 4e12;
  EXPECT_NEAR(fp8_saved_seconds(c, 500, 2.0, 4e12), flops / 500e12 * 0.5 - quant, 1e-12);
  // No speed-up: the weights' pass is all there is, a loss.
  EXPECT_LT(fp8_saved_seconds(c, 500, 1.0, 4e12), 0.0);
}

TEST(Fp8Experts, TheReservationFollowsGhtFp8AndNeedsAGpu) {
  const config::Registry saved = config::cfg();
  const ModelConfig c = preset("bench-h200");
  tier::PlanOptions o;
  o.link = tier::builtin_profile("pcie5");
  o.assumed_tflops = 500;
  config::cfg() = test::registry_with({});
  add_fp8_reservation(o, c);
  EXPECT_EQ(o.fp8_hbm_bytes, 0u);
  EXPECT_EQ(o.fp8_saved_seconds, 0.0);
  config::cfg() = test::registry_with({"GHT_FP8=experts", "GHT_ASSUMED_FP8_GEMM=1.6"});
  add_fp8_reservation(o, c);
  EXPECT_EQ(o.fp8_hbm_bytes, fp8_expert_sizes(c).total());
  EXPECT_DOUBLE_EQ(o.fp8_saved_seconds, fp8_saved_seconds(c, 500, 1.6, o.link.hbm_bps));
  EXPECT_GT(o.fp8_saved_seconds, 0.0);
  tier::PlanOptions cpu;
  cpu.link = tier::builtin_profile("none");
  add_fp8_reservation(cpu, c);
  EXPECT_EQ(cpu.fp8_hbm_bytes, 0u);
  config::cfg() = saved;
  try {
    (void)test::registry_with({"GHT_FP8=fp16"});
    ADD_FAILURE() << "GHT_FP8=fp16 was accepted";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("GHT_FP8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ght::trainer
