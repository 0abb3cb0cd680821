// A model too large for host memory: the CPU backend says what did not fit, how many bytes were
// asked and how many are available, instead of a bare std::bad_alloc.
#include <gtest/gtest.h>

#include <string>

#include "common/expect.hpp"
#include "tier/error.hpp"
#include "trainer/model.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {
namespace {

TEST(HostFits, ThrowsWithWhatAskedAndAvailable) {
  const std::string msg = ght::test::error_of<ght::out_of_memory>(
      [] { check_host_fits("CPU model 'x': parameters and gradients", 3000, 1000); });
  EXPECT_CONTAINS(msg, "CPU model 'x'");
  EXPECT_CONTAINS(msg, "3000 bytes");
  EXPECT_CONTAINS(msg, "1000 bytes");
  EXPECT_NO_THROW(check_host_fits("y", 1000, 1000));
  EXPECT_NO_THROW(check_host_fits("unknown availability", 1ULL << 60, 0));
}

TEST(HostFits, AModelBeyondAnyMachineIsRefusedBeforeAllocating) {
  // 2^24 x 2^16 embedding = 2^40 parameters: 8 TiB of fp32 parameters and gradients.
  ModelConfig c = preset("tiny");
  c.name = "huge";
  c.vocab = 1 << 24;
  c.d_model = 1 << 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.layers = 1;
  c.experts = 2;
  c.top_k = 1;
  c.expert_ffn = 1;
  ASSERT_GT(host_available_bytes(), 0u) << "no /proc/meminfo on this machine";
  const std::string msg = ght::test::error_of<ght::out_of_memory>([&] { MoEModel<float> m(c); });
  EXPECT_CONTAINS(msg, "CPU model 'huge'");
  EXPECT_CONTAINS(msg, std::to_string(2 * c.total_params() * 4) + " bytes");
  EXPECT_CONTAINS(msg, "available");
}

}  // namespace
}  // namespace ght::trainer
