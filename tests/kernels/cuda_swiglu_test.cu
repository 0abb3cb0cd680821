// GPU test of kernels/cuda/swiglu: the whole SwiGLU expert MLP for one expert, composed on the GPU
// from gemm + swiglu exactly as the trainer does (fused gate_up GEMM, in-place backward), against
// kernels/cpu/swiglu_experts with E = 1; plus the element-wise op alone with separate tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/swiglu_experts.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/swiglu.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

void run_mlp(std::int64_t R, int C, int F, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "R=" << R << " C=" << C << " F=" << F);
  const std::int64_t FC = static_cast<std::int64_t>(F) * C;
  const float ws = 1.7f / std::sqrt(static_cast<float>(C));  // keeps gate/up of order one
  const auto xp = random_bf16_values(static_cast<std::size_t>(R * C), seed);
  const auto w = random_bf16_values(static_cast<std::size_t>(3 * FC), seed + 1, -ws, ws);
  const auto dy = random_bf16_values(static_cast<std::size_t>(R * C), seed + 2);
  const auto dw0 = random_bf16_values(static_cast<std::size_t>(3 * FC), seed + 3, -0.1f, 0.1f);

  // CPU reference, flat layout per expert: gate (F, C), up (F, C), down (C, F).
  const std::int32_t offs[2] = {0, static_cast<std::int32_t>(R)};
  std::vector<float> y(R * C), gate(R * F), up(R * F), act(R * F), dxp(R * C), dw = dw0;
  cpu::swiglu_experts_forward<float>(y.data(), gate.data(), up.data(), act.data(), xp.data(),
                                     w.data(), w.data() + FC, w.data() + 2 * FC, 3 * FC, offs, 1,
                                     C, F);
  cpu::swiglu_experts_backward<float>(dxp.data(), dw.data(), dw.data() + FC, dw.data() + 2 * FC,
                                      dy.data(), xp.data(), gate.data(), up.data(), act.data(),
                                      w.data(), w.data() + FC, w.data() + 2 * FC, 3 * FC, offs, 1,
                                      C, F);

  TestStream stream;
  auto d_xp = upload_bf16(xp);
  auto d_w = upload_bf16(w);
  auto d_dy = upload_bf16(dy);
  DeviceBuffer<float> d_dw(dw0);
  DeviceBuffer<bf16> d_gu(R * 2 * F), d_act(R * F), d_y(R * C), d_dact(R * F), d_dxp(R * C);
  const bf16* wgu = d_w.get();           // (2F, C): gate_proj then up_proj
  const bf16* wd = d_w.get() + 2 * FC;   // (C, F)
  // forward
  kc::GemmArgs g;
  g = {};
  g.m = R, g.n = 2 * F, g.k = C, g.a = d_xp.get(), g.b = wgu, g.trans_b = true, g.c = d_gu.get();
  kc::gemm(g, stream.get());
  kc::swiglu_forward(d_act.get(), F, d_gu.get(), d_gu.get() + F, 2 * F, R, F, stream.get());
  g = {};
  g.m = R, g.n = C, g.k = F, g.a = d_act.get(), g.b = wd, g.trans_b = true, g.c = d_y.get();
  kc::gemm(g, stream.get());
  stream.sync();
  const auto gu = download_f32(d_gu);
  std::vector<float> got_gate(R * F), got_up(R * F);
  for (std::int64_t r = 0; r < R; ++r) {
    for (int f = 0; f < F; ++f) {
      got_gate[r * F + f] = gu[r * 2 * F + f];
      got_up[r * F + f] = gu[r * 2 * F + F + f];
    }
  }
  EXPECT_TRUE(all_close("gate", got_gate, gate, 1e-2f * max_abs(gate), 1e-2f));
  EXPECT_TRUE(all_close("up", got_up, up, 1e-2f * max_abs(up), 1e-2f));
  EXPECT_TRUE(all_close("act", download_f32(d_act), act, 1e-2f * max_abs(act), 2e-2f));
  EXPECT_TRUE(all_close("y", download_f32(d_y), y, 2e-2f * max_abs(y), 2e-2f));

  // backward: dact = dy·Wd; dWd += dy^T·act; dgu = swiglu'(in place); dxp = dgu·Wgu;
  // dWgu += dgu^T·xp
  g = {};
  g.m = R, g.n = F, g.k = C, g.a = d_dy.get(), g.b = wd, g.c = d_dact.get();
  kc::gemm(g, stream.get());
  g = {};
  g.m = C, g.n = F, g.k = R, g.a = d_dy.get(), g.b = d_act.get(), g.trans_a = true;
  g.c = d_dw.get() + 2 * FC, g.c_type = kc::DType::f32, g.beta = 1.0f;
  kc::gemm(g, stream.get());
  kc::swiglu_backward(d_gu.get(), d_gu.get() + F, 2 * F, d_dact.get(), F, d_gu.get(),
                      d_gu.get() + F, 2 * F, R, F, stream.get());
  g = {};
  g.m = R, g.n = C, g.k = 2 * F, g.a = d_gu.get(), g.b = wgu, g.c = d_dxp.get();
  kc::gemm(g, stream.get());
  g = {};
  g.m = 2 * F, g.n = C, g.k = R, g.a = d_gu.get(), g.b = d_xp.get(), g.trans_a = true;
  g.c = d_dw.get(), g.c_type = kc::DType::f32, g.beta = 1.0f;
  kc::gemm(g, stream.get());
  stream.sync();
  EXPECT_TRUE(all_close("dxp", download_f32(d_dxp), dxp, 3e-2f * max_abs(dxp), 3e-2f));
  const auto got_dw = d_dw.download();
  for (int part = 0; part < 3; ++part) {
    const std::vector<float> ref(dw.begin() + part * FC, dw.begin() + (part + 1) * FC);
    const std::vector<float> got(got_dw.begin() + part * FC, got_dw.begin() + (part + 1) * FC);
    const char* names[3] = {"dw_gate", "dw_up", "dw_down"};
    EXPECT_TRUE(all_close(names[part], got, ref, 3e-2f * max_abs(ref), 3e-2f));
  }
}

TEST(CudaSwiglu, ExpertMlpMatchesCpuVectorPath) {
  GHT_REQUIRE_GPU();
  run_mlp(96, 64, 128, 11);
}

TEST(CudaSwiglu, ExpertMlpMatchesCpuScalarPath) {
  GHT_REQUIRE_GPU();
  run_mlp(33, 40, 36, 21);  // F % 8 != 0: scalar element-wise path
}

// The element-wise op alone, separate (R, F) tensors, checked against the formula in fp32.
TEST(CudaSwiglu, ElementwiseSeparateTensors) {
  GHT_REQUIRE_GPU();
  const std::int64_t R = 50;
  const int F = 72;
  const auto gate = random_bf16_values(R * F, 31, -6.0f, 6.0f);
  const auto up = random_bf16_values(R * F, 32, -2.0f, 2.0f);
  const auto dact = random_bf16_values(R * F, 33);
  std::vector<float> act(R * F), dg(R * F), du(R * F);
  for (std::int64_t i = 0; i < R * F; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(gate[i])));
    act[i] = static_cast<float>(gate[i] * s * up[i]);
    du[i] = static_cast<float>(dact[i] * gate[i] * s);
    dg[i] = static_cast<float>(dact[i] * up[i] * s * (1.0 + gate[i] * (1.0 - s)));
  }
  TestStream stream;
  auto d_g = upload_bf16(gate);
  auto d_u = upload_bf16(up);
  auto d_da = upload_bf16(dact);
  DeviceBuffer<bf16> d_act(R * F), d_dg(R * F), d_du(R * F);
  kc::swiglu_forward(d_act.get(), F, d_g.get(), d_u.get(), F, R, F, stream.get());
  kc::swiglu_backward(d_dg.get(), d_du.get(), F, d_da.get(), F, d_g.get(), d_u.get(), F, R, F,
                      stream.get());
  stream.sync();
  EXPECT_TRUE(all_close("act", download_f32(d_act), act, 1e-3f, 8e-3f));
  EXPECT_TRUE(all_close("dgate", download_f32(d_dg), dg, 1e-3f, 8e-3f));
  EXPECT_TRUE(all_close("dup", download_f32(d_du), du, 1e-3f, 8e-3f));
}

TEST(CudaSwiglu, RejectsBadStrides) {
  EXPECT_THROW(kc::swiglu_forward(nullptr, 8, nullptr, nullptr, 4, 2, 8, nullptr),
               ght::logic_error);
}

}  // namespace
