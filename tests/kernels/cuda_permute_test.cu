// GPU test of kernels/cuda/permute against kernels/cpu/permute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/permute.hpp"
#include "kernels/cuda/permute.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

// K distinct experts per token, skewed towards low ids so counts are uneven (some experts empty
// when E is large).
std::vector<std::int32_t> random_topk(std::int64_t N, int K, int E, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(N * K));
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t t = 0; t < N; ++t) {
    std::vector<int> pool = all;
    for (int k = 0; k < K; ++k) {
      std::uniform_real_distribution<double> u(0.0, 1.0);
      const int j = static_cast<int>(u(gen) * u(gen) * static_cast<double>(pool.size()));
      idx[t * K + k] = pool[j];
      pool.erase(pool.begin() + j);
    }
  }
  return idx;
}

struct Case {
  std::int64_t n;
  int k, e, c;
};
// K = 10: more assignments per token than any preset (and than the un-permute backward's rows at
// once, 8: its loop kernel); C = 36: the scalar (VEC = 1) kernels.
const Case kCases[] = {{1500, 4, 64, 64}, {100, 2, 3, 40}, {300, 8, 1000, 128}, {1, 1, 1, 8},
                       {4097, 2, 16, 24}, {200, 10, 48, 36}};

TEST(CudaPermute, PlanGatherCombineMatchCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& cs : kCases) {
    SCOPED_TRACE(::testing::Message() << "N=" << cs.n << " K=" << cs.k << " E=" << cs.e
                                      << " C=" << cs.c);
    const std::int64_t N = cs.n, A = N * cs.k;
    const int C = cs.c;
    const auto idx = random_topk(N, cs.k, cs.e, seed++);
    std::vector<std::int32_t> off(cs.e + 1), src(A), dst(A);
    cpu::moe_permute_plan(off.data(), src.data(), dst.data(), idx.data(), N, cs.k, cs.e);

    const auto x = random_bf16_values(static_cast<std::size_t>(N * C), seed++);
    const auto w = random_bf16_values(static_cast<std::size_t>(A), seed++, 0.05f, 1.0f);
    const auto yp = random_bf16_values(static_cast<std::size_t>(A * C), seed++);
    const auto dxp = random_bf16_values(static_cast<std::size_t>(A * C), seed++);
    const auto dout = random_bf16_values(static_cast<std::size_t>(N * C), seed++);
    std::vector<float> xp(A * C), dx(N * C), out(N * C), dyp(A * C), dw(A);
    cpu::moe_permute_forward<float>(xp.data(), x.data(), src.data(), N, cs.k, C);
    cpu::moe_permute_backward<float>(dx.data(), dxp.data(), dst.data(), N, cs.k, C);
    cpu::moe_unpermute_forward<float>(out.data(), yp.data(), w.data(), dst.data(), N, cs.k, C);
    cpu::moe_unpermute_backward<float>(dyp.data(), dw.data(), dout.data(), yp.data(), w.data(),
                                       dst.data(), N, cs.k, C);

    TestStream stream;
    DeviceBuffer<std::int32_t> d_idx(idx), d_off(off.size()), d_src(A), d_dst(A);
    d_off.poison();
    d_src.poison();
    d_dst.poison();
    kc::moe_permute_plan(d_off.get(), d_src.get(), d_dst.get(), d_idx.get(), N, cs.k, cs.e,
                         stream.get());
    stream.sync();
    EXPECT_TRUE(all_equal("expert_offsets", d_off.download(), off));
    EXPECT_TRUE(all_equal("src_token", d_src.download(), src));
    EXPECT_TRUE(all_equal("dst_row", d_dst.download(), dst));

    auto d_x = upload_bf16(x);
    auto d_yp = upload_bf16(yp);
    auto d_dxp = upload_bf16(dxp);
    auto d_dout = upload_bf16(dout);
    DeviceBuffer<float> d_w(w), d_dw(A);
    DeviceBuffer<bf16> d_xp(A * C), d_dx(N * C), d_out(N * C), d_dyp(A * C);
    d_xp.poison();
    d_dyp.poison();
    kc::moe_permute_forward(d_xp.get(), d_x.get(), d_src.get(), N, cs.k, C, stream.get());
    DeviceBuffer<bf16> d_xp_tok(A * C);
    d_xp_tok.poison();
    kc::moe_permute_forward_by_token(d_xp_tok.get(), d_x.get(), d_dst.get(), N, cs.k, C, stream.get());
    kc::moe_permute_backward(d_dx.get(), d_dxp.get(), d_dst.get(), N, cs.k, C, stream.get());
    kc::moe_unpermute_forward(d_out.get(), d_yp.get(), d_w.get(), d_dst.get(), N, cs.k, C,
                              stream.get());
    kc::moe_unpermute_backward(d_dyp.get(), d_dw.get(), d_dout.get(), d_yp.get(), d_w.get(),
                               d_dst.get(), N, cs.k, C, stream.get());
    stream.sync();
    EXPECT_TRUE(all_close("xp", download_f32(d_xp), xp, 0.0f, 0.0f));
    EXPECT_TRUE(all_close("xp by token", download_f32(d_xp_tok), xp, 0.0f, 0.0f));
    EXPECT_TRUE(all_close("dx", download_f32(d_dx), dx, 1e-3f, 8e-3f));
    EXPECT_TRUE(all_close("out", download_f32(d_out), out, 1e-3f, 8e-3f));
    EXPECT_TRUE(all_close("dyp", download_f32(d_dyp), dyp, 1e-4f, 8e-3f));
    EXPECT_TRUE(all_close("dtopk_w", d_dw.download(), dw, 1e-4f, 1e-4f));
  }
}

TEST(CudaPermute, RejectsTooManyExperts) {
  EXPECT_THROW(kc::moe_permute_plan(nullptr, nullptr, nullptr, nullptr, 4, 2, 5000, nullptr),
               ght::logic_error);
}

}  // namespace
