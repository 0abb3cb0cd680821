// GHT_INPUT_COPY (CudaModelOptions::input_copy): the tokens, targets and losses that go through
// the pinned, GPU-mapped ring with sm copies (kernels/cuda/sm_copy.hpp) are exactly those that go
// through the copy engines. Two models with the same weights train on the same micro-batches,
// more of them than the ring has slots and with a larger micro-batch midway (the ring is
// re-allocated), loss slots cycling as in the trainer; every loss and every gradient byte must
// be equal. Attention is the deterministic fallback kernel (cuDNN's backward accumulates dQ with
// atomics, so two runs of it differ in the last bits whatever the inputs' path).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/model.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {
namespace {

TEST(CudaInputCopy, SmCopiesGiveTheCopyEnginesBytes) {
  GHT_REQUIRE_GPU();
  ModelConfig c = preset("tiny");
  c.layers = 2;
  c.seq_len = 32;
  MoEModel<float> cpu(c);
  cpu.init(5);
  auto make = [&](CudaModelOptions::InputCopy how) {
    CudaModelOptions o;
    o.input_copy = how;
    o.attention_impl = kernels::cuda::AttentionImpl::fallback;
    auto m = std::make_unique<CudaMoEModel>(c, o);
    m->load_weights(cpu.params());
    m->zero_grad();
    return m;
  };
  auto sm = make(CudaModelOptions::InputCopy::sm);
  auto engine = make(CudaModelOptions::InputCopy::engine);
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  constexpr int kMicro = 20;  // > the ring's 8 slots
  std::vector<Loss> ls, le;
  for (int m = 0; m < kMicro; ++m) {
    const int B = m < 10 ? 1 : 2;  // the ring grows at micro-batch 10
    std::vector<std::int32_t> t(static_cast<std::size_t>(B) * c.seq_len), y(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = tok(gen);
      y[i] = i % 7 == 3 ? kIgnoreIndex : tok(gen);
    }
    // Queued without waiting (the host runs ahead, so ring slots are reused while the GPU still
    // works on earlier micro-batches); each micro-batch keeps its own loss slot.
    sm->forward_backward_async(t.data(), y.data(), B, c.seq_len, 1.0f / kMicro, m);
    engine->forward_backward_async(t.data(), y.data(), B, c.seq_len, 1.0f / kMicro, m);
    std::fill(t.begin(), t.end(), 0);  // the caller may reuse its buffers at once
  }
  for (int m = 0; m < kMicro; ++m) {
    ls.push_back(sm->collect_loss(m));
    le.push_back(engine->collect_loss(m));
  }
  for (int m = 0; m < kMicro; ++m) {
    const auto i = static_cast<std::size_t>(m);
    EXPECT_EQ(std::memcmp(&ls[i].ce, &le[i].ce, sizeof(double)), 0) << "micro-batch " << m << ": " << ls[i].ce
                                                                     << " vs " << le[i].ce;
    EXPECT_EQ(std::memcmp(&ls[i].total, &le[i].total, sizeof(double)), 0) << "micro-batch " << m;
    EXPECT_EQ(ls[i].tokens, le[i].tokens) << "micro-batch " << m;
    EXPECT_GT(ls[i].tokens, 0);
  }
  std::vector<float> gs(sm->num_params()), ge(engine->num_params());
  sm->store_grads(gs);
  engine->store_grads(ge);
  ASSERT_EQ(gs.size(), ge.size());
  std::size_t diff = 0, nonzero = 0;
  for (std::size_t i = 0; i < gs.size(); ++i) {
    diff += std::memcmp(&gs[i], &ge[i], sizeof(float)) != 0 ? 1 : 0;
    nonzero += gs[i] != 0.0f ? 1 : 0;
  }
  EXPECT_EQ(diff, 0u) << "of " << gs.size() << " gradients";
  EXPECT_GT(nonzero, gs.size() / 2);  // the comparison is not of zeros
}

}  // namespace
}  // namespace ght::trainer
