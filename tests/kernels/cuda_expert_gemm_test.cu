// GPU test of kernels/cuda/expert_gemm: every implementation of the var-M and var-K grouped GEMMs
// against a CPU reference, and the whole SwiGLU expert MLP with E > 1 (permuted tokens, flat
// per-expert weights) against kernels/cpu/swiglu_experts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/swiglu_experts.hpp"
#include "kernels/cuda/expert_gemm.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

// Every implementation this build has (cutlass only where CMake found CUTLASS).
std::vector<kc::GroupedGemmImpl> impls() {
  std::vector<kc::GroupedGemmImpl> v = {kc::GroupedGemmImpl::cublaslt_loop, kc::GroupedGemmImpl::cublas_grouped,
                                        kc::GroupedGemmImpl::custom, kc::GroupedGemmImpl::cublaslt_streams};
  if (kc::cutlass_available()) v.push_back(kc::GroupedGemmImpl::cutlass);
  return v;
}

// Uneven groups: empty ones, one row, partial and several 128-row tiles.
const std::vector<std::int32_t> kCounts = {0, 37, 130, 1, 0, 200, 9};

std::vector<std::int32_t> offsets_of(const std::vector<std::int32_t>& counts) {
  std::vector<std::int32_t> off(counts.size() + 1, 0);
  for (std::size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

bool supported(kc::GroupedGemmImpl impl, kc::DType c) {
  return !(impl == kc::GroupedGemmImpl::cublas_grouped && c == kc::DType::f32);
}

void run_var_m(kc::GroupedGemmImpl impl, bool trans_b, kc::DType ct, bool host_offsets,
               std::uint32_t seed, std::int64_t n = 136, std::int64_t k = 264) {
  SCOPED_TRACE(::testing::Message() << "var-M impl=" << kc::to_string(impl) << " trans_b=" << trans_b
                                    << " c=" << (ct == kc::DType::bf16 ? "bf16" : "f32")
                                    << " host_offsets=" << host_offsets
                                    << " n=" << n << " k=" << k);
  const auto off = offsets_of(kCounts);
  const int E = static_cast<int>(kCounts.size());
  const std::int64_t R = off[E];
  const std::int64_t ldb = trans_b ? k : n, stride_b = n * k + 8;  // padded between experts
  const auto a = random_bf16_values(R * k, seed);
  const auto b = random_bf16_values(E * stride_b, seed + 1);
  const auto c0 = random_bf16_values(R * n, seed + 2);
  const float alpha = 0.75f, beta = 0.5f;
  std::vector<float> ref = c0;
  for (int e = 0; e < E; ++e) {
    for (std::int64_t r = off[e]; r < off[e + 1]; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < k; ++p) {
          const float bv = trans_b ? b[e * stride_b + j * ldb + p] : b[e * stride_b + p * ldb + j];
          acc += static_cast<double>(a[r * k + p]) * bv;
        }
        ref[r * n + j] = static_cast<float>(alpha * acc + beta * c0[r * n + j]);
      }
    }
  }
  TestStream stream;
  auto d_a = upload_bf16(a);
  auto d_b = upload_bf16(b);
  DeviceBuffer<std::int32_t> d_off(off);
  kc::GroupedGemmVarM g;
  g.n = n;
  g.k = k;
  g.a = d_a.get();
  g.b = d_b.get();
  g.ldb = ldb;
  g.stride_b = stride_b;
  g.trans_b = trans_b;
  g.c_type = ct;
  g.alpha = alpha;
  g.beta = beta;
  kc::GroupOffsets o;
  o.groups = E;
  o.device = d_off.get();
  o.host = host_offsets ? off.data() : nullptr;
  o.max_rows = R + 77;  // an upper bound, not the exact count
  std::vector<float> got;
  auto run = [&](void* c) {
    g.c = c;
    // cutlass must run these calls itself (bf16 C), not fall back to `custom`.
    if (impl == kc::GroupedGemmImpl::cutlass && ct == kc::DType::bf16) EXPECT_TRUE(kc::cutlass_covers(g));
    kc::grouped_gemm(g, o, impl, stream.get());
    stream.sync();
  };
  if (ct == kc::DType::bf16) {
    auto d_c = upload_bf16(c0);
    run(d_c.get());
    got = download_f32(d_c);
  } else {
    DeviceBuffer<float> d_c(c0);
    run(d_c.get());
    got = d_c.download();
  }
  const bool bf = ct == kc::DType::bf16;
  EXPECT_TRUE(all_close("C", got, ref, bf ? 1e-2f : 1e-3f, bf ? 8e-3f : 1e-4f));
}

void run_var_k(kc::GroupedGemmImpl impl, kc::DType ct, float beta, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "var-K impl=" << kc::to_string(impl) << " c="
                                    << (ct == kc::DType::bf16 ? "bf16" : "f32") << " beta=" << beta);
  const auto off = offsets_of(kCounts);
  const int E = static_cast<int>(kCounts.size());
  const std::int64_t R = off[E], m = 136, n = 72, stride_c = m * n + 16;
  const auto a = random_bf16_values(R * m, seed);
  const auto b = random_bf16_values(R * n, seed + 1);
  const auto c0 = random_bf16_values(E * stride_c, seed + 2);
  std::vector<float> ref = c0;
  for (int e = 0; e < E; ++e) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t r = off[e]; r < off[e + 1]; ++r)
          acc += static_cast<double>(a[r * m + i]) * b[r * n + j];
        float& o = ref[e * stride_c + i * n + j];
        o = static_cast<float>(acc + beta * o);
      }
    }
  }
  TestStream stream;
  auto d_a = upload_bf16(a);
  auto d_b = upload_bf16(b);
  DeviceBuffer<std::int32_t> d_off(off);
  kc::GroupedGemmVarK g;
  g.m = m;
  g.n = n;
  g.a = d_a.get();
  g.b = d_b.get();
  g.c_type = ct;
  g.stride_c = stride_c;
  g.beta = beta;
  kc::GroupOffsets o;
  o.groups = E;
  o.device = d_off.get();
  o.max_rows = R;
  std::vector<float> got;
  auto run = [&](void* c) {
    g.c = c;
    if (impl == kc::GroupedGemmImpl::cutlass) EXPECT_TRUE(kc::cutlass_covers(g));
    kc::grouped_gemm(g, o, impl, stream.get());
    stream.sync();
  };
  if (ct == kc::DType::bf16) {
    auto d_c = upload_bf16(c0);
    run(d_c.get());
    got = download_f32(d_c);
  } else {
    DeviceBuffer<float> d_c(c0);
    run(d_c.get());
    got = d_c.download();
  }
  const bool bf = ct == kc::DType::bf16;
  EXPECT_TRUE(all_close("C", got, ref, bf ? 1e-2f : 1e-3f, bf ? 8e-3f : 1e-4f));
}

TEST(CudaExpertGemm, VarMAllImplementations) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (auto impl : impls()) {
    for (bool tb : {true, false}) {
      for (auto ct : {kc::DType::bf16, kc::DType::f32}) {
        if (!supported(impl, ct)) continue;
        seed += 5;
        run_var_m(impl, tb, ct, /*host_offsets=*/seed % 2 == 0, seed);
      }
    }
  }
}

// CUTLASS's var-M GEMMs (128x256 tiles) on partial and several N tiles and K of one and several
// 64-deep steps, both B layouts.
TEST(CudaExpertGemm, CutlassTilesMatchCpu) {
  GHT_REQUIRE_GPU();
  if (!kc::cutlass_available()) GTEST_SKIP() << "this build has no CUTLASS (CMake did not find it)";
  std::uint32_t seed = 700;
  for (bool tb : {true, false}) {
    run_var_m(kc::GroupedGemmImpl::cutlass, tb, kc::DType::bf16, false, seed += 5, 136, 264);
    run_var_m(kc::GroupedGemmImpl::cutlass, tb, kc::DType::bf16, false, seed += 5, 520, 64);
  }
}

TEST(CudaExpertGemm, VarKAllImplementations) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (auto impl : impls()) {
    for (auto ct : {kc::DType::bf16, kc::DType::f32}) {
      if (!supported(impl, ct)) continue;
      run_var_k(impl, ct, 1.0f, seed += 5);
      run_var_k(impl, ct, 0.0f, seed += 5);  // beta = 0: empty groups must be zeroed
      run_var_k(impl, ct, 0.5f, seed += 5);  // empty groups scaled
    }
  }
}

TEST(CudaExpertGemm, CublasGroupedRejectsFp32Output) {
  kc::GroupedGemmVarM g;
  g.n = 8;
  g.k = 8;
  float dummy[64];
  g.a = reinterpret_cast<const bf16*>(dummy);
  g.b = reinterpret_cast<const bf16*>(dummy);
  g.c = dummy;
  g.c_type = kc::DType::f32;
  const std::int32_t off[2] = {0, 4};
  kc::GroupOffsets o;
  o.groups = 1;
  o.host = off;
  EXPECT_THROW(kc::grouped_gemm(g, o, kc::GroupedGemmImpl::cublas_grouped, nullptr),
               ght::logic_error);
}

// The expert MLP exactly as the trainer composes it, E experts, against the CPU op.
void run_swiglu_experts(kc::GroupedGemmImpl impl, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "swiglu experts impl=" << kc::to_string(impl));
  const int C = 64, F = 96;
  const auto off = offsets_of(kCounts);
  const int E = static_cast<int>(kCounts.size());
  const std::int64_t R = off[E], FC = static_cast<std::int64_t>(F) * C, stride = 3 * FC;
  const float ws = 1.7f / std::sqrt(static_cast<float>(C));
  const auto xp = random_bf16_values(R * C, seed);
  const auto w = random_bf16_values(E * stride, seed + 1, -ws, ws);
  const auto dy = random_bf16_values(R * C, seed + 2);
  std::vector<float> y(R * C), gate(R * F), up(R * F), act(R * F), dxp(R * C), dw(E * stride, 0.0f);
  cpu::swiglu_experts_forward<float>(y.data(), gate.data(), up.data(), act.data(), xp.data(),
                                     w.data(), w.data() + FC, w.data() + 2 * FC, stride, off.data(),
                                     E, C, F);
  cpu::swiglu_experts_backward<float>(dxp.data(), dw.data(), dw.data() + FC, dw.data() + 2 * FC,
                                      dy.data(), xp.data(), gate.data(), up.data(), act.data(),
                                      w.data(), w.data() + FC, w.data() + 2 * FC, stride,
                                      off.data(), E, C, F);
  // cuBLAS grouped has no fp32-output path, so its weight gradients accumulate in bf16.
  const kc::DType wt =
      impl == kc::GroupedGemmImpl::cublas_grouped ? kc::DType::bf16 : kc::DType::f32;

  TestStream stream;
  auto d_xp = upload_bf16(xp);
  auto d_w = upload_bf16(w);
  auto d_dy = upload_bf16(dy);
  DeviceBuffer<std::int32_t> d_off(off);
  DeviceBuffer<bf16> d_gu(R * 2 * F), d_act(R * F), d_y(R * C), d_dact(R * F), d_dxp(R * C);
  DeviceBuffer<float> d_dw32(std::vector<float>(E * stride, 0.0f));
  auto d_dw16 = upload_bf16(std::vector<float>(E * stride, 0.0f));
  void* dw_base = wt == kc::DType::f32 ? static_cast<void*>(d_dw32.get()) : d_dw16.get();
  auto dw_at = [&](std::int64_t elems) {
    return static_cast<char*>(dw_base) + elems * static_cast<std::int64_t>(kc::dtype_size(wt));
  };
  kc::GroupOffsets o;
  o.groups = E;
  o.device = d_off.get();
  o.max_rows = R;

  kc::GroupedGemmVarM m;
  m = {};  // gate_up = xp·Wgu_e^T
  m.n = 2 * F, m.k = C, m.a = d_xp.get(), m.b = d_w.get(), m.stride_b = stride, m.trans_b = true;
  m.c = d_gu.get();
  kc::grouped_gemm(m, o, impl, stream.get());
  kc::swiglu_forward(d_act.get(), F, d_gu.get(), d_gu.get() + F, 2 * F, R, F, stream.get());
  m = {};  // y = act·Wd_e^T
  m.n = C, m.k = F, m.a = d_act.get(), m.b = d_w.get() + 2 * FC, m.stride_b = stride;
  m.trans_b = true, m.c = d_y.get();
  kc::grouped_gemm(m, o, impl, stream.get());
  m = {};  // dact = dy·Wd_e
  m.n = F, m.k = C, m.a = d_dy.get(), m.b = d_w.get() + 2 * FC, m.stride_b = stride;
  m.c = d_dact.get();
  kc::grouped_gemm(m, o, impl, stream.get());
  kc::GroupedGemmVarK kk;
  kk = {};  // dWd_e += dy_e^T·act_e
  kk.m = C, kk.n = F, kk.a = d_dy.get(), kk.b = d_act.get(), kk.c = dw_at(2 * FC), kk.c_type = wt;
  kk.stride_c = stride;
  kc::grouped_gemm(kk, o, impl, stream.get());
  kc::swiglu_backward(d_gu.get(), d_gu.get() + F, 2 * F, d_dact.get(), F, d_gu.get(),
                      d_gu.get() + F, 2 * F, R, F, stream.get());
  m = {};  // dxp = dgu·Wgu_e
  m.n = C, m.k = 2 * F, m.a = d_gu.get(), m.b = d_w.get(), m.stride_b = stride, m.c = d_dxp.get();
  kc::grouped_gemm(m, o, impl, stream.get());
  kk = {};  // dWgu_e += dgu_e^T·xp_e
  kk.m = 2 * F, kk.n = C, kk.a = d_gu.get(), kk.b = d_xp.get(), kk.c = dw_at(0), kk.c_type = wt;
  kk.stride_c = stride;
  kc::grouped_gemm(kk, o, impl, stream.get());
  stream.sync();

  EXPECT_TRUE(all_close("y", download_f32(d_y), y, 2e-2f * max_abs(y), 2e-2f));
  EXPECT_TRUE(all_close("dxp", download_f32(d_dxp), dxp, 3e-2f * max_abs(dxp), 3e-2f));
  const auto got_dw = wt == kc::DType::f32 ? d_dw32.download() : download_f32(d_dw16);
  EXPECT_TRUE(all_close("dw", got_dw, dw, 3e-2f * max_abs(dw), 3e-2f));
}

TEST(CudaExpertGemm, SwigluExpertsMatchCpuAllImplementations) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 300;
  for (auto impl : impls()) run_swiglu_experts(impl, seed += 7);
}

// The CUTLASS path reads the group sizes on the device only: its calls capture into a CUDA graph
// under the strictest capture mode (any synchronising or host-reading call would fail the
// capture), and the replayed graph computes what the direct call did, for new offsets too.
TEST(CudaExpertGemm, CutlassCapturesIntoCudaGraph) {
  if (!kc::cutlass_available()) GTEST_SKIP() << "this build has no CUTLASS (CMake did not find it)";
  GHT_REQUIRE_GPU();
  const std::vector<std::int32_t> counts_a = {0, 37, 130, 1, 0, 200, 9}, counts_b = {64, 0, 0, 250, 3, 40, 9};
  const int E = static_cast<int>(counts_a.size());
  const std::int64_t R = 366, n = 136, k = 264;  // both count lists sum to R
  const auto a = random_bf16_values(R * k, 7);
  const auto b = random_bf16_values(E * n * k, 8);
  TestStream stream;
  auto d_a = upload_bf16(a);
  auto d_b = upload_bf16(b);
  DeviceBuffer<std::int32_t> d_off(offsets_of(counts_a));
  DeviceBuffer<bf16> d_direct(R * n), d_graph(R * n);
  kc::GroupedGemmVarM g;
  g.n = n, g.k = k, g.a = d_a.get(), g.b = d_b.get(), g.stride_b = n * k, g.trans_b = true;
  kc::GroupOffsets o;
  o.groups = E, o.device = d_off.get(), o.max_rows = R;
  g.c = d_graph.get();
  ASSERT_TRUE(kc::cutlass_covers(g));
  // The offsets go up on the GEMM's own (non-blocking) stream: a synchronous cudaMemcpy from
  // pageable memory may return before its DMA lands, and that stream would not wait for it.
  auto set_offsets = [&](const std::vector<std::int32_t>& counts) {
    const std::vector<std::int32_t> off = offsets_of(counts);
    GHT_CUDA_TRY(cudaMemcpyAsync(d_off.get(), off.data(), (E + 1) * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                 stream.get()));
    stream.sync();
  };
  auto direct = [&](const std::vector<std::int32_t>& counts) {
    set_offsets(counts);
    g.c = d_direct.get();
    kc::grouped_gemm(g, o, kc::GroupedGemmImpl::cutlass, stream.get());
    stream.sync();
    return download_f32(d_direct);
  };
  const auto want_a = direct(counts_a);  // also grows the stream scratch before the capture
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  g.c = d_graph.get();
  kc::grouped_gemm(g, o, kc::GroupedGemmImpl::cutlass, stream.get());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const auto* counts : {&counts_a, &counts_b}) {
    const auto want = counts == &counts_a ? want_a : direct(*counts);
    set_offsets(*counts);
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    stream.sync();
    EXPECT_EQ(download_f32(d_graph), want);  // same kernel, same inputs: bit-identical
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

// A stream's SM budget (gemm.hpp, GHT_OPT_SM_RESERVE) gives the persistent CUTLASS kernels fewer
// CTAs; each tile is still computed whole by one of them, so the result is bit-identical.
TEST(CudaExpertGemm, CutlassOnFewerSmsIsBitIdentical) {
  if (!kc::cutlass_available()) GTEST_SKIP() << "this build has no CUTLASS (CMake did not find it)";
  GHT_REQUIRE_GPU();
  const std::vector<std::int32_t> counts = {0, 37, 130, 1, 0, 200, 9};
  const int E = static_cast<int>(counts.size());
  const std::int64_t R = 377, n = 136, k = 264;
  const auto a = random_bf16_values(R * k, 17);
  const auto b = random_bf16_values(E * n * k, 18);
  TestStream stream;
  auto d_a = upload_bf16(a);
  auto d_b = upload_bf16(b);
  DeviceBuffer<std::int32_t> d_off(offsets_of(counts));
  DeviceBuffer<bf16> d_c(R * n);
  kc::GroupedGemmVarM g;
  g.n = n, g.k = k, g.a = d_a.get(), g.b = d_b.get(), g.stride_b = n * k, g.trans_b = true, g.c = d_c.get();
  kc::GroupOffsets o;
  o.groups = E, o.device = d_off.get(), o.max_rows = R;
  ASSERT_TRUE(kc::cutlass_covers(g));
  auto run = [&](int budget) {
    kc::set_stream_sm_budget(stream.get(), budget);
    d_c.poison();
    kc::grouped_gemm(g, o, kc::GroupedGemmImpl::cutlass, stream.get());
    stream.sync();
    kc::set_stream_sm_budget(stream.get(), 0);
    return download_f32(d_c);
  };
  const auto every = run(0);
  for (int budget : {1, 7, 100}) EXPECT_EQ(run(budget), every) << "budget " << budget;
}

}  // namespace
