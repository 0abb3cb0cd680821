// GPU test of kernels/cuda/rmsnorm against kernels/cpu/rmsnorm (fp32) on bf16-exact inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cuda/rmsnorm.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

constexpr float kEps = 1e-6f;

struct Shape {
  std::int64_t n;
  int c;
};
// C % 8 == 0 takes the vectorised path, C = 100 the scalar one; N > 256 makes backward blocks
// loop over several rows.
const Shape kShapes[] = {{37, 64}, {19, 100}, {300, 2048}, {5, 4104}};

TEST(CudaRmsNorm, ForwardMatchesCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.n << " C=" << s.c);
    const auto x = random_bf16_values(static_cast<std::size_t>(s.n * s.c), seed++, -2.0f, 2.0f);
    const auto w = random_bf16_values(static_cast<std::size_t>(s.c), seed++, 0.5f, 1.5f);
    std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(s.n));
    cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), s.n, s.c, kEps);

    TestStream stream;
    auto dx = upload_bf16(x);
    auto dw = upload_bf16(w);
    DeviceBuffer<bf16> dout(x.size());
    DeviceBuffer<float> drstd(rstd.size());
    dout.poison();
    drstd.poison();
    kc::rmsnorm_forward(dout.get(), drstd.get(), dx.get(), dw.get(), s.n, s.c, kEps, stream.get());
    stream.sync();
    EXPECT_TRUE(all_close("rstd", drstd.download(), rstd, 1e-5f, 1e-5f));
    EXPECT_TRUE(all_close("out", download_f32(dout), out, 1e-3f, 8e-3f));
  }
}

TEST(CudaRmsNorm, FusedResidualForwardMatchesCpuInPlace) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (const auto& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.n << " C=" << s.c);
    const auto n = static_cast<std::size_t>(s.n * s.c);
    const auto x = random_bf16_values(n, seed++);
    const auto res = random_bf16_values(n, seed++, -3.0f, 3.0f);
    const auto w = random_bf16_values(static_cast<std::size_t>(s.c), seed++, 0.5f, 1.5f);
    std::vector<float> sum(n), out(n), rstd(static_cast<std::size_t>(s.n));
    cpu::fused_residual_rmsnorm_forward<float>(sum.data(), out.data(), rstd.data(), x.data(),
                                               res.data(), w.data(), s.n, s.c, kEps);

    TestStream stream;
    auto dx = upload_bf16(x);
    auto dres = upload_bf16(res);  // updated in place: sum aliases residual
    auto dw = upload_bf16(w);
    DeviceBuffer<bf16> dout(n);
    DeviceBuffer<float> drstd(rstd.size());
    dout.poison();
    kc::fused_residual_rmsnorm_forward(dres.get(), dout.get(), drstd.get(), dx.get(), dres.get(),
                                       dw.get(), s.n, s.c, kEps, stream.get());
    stream.sync();
    // The kernel normalises the bf16-rounded sum (HF semantics); the CPU the exact fp32 sum, so
    // out differs by up to about one bf16 ulp of the sum on top of its own rounding.
    EXPECT_TRUE(all_close("sum", download_f32(dres), sum, 1e-6f, 4e-3f));
    EXPECT_TRUE(all_close("rstd", drstd.download(), rstd, 1e-5f, 4e-3f));
    EXPECT_TRUE(all_close("out", download_f32(dout), out, 2e-3f, 1.6e-2f));
  }
}

template <typename DW>
void run_backward(std::uint32_t seed) {
  for (const auto& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.n << " C=" << s.c
                                      << " dw=" << (sizeof(DW) == 4 ? "f32" : "bf16"));
    const auto n = static_cast<std::size_t>(s.n * s.c);
    const auto x = random_bf16_values(n, seed++, -2.0f, 2.0f);
    const auto w = random_bf16_values(static_cast<std::size_t>(s.c), seed++, 0.5f, 1.5f);
    const auto g = random_bf16_values(n, seed++);
    const auto dx0 = random_bf16_values(n, seed++);  // dx is accumulated into
    const auto dw0 = random_bf16_values(static_cast<std::size_t>(s.c), seed++);
    std::vector<float> out(n), rstd(static_cast<std::size_t>(s.n));
    cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), s.n, s.c, kEps);
    std::vector<float> dx = dx0, dw = dw0;
    cpu::rmsnorm_backward<float>(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(),
                                 s.n, s.c);

    TestStream stream;
    auto d_x = upload_bf16(x);
    auto d_w = upload_bf16(w);
    auto d_g = upload_bf16(g);
    auto d_dx = upload_bf16(dx0);
    DeviceBuffer<float> d_rstd(rstd);
    std::vector<float> got_dw;
    if constexpr (sizeof(DW) == 4) {
      DeviceBuffer<float> d_dw(dw0);
      kc::rmsnorm_backward(d_dx.get(), d_dw.get(), d_g.get(), d_x.get(), d_w.get(), d_rstd.get(),
                           s.n, s.c, stream.get());
      stream.sync();
      got_dw = d_dw.download();
      // dw sums N products in fp32 in another order than the CPU.
      EXPECT_TRUE(all_close("dw", got_dw, dw, 1e-3f, 1e-4f));
    } else {
      auto d_dw = upload_bf16(dw0);
      kc::fused_residual_rmsnorm_backward(d_dx.get(), d_dw.get(), d_g.get(), d_x.get(), d_w.get(),
                                          d_rstd.get(), s.n, s.c, stream.get());
      stream.sync();
      got_dw = download_f32(d_dw);
      EXPECT_TRUE(all_close("dw", got_dw, dw, 1e-3f, 8e-3f));
    }
    EXPECT_TRUE(all_close("dx", download_f32(d_dx), dx, 2e-3f, 8e-3f));
  }
}

TEST(CudaRmsNorm, BackwardMatchesCpuFp32Dw) {
  GHT_REQUIRE_GPU();
  run_backward<float>(200);
}

TEST(CudaRmsNorm, FusedBackwardMatchesCpuBf16Dw) {
  GHT_REQUIRE_GPU();
  run_backward<bf16>(300);
}

TEST(CudaRmsNorm, BackwardIsDeterministic) {
  GHT_REQUIRE_GPU();
  const std::int64_t N = 1000;
  const int C = 512;
  const auto n = static_cast<std::size_t>(N * C);
  const auto x = random_bf16_values(n, 401);
  const auto w = random_bf16_values(C, 402);
  const auto g = random_bf16_values(n, 403);
  std::vector<float> rstd(N, 1.3f);
  TestStream stream;
  auto d_x = upload_bf16(x);
  auto d_w = upload_bf16(w);
  auto d_g = upload_bf16(g);
  DeviceBuffer<float> d_rstd(rstd);
  std::vector<float> first;
  for (int rep = 0; rep < 3; ++rep) {
    auto d_dx = upload_bf16(g);
    DeviceBuffer<float> d_dw(std::vector<float>(C, 0.0f));
    kc::rmsnorm_backward(d_dx.get(), d_dw.get(), d_g.get(), d_x.get(), d_w.get(), d_rstd.get(), N,
                         C, stream.get());
    stream.sync();
    auto got = d_dw.download();
    if (rep == 0) {
      first = got;
    } else {
      EXPECT_TRUE(all_close("dw repeat", got, first, 0.0f, 0.0f));
    }
  }
}

TEST(CudaRmsNorm, RejectsBadSizes) {
  EXPECT_THROW(kc::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 4, 0, kEps, nullptr),
               ght::logic_error);
  EXPECT_THROW(kc::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, -1, 8, kEps, nullptr),
               ght::logic_error);
}

}  // namespace
