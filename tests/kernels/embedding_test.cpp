// Embedding lookup and its accumulating backward (repeated ids), against FD in double.
#include "kernels/cpu/embedding.hpp"

#include <gtest/gtest.h>

#include "kernels/fd_check.hpp"
#include "tier/error.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

TEST(Embedding, ForwardGathersRows) {
  const int V = 11, C = 37;
  const std::vector<std::int32_t> tok = {3, 0, 10, 3, 7};
  auto w = randn<float>(V * C, 1);
  std::vector<float> out(tok.size() * C);
  cpu::embedding_forward(out.data(), tok.data(), w.data(), tok.size(), C, V);
  for (std::size_t i = 0; i < tok.size(); ++i)
    for (int c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], w[tok[i] * C + c]);
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int V = 9, C = 20;
  const std::vector<std::int32_t> tok = {1, 4, 1, 8, 0, 1, 4};  // repeated ids accumulate
  auto w = randn<double>(V * C, 2), g = randn<double>(tok.size() * C, 3);
  std::vector<double> out(tok.size() * C);
  auto loss = [&] {
    cpu::embedding_forward(out.data(), tok.data(), w.data(), tok.size(), C, V);
    return ght::test::dot(g, out);
  };
  std::vector<double> dw(V * C, 0.0);
  cpu::embedding_backward(dw.data(), g.data(), tok.data(), tok.size(), C, V);
  ght::test::fd_check(loss, w, dw, "embedding dw", 1000);
}

TEST(Embedding, OutOfRangeIdThrowsNamingIt) {
  const std::vector<std::int32_t> tok = {1, 9};
  std::vector<float> w(9 * 4, 1.f), out(8);
  try {
    cpu::embedding_forward(out.data(), tok.data(), w.data(), 2, 4, 9);
    FAIL() << "no throw";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 at position 1"), std::string::npos) << e.what();
  }
}
