// GPU test of kernels/cuda/gemm: cuBLASLt row-major GEMM vs a CPU fp32 GEMM on bf16-exact inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;

struct Case {
  std::int64_t m, n, k;
  bool ta, tb;
  kc::DType c_type;
  float alpha, beta;
  int batch = 1;
  bool broadcast_b = false;  // stride_b = 0
  std::int64_t pad = 0;      // extra columns in every leading dimension
  int sm_count_target = 0;   // GemmArgs::sm_count_target
  int stream_budget = 0;     // set_stream_sm_budget on the case's stream
};

// Row-major reference: C[b] = alpha·op(A[b])·op(B[b]) + beta·C[b], accumulated in double.
std::vector<float> cpu_gemm(const Case& c, const std::vector<float>& a, std::int64_t lda,
                            std::int64_t sa, const std::vector<float>& b, std::int64_t ldb,
                            std::int64_t sb, const std::vector<float>& c_in, std::int64_t ldc,
                            std::int64_t sc) {
  std::vector<float> out = c_in;
  for (int bi = 0; bi < c.batch; ++bi) {
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < c.k; ++p) {
          const float av = c.ta ? a[bi * sa + p * lda + i] : a[bi * sa + i * lda + p];
          const float bv = c.tb ? b[bi * sb + j * ldb + p] : b[bi * sb + p * ldb + j];
          acc += static_cast<double>(av) * bv;
        }
        float& o = out[bi * sc + i * ldc + j];
        o = static_cast<float>(c.alpha * acc + (c.beta != 0.0f ? c.beta * o : 0.0));
      }
    }
  }
  return out;
}

// rank < 0: gemm(); otherwise gemm_ranked(rank), and *offered (if given) receives how many
// algorithms the heuristic offers for the shape.
void run_case(const Case& c, std::uint32_t seed, int rank = -1, int* offered = nullptr) {
  SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k
                                    << " ta=" << c.ta << " tb=" << c.tb << " c="
                                    << (c.c_type == kc::DType::bf16 ? "bf16" : "f32")
                                    << " alpha=" << c.alpha << " beta=" << c.beta
                                    << " batch=" << c.batch << " bcastB=" << c.broadcast_b
                                    << " pad=" << c.pad << " sms=" << c.sm_count_target
                                    << " rank=" << rank);
  const std::int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const std::int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const std::int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  const std::int64_t sa = a_rows * lda, sb = c.broadcast_b ? 0 : b_rows * ldb, sc = c.m * ldc;
  const int nb = c.broadcast_b ? 1 : c.batch;

  auto a = random_bf16_values(static_cast<std::size_t>(sa * c.batch), seed);
  auto b = random_bf16_values(static_cast<std::size_t>(b_rows * ldb * nb), seed + 1);
  auto c0 = random_bf16_values(static_cast<std::size_t>(sc * c.batch), seed + 2);
  const auto ref = cpu_gemm(c, a, lda, sa, b, ldb, sb, c0, ldc, sc);

  TestStream stream;
  kc::set_stream_sm_budget(stream.get(), c.stream_budget);
  EXPECT_EQ(kc::stream_sm_budget(stream.get()), c.stream_budget);
  auto da = upload_bf16(a);
  auto db = upload_bf16(b);
  kc::GemmArgs g;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.a = da.get();
  g.b = db.get();
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.c_type = c.c_type;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.batch = c.batch;
  g.stride_a = sa;
  g.stride_b = sb;
  g.stride_c = sc;
  g.sm_count_target = c.sm_count_target;

  auto run = [&] {
    if (rank < 0) {
      kc::gemm(g, stream.get());
      return;
    }
    if (offered != nullptr) *offered = kc::gemm_heuristic_count(g, 32);
    kc::gemm_ranked(g, rank, stream.get());
  };
  std::vector<float> got;
  if (c.c_type == kc::DType::bf16) {
    auto dc = upload_bf16(c0);
    g.c = dc.get();
    run();
    stream.sync();
    got = download_f32(dc);
  } else {
    DeviceBuffer<float> dc(c0);
    g.c = dc.get();
    run();
    stream.sync();
    got = dc.download();
  }
  // Inputs are bf16-exact, accumulation is fp32 on both sides, so the only real error is the
  // output rounding: 2^-8 relative for bf16 (eps 8e-3 allows two ulps), fp32 sums otherwise.
  kc::set_stream_sm_budget(stream.get(), 0);  // the stream handle may be reused by the next case
  const float eps = c.c_type == kc::DType::bf16 ? 8e-3f : 1e-4f;
  const float tol = c.c_type == kc::DType::bf16 ? 1e-2f : 1e-3f;
  EXPECT_TRUE(all_close("gemm C", got, ref, tol, eps));
}

TEST(CudaGemm, AllTransposesBf16AndF32Output) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto ct : {kc::DType::bf16, kc::DType::f32}) {
        run_case({67, 45, 129, ta, tb, ct, 1.0f, 0.0f}, seed);
        seed += 3;
      }
    }
  }
}

TEST(CudaGemm, AlphaBetaAccumulate) {
  GHT_REQUIRE_GPU();
  // Weight-gradient shape: dW(out,in) += dY^T(out,T) · X(T,in), fp32 and bf16 accumulators.
  run_case({96, 80, 256, true, false, kc::DType::f32, 1.0f, 1.0f}, 7);
  run_case({96, 80, 256, true, false, kc::DType::bf16, 1.0f, 1.0f}, 8);
  run_case({33, 17, 40, false, true, kc::DType::f32, 0.5f, -2.0f}, 9);
}

TEST(CudaGemm, LargerShapeUsesWorkspaceAlgorithms) {
  GHT_REQUIRE_GPU();
  // Long k invites split-K algorithms that use the workspace.
  run_case({64, 128, 4096, false, true, kc::DType::f32, 1.0f, 0.0f}, 11);
  run_case({256, 384, 512, false, false, kc::DType::bf16, 1.0f, 0.0f}, 12);
}

TEST(CudaGemm, StridedBatchAndBroadcast) {
  GHT_REQUIRE_GPU();
  Case c{40, 24, 72, false, true, kc::DType::bf16, 1.0f, 0.0f};
  c.batch = 3;
  run_case(c, 21);
  c.broadcast_b = true;  // one weight shared by all batch entries
  run_case(c, 22);
  c.c_type = kc::DType::f32;
  c.ta = true;
  c.beta = 1.0f;
  run_case(c, 23);
}

TEST(CudaGemm, PaddedLeadingDimensions) {
  GHT_REQUIRE_GPU();
  Case c{31, 29, 57, false, false, kc::DType::bf16, 1.0f, 0.0f};
  c.pad = 8;
  run_case(c, 31);
  c.ta = c.tb = true;
  c.c_type = kc::DType::f32;
  c.beta = 1.0f;
  run_case(c, 32);
}

TEST(CudaGemm, EmptyReductionScalesC) {
  GHT_REQUIRE_GPU();
  run_case({5, 7, 0, false, false, kc::DType::f32, 1.0f, 0.5f}, 41);
  run_case({5, 7, 0, false, false, kc::DType::bf16, 1.0f, 0.0f}, 42);
}

TEST(CudaGemm, PlanCacheReusedAcrossCalls) {
  GHT_REQUIRE_GPU();
  // Same shape twice with different data: a stale cached plan must not change the answer.
  run_case({48, 48, 64, false, true, kc::DType::bf16, 1.0f, 0.0f}, 51);
  run_case({48, 48, 64, false, true, kc::DType::bf16, 1.0f, 0.0f}, 52);
  kc::release_blas_resources();
  run_case({48, 48, 64, false, true, kc::DType::bf16, 1.0f, 0.0f}, 53);
}

// Fewer SMs (what leaves room for another stream's kernels) must not change the product.
TEST(CudaGemm, SmCountTargetKeepsTheProduct) {
  GHT_REQUIRE_GPU();
  for (int sms : {1, 8, 100}) {
    Case c{256, 384, 512, false, true, kc::DType::bf16, 1.0f, 0.0f};
    c.sm_count_target = sms;
    run_case(c, 71);
    c = {96, 80, 1024, true, false, kc::DType::f32, 1.0f, 1.0f};
    c.sm_count_target = sms;
    run_case(c, 72);
    c.sm_count_target = 0;
    c.stream_budget = sms;  // the same through the stream's budget
    run_case(c, 73);
  }
}

// bench_gemm_ranks times the heuristic's other algorithms: each must compute the same product.
TEST(CudaGemm, EveryRankedAlgorithmMatchesTheReference) {
  GHT_REQUIRE_GPU();
  const Case cases[] = {{256, 384, 512, false, true, kc::DType::bf16, 1.0f, 0.0f},
                        {96, 80, 1024, true, false, kc::DType::f32, 1.0f, 1.0f}};
  std::uint32_t seed = 61;
  for (const auto& c : cases) {
    int offered = 0;
    run_case(c, seed, 0, &offered);
    ASSERT_GE(offered, 1);
    for (int rank = 1; rank < offered; ++rank) run_case(c, seed, rank);
    ++seed;
    // A rank past what the heuristic offers is refused, not run with an uninitialised algorithm.
    if (offered < 32) EXPECT_THROW(run_case(c, seed, offered), ght::cuda_error);
  }
}

// Argument checks run on the host before any CUDA call, so this runs without a GPU.
TEST(CudaGemm, RejectsBadArguments) {
  kc::GemmArgs g;
  g.m = 4;
  g.n = 4;
  g.k = 4;
  EXPECT_THROW(kc::gemm(g, nullptr), ght::logic_error);  // null C
  float dummy[16];
  g.c = dummy;
  g.c_type = kc::DType::f32;
  g.lda = 2;  // < k
  EXPECT_THROW(kc::gemm(g, nullptr), ght::logic_error);
  g.lda = 0;
  g.m = -1;
  EXPECT_THROW(kc::gemm(g, nullptr), ght::logic_error);
  g.m = 4;
  g.batch = 2;  // stride_c missing
  EXPECT_THROW(kc::gemm(g, nullptr), ght::logic_error);
}

}  // namespace
