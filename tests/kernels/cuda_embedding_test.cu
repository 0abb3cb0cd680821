// GPU test of kernels/cuda/embedding against kernels/cpu/embedding (fp32).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

// Few distinct ids, so most ids repeat many times (runs in the sorted backward).
std::vector<std::int32_t> random_tokens(std::int64_t n, int v, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, v - 1);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = dist(gen);
  return t;
}

struct Shape {
  std::int64_t n;
  int c, v;
};
const Shape kShapes[] = {{300, 64, 50}, {97, 36, 1000}, {2048, 1024, 257}};

TEST(CudaEmbedding, ForwardMatchesCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.n << " C=" << s.c << " V=" << s.v);
    const auto tokens = random_tokens(s.n, s.v, seed++);
    const auto wte = random_bf16_values(static_cast<std::size_t>(s.v) * s.c, seed++);
    std::vector<float> out(static_cast<std::size_t>(s.n * s.c));
    cpu::embedding_forward<float>(out.data(), tokens.data(), wte.data(), s.n, s.c, s.v);

    TestStream stream;
    DeviceBuffer<std::int32_t> d_tok(tokens);
    auto d_wte = upload_bf16(wte);
    DeviceBuffer<bf16> d_out(out.size());
    d_out.poison();
    DeviceBuffer<unsigned long long> d_bad(std::vector<unsigned long long>{~0ull});
    kc::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), s.n, s.c, s.v, d_bad.get(),
                          stream.get());
    stream.sync();
    // A copy: exact.
    EXPECT_TRUE(all_close("out", download_f32(d_out), out, 0.0f, 0.0f));
    EXPECT_EQ(d_bad.download()[0], ~0ull);
  }
}

TEST(CudaEmbedding, OutOfRangeIdsAreReported) {
  GHT_REQUIRE_GPU();
  const int C = 16, V = 10;
  std::vector<std::int32_t> tokens = {1, 2, 3, 10, 4, -1};
  const auto wte = random_bf16_values(static_cast<std::size_t>(V) * C, 5);
  TestStream stream;
  DeviceBuffer<std::int32_t> d_tok(tokens);
  auto d_wte = upload_bf16(wte);
  DeviceBuffer<bf16> d_out(tokens.size() * C);
  DeviceBuffer<unsigned long long> d_bad(std::vector<unsigned long long>{~0ull});
  kc::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), 6, C, V, d_bad.get(), stream.get());
  stream.sync();
  EXPECT_EQ(d_bad.download()[0], 3u);  // the first bad position
  const auto out = download_f32(d_out);
  for (int c = 0; c < C; ++c) EXPECT_EQ(out[3 * C + c], 0.0f);
  try {
    kc::embedding_check_tokens(d_tok.get(), 6, V, stream.get());
    ADD_FAILURE() << "embedding_check_tokens did not throw";
  } catch (const ght::logic_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("position 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("token id 10"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(kc::embedding_check_tokens(d_tok.get(), 3, V, stream.get()));
}

template <typename DW>
void run_backward(std::uint32_t seed) {
  for (const auto& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.n << " C=" << s.c << " V=" << s.v
                                      << " dw=" << (sizeof(DW) == 4 ? "f32" : "bf16"));
    const auto tokens = random_tokens(s.n, s.v, seed++);
    const auto dout = random_bf16_values(static_cast<std::size_t>(s.n * s.c), seed++);
    const auto dw0 = random_bf16_values(static_cast<std::size_t>(s.v) * s.c, seed++);
    std::vector<float> dw = dw0;
    cpu::embedding_backward<float>(dw.data(), dout.data(), tokens.data(), s.n, s.c, s.v);

    TestStream stream;
    DeviceBuffer<std::int32_t> d_tok(tokens);
    auto d_dout = upload_bf16(dout);
    std::vector<float> got;
    if constexpr (sizeof(DW) == 4) {
      DeviceBuffer<float> d_dw(dw0);
      kc::embedding_backward(d_dw.get(), d_dout.get(), d_tok.get(), s.n, s.c, s.v, stream.get());
      stream.sync();
      got = d_dw.download();
      // Same summation order as the CPU (token order, fp32): only the bf16 inputs could differ,
      // and they are identical.
      EXPECT_TRUE(all_close("dwte", got, dw, 1e-5f, 1e-6f));
    } else {
      auto d_dw = upload_bf16(dw0);
      kc::embedding_backward(d_dw.get(), d_dout.get(), d_tok.get(), s.n, s.c, s.v, stream.get());
      stream.sync();
      got = download_f32(d_dw);
      EXPECT_TRUE(all_close("dwte", got, dw, 1e-3f, 8e-3f));
    }
  }
}

TEST(CudaEmbedding, BackwardMatchesCpuFp32) {
  GHT_REQUIRE_GPU();
  run_backward<float>(100);
}

TEST(CudaEmbedding, BackwardMatchesCpuBf16) {
  GHT_REQUIRE_GPU();
  run_backward<bf16>(200);
}

TEST(CudaEmbedding, RejectsBadSizes) {
  EXPECT_THROW(kc::embedding_forward(nullptr, nullptr, nullptr, 4, 0, 10, nullptr, nullptr),
               ght::logic_error);
  EXPECT_THROW(kc::embedding_backward(static_cast<float*>(nullptr), nullptr, nullptr, 4, 8, 0,
                                      nullptr),
               ght::logic_error);
}

}  // namespace
