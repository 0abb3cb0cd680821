// GPU test of kernels/cuda/qk_norm_rope against kernels/cpu/qk_norm_rope (fp32).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/qk_norm_rope.hpp"
#include "kernels/cuda/qk_norm_rope.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

// Documents of random length in each row, so positions restart inside rows.
std::vector<std::int32_t> random_doc_ids(int B, int T, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> len(1, T / 2 + 1);
  std::vector<std::int32_t> d(static_cast<std::size_t>(B) * T);
  for (int b = 0; b < B; ++b) {
    int id = 0, left = len(gen);
    for (int t = 0; t < T; ++t) {
      if (left-- == 0) {
        ++id;
        left = len(gen) - 1;
      }
      d[static_cast<std::size_t>(b) * T + t] = id;
    }
  }
  return d;
}

TEST(CudaQkNormRope, PositionsMatchCpu) {
  GHT_REQUIRE_GPU();
  const int B = 3, T = 257;
  const auto docs = random_doc_ids(B, T, 3);
  std::vector<std::int32_t> ref(B * T), ref_plain(B * T);
  cpu::make_positions(ref.data(), docs.data(), B, T);
  cpu::make_positions(ref_plain.data(), nullptr, B, T);
  TestStream stream;
  DeviceBuffer<std::int32_t> d_docs(docs), d_pos(ref.size()), d_plain(ref.size());
  kc::make_positions(d_pos.get(), d_docs.get(), B, T, stream.get());
  kc::make_positions(d_plain.get(), nullptr, B, T, stream.get());
  stream.sync();
  EXPECT_TRUE(all_equal("pos (documents)", d_pos.download(), ref));
  EXPECT_TRUE(all_equal("pos (plain)", d_plain.download(), ref_plain));
}

struct Shape {
  int b, t, h, d;
  double theta;
  int pad;  // extra row-stride elements (a slice of a fused qkv buffer)
};
const Shape kShapes[] = {
    {2, 64, 4, 128, 1e6, 0}, {1, 96, 3, 64, 1e4, 0}, {2, 40, 2, 48, 1e6, 16},
    {1, 4100, 1, 128, 1e6, 8},  // positions past 4096: angle precision
};

template <typename DW>
void run_case(const Shape& s, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.b << " T=" << s.t << " H=" << s.h << " D=" << s.d
                                    << " theta=" << s.theta << " pad=" << s.pad);
  const std::int64_t N = static_cast<std::int64_t>(s.b) * s.t;
  const std::int64_t hd = static_cast<std::int64_t>(s.h) * s.d, ld = hd + s.pad;
  const float eps = 1e-6f;
  const auto x = random_bf16_values(static_cast<std::size_t>(N * hd), seed, -2.0f, 2.0f);
  const auto w = random_bf16_values(s.d, seed + 1, 0.5f, 1.5f);
  const auto dout = random_bf16_values(static_cast<std::size_t>(N * hd), seed + 2);
  const auto dw0 = random_bf16_values(s.d, seed + 3);
  std::vector<std::int32_t> pos(N);
  const auto docs = random_doc_ids(s.b, s.t, seed + 4);
  cpu::make_positions(pos.data(), s.t > 1000 ? nullptr : docs.data(), s.b, s.t);

  std::vector<float> out(N * hd), rstd(N * s.h), dx(N * hd), dw = dw0;
  cpu::qk_norm_rope_forward<float>(out.data(), rstd.data(), x.data(), w.data(), pos.data(), N,
                                   s.h, s.d, eps, s.theta);
  cpu::qk_norm_rope_backward<float>(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                    rstd.data(), pos.data(), N, s.h, s.d, s.theta);

  // Strided device copies: row t of (N, H·D) at t·ld.
  auto strided = [&](const std::vector<float>& v) {
    std::vector<float> o(static_cast<std::size_t>(N * ld), 0.5f);
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t j = 0; j < hd; ++j) o[t * ld + j] = v[t * hd + j];
    return o;
  };
  auto packed = [&](const std::vector<float>& v) {
    std::vector<float> o(static_cast<std::size_t>(N * hd));
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t j = 0; j < hd; ++j) o[t * hd + j] = v[t * ld + j];
    return o;
  };
  TestStream stream;
  auto d_x = upload_bf16(strided(x));
  auto d_w = upload_bf16(w);
  auto d_dout = upload_bf16(strided(dout));
  DeviceBuffer<std::int32_t> d_pos(pos);
  DeviceBuffer<bf16> d_out(N * ld), d_dx(N * ld);
  DeviceBuffer<float> d_rstd(N * s.h);
  d_out.poison();
  d_dx.poison();
  kc::qk_norm_rope_forward(d_out.get(), ld, d_rstd.get(), d_x.get(), ld, d_w.get(), d_pos.get(), N,
                           s.h, s.d, eps, s.theta, stream.get());
  std::vector<float> got_dw;
  if constexpr (sizeof(DW) == 4) {
    DeviceBuffer<float> d_dw(dw0);
    kc::qk_norm_rope_backward(d_dx.get(), ld, d_dw.get(), d_dout.get(), ld, d_x.get(), ld,
                              d_w.get(), d_rstd.get(), d_pos.get(), N, s.h, s.d, s.theta,
                              stream.get());
    stream.sync();
    got_dw = d_dw.download();
    EXPECT_TRUE(all_close("dw", got_dw, dw, 1e-3f, 1e-4f));
  } else {
    auto d_dw = upload_bf16(dw0);
    kc::qk_norm_rope_backward(d_dx.get(), ld, d_dw.get(), d_dout.get(), ld, d_x.get(), ld,
                              d_w.get(), d_rstd.get(), d_pos.get(), N, s.h, s.d, s.theta,
                              stream.get());
    stream.sync();
    got_dw = download_f32(d_dw);
    EXPECT_TRUE(all_close("dw", got_dw, dw, 1e-3f, 8e-3f));
  }
  EXPECT_TRUE(all_close("rstd", d_rstd.download(), rstd, 1e-5f, 1e-5f));
  EXPECT_TRUE(all_close("out", packed(download_f32(d_out)), out, 2e-3f, 8e-3f));
  EXPECT_TRUE(all_close("dx", packed(download_f32(d_dx)), dx, 2e-3f, 8e-3f));
}

TEST(CudaQkNormRope, ForwardBackwardMatchCpuFp32Dw) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 10;
  for (const auto& s : kShapes) run_case<float>(s, seed += 10);
}

TEST(CudaQkNormRope, ForwardBackwardMatchCpuBf16Dw) {
  GHT_REQUIRE_GPU();
  run_case<bf16>(kShapes[0], 500);
}

TEST(CudaQkNormRope, InPlaceForward) {
  GHT_REQUIRE_GPU();
  const std::int64_t N = 33;
  const int H = 2, D = 128;
  const auto x = random_bf16_values(N * H * D, 71);
  const auto w = random_bf16_values(D, 72, 0.5f, 1.5f);
  std::vector<std::int32_t> pos(N);
  for (std::int64_t i = 0; i < N; ++i) pos[i] = static_cast<std::int32_t>(3 * i);
  std::vector<float> out(x.size()), rstd(N * H);
  cpu::qk_norm_rope_forward<float>(out.data(), rstd.data(), x.data(), w.data(), pos.data(), N, H,
                                   D, 1e-6, 1e6);
  TestStream stream;
  auto d_x = upload_bf16(x);
  auto d_w = upload_bf16(w);
  DeviceBuffer<std::int32_t> d_pos(pos);
  DeviceBuffer<float> d_rstd(rstd.size());
  kc::qk_norm_rope_forward(d_x.get(), 0, d_rstd.get(), d_x.get(), 0, d_w.get(), d_pos.get(), N, H,
                           D, 1e-6f, 1e6, stream.get());
  stream.sync();
  EXPECT_TRUE(all_close("out (in place)", download_f32(d_x), out, 2e-3f, 8e-3f));
}

TEST(CudaQkNormRope, RejectsOddHeadDim) {
  EXPECT_THROW(kc::qk_norm_rope_forward(nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr, 4, 2,
                                        63, 1e-6f, 1e4, nullptr),
               ght::logic_error);
  EXPECT_THROW(kc::qk_norm_rope_forward(nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr, 4, 2,
                                        512, 1e-6f, 1e4, nullptr),
               ght::logic_error);
}

}  // namespace
