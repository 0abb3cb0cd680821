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

// A layer's q and k as the model holds them: slices of one (N, (H + 2·KV)·D) qkv buffer in, of
// one (N, (H + KV)·D) buffer out. The fused launches (both sets at once) must match the CPU op
// per set and be bit-identical to one call per set.
template <typename DW>
void run_fused(int B, int T, int H, int KV, int D, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "fused q/k: B=" << B << " T=" << T << " H=" << H
                                    << " KV=" << KV << " D=" << D);
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const std::int64_t HD = static_cast<std::int64_t>(H) * D, KD = static_cast<std::int64_t>(KV) * D;
  const std::int64_t QKV = HD + 2 * KD, QK = HD + KD;
  const float eps = 1e-6f;
  const double theta = 1e6;
  const auto qkv = random_bf16_values(static_cast<std::size_t>(N * QKV), seed, -2.0f, 2.0f);
  const auto dqk = random_bf16_values(static_cast<std::size_t>(N * QK), seed + 1);
  const auto wq = random_bf16_values(D, seed + 2, 0.5f, 1.5f);
  const auto wk = random_bf16_values(D, seed + 3, 0.5f, 1.5f);
  const auto dw0 = random_bf16_values(D, seed + 4);
  std::vector<std::int32_t> pos(N);
  const auto docs = random_doc_ids(B, T, seed + 5);
  cpu::make_positions(pos.data(), docs.data(), B, T);
  // Columns [off, off + w) of an (N, ld) matrix.
  auto cols = [&](const std::vector<float>& m, std::int64_t ld, std::int64_t off, std::int64_t w) {
    std::vector<float> o(static_cast<std::size_t>(N * w));
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t j = 0; j < w; ++j) o[t * w + j] = m[t * ld + off + j];
    return o;
  };

  TestStream stream;
  auto d_qkv = upload_bf16(qkv);
  auto d_dqk = upload_bf16(dqk);
  auto d_wq = upload_bf16(wq);
  auto d_wk = upload_bf16(wk);
  DeviceBuffer<std::int32_t> d_pos(pos);
  struct Outputs {
    DeviceBuffer<bf16> qk, dqkv;
    DeviceBuffer<float> q_rstd, k_rstd;
    DeviceBuffer<DW> dwq, dwk;
  };
  auto run = [&](bool fused) {
    Outputs o{DeviceBuffer<bf16>(N * QK), DeviceBuffer<bf16>(N * QKV), DeviceBuffer<float>(N * H),
              DeviceBuffer<float>(N * KV), DeviceBuffer<DW>(D), DeviceBuffer<DW>(D)};
    o.qk.poison();
    o.dqkv.poison();
    if constexpr (sizeof(DW) == 4) {
      o.dwq.upload(dw0);
      o.dwk.upload(dw0);
    } else {
      o.dwq.upload(to_bf16(dw0));
      o.dwk.upload(to_bf16(dw0));
    }
    const kc::QkNormRopeHeads q{o.qk.get(), QK, o.q_rstd.get(), d_qkv.get(), QKV, d_wq.get(), H};
    const kc::QkNormRopeHeads k{o.qk.get() + HD, QK, o.k_rstd.get(), d_qkv.get() + HD, QKV,
                                d_wk.get(), KV};
    const kc::QkNormRopeGradHeads<DW> qg{o.dqkv.get(), QKV, o.dwq.get(), d_dqk.get(), QK,
                                         d_qkv.get(), QKV, d_wq.get(), o.q_rstd.get(), H};
    const kc::QkNormRopeGradHeads<DW> kg{o.dqkv.get() + HD, QKV, o.dwk.get(), d_dqk.get() + HD, QK,
                                         d_qkv.get() + HD, QKV, d_wk.get(), o.k_rstd.get(), KV};
    if (fused) {
      kc::qk_norm_rope_forward_qk(q, k, d_pos.get(), N, D, eps, theta, stream.get());
      kc::qk_norm_rope_backward_qk(qg, kg, d_pos.get(), N, D, theta, stream.get());
    } else {
      kc::qk_norm_rope_forward_qk(q, {}, d_pos.get(), N, D, eps, theta, stream.get());
      kc::qk_norm_rope_forward_qk(k, {}, d_pos.get(), N, D, eps, theta, stream.get());
      kc::qk_norm_rope_backward_qk(qg, {}, d_pos.get(), N, D, theta, stream.get());
      kc::qk_norm_rope_backward_qk(kg, {}, d_pos.get(), N, D, theta, stream.get());
    }
    stream.sync();
    return o;
  };
  const Outputs f = run(true), sep = run(false);

  const struct {
    const char* name;
    std::int64_t in_off, out_off;
    int heads;
    const std::vector<float>& w;
    const DeviceBuffer<float>& rstd;
    const DeviceBuffer<DW>& dw;
  } sets[] = {{"q", 0, 0, H, wq, f.q_rstd, f.dwq}, {"k", HD, HD, KV, wk, f.k_rstd, f.dwk}};
  const auto got_qk = download_f32(f.qk), got_dqkv = download_f32(f.dqkv);
  for (const auto& st : sets) {
    SCOPED_TRACE(st.name);
    const std::int64_t w = static_cast<std::int64_t>(st.heads) * D;
    const auto x = cols(qkv, QKV, st.in_off, w), g = cols(dqk, QK, st.out_off, w);
    std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(N) * st.heads), dx(x.size()),
        dw = dw0;
    cpu::qk_norm_rope_forward<float>(out.data(), rstd.data(), x.data(), st.w.data(), pos.data(), N,
                                     st.heads, D, eps, theta);
    cpu::qk_norm_rope_backward<float>(dx.data(), dw.data(), g.data(), x.data(), st.w.data(),
                                      rstd.data(), pos.data(), N, st.heads, D, theta);
    EXPECT_TRUE(all_close("rstd", st.rstd.download(), rstd, 1e-5f, 1e-5f));
    EXPECT_TRUE(all_close("out", cols(got_qk, QK, st.out_off, w), out, 2e-3f, 8e-3f));
    EXPECT_TRUE(all_close("dx", cols(got_dqkv, QKV, st.in_off, w), dx, 2e-3f, 8e-3f));
    if constexpr (sizeof(DW) == 4) {
      EXPECT_TRUE(all_close("dw", st.dw.download(), dw, 1e-3f, 1e-4f));
    } else {
      EXPECT_TRUE(all_close("dw", to_f32(st.dw.download()), dw, 1e-3f, 8e-3f));
    }
  }
  // The v columns of dqkv are not written by either path: compare only what they write.
  auto qk_part = [&](const std::vector<float>& m) { return cols(m, QKV, 0, QK); };
  EXPECT_TRUE(all_close("fused vs separate: out", got_qk, download_f32(sep.qk), 0.0f, 0.0f));
  EXPECT_TRUE(all_close("fused vs separate: dx", qk_part(got_dqkv), qk_part(download_f32(sep.dqkv)),
                        0.0f, 0.0f));
  EXPECT_TRUE(all_close("fused vs separate: q rstd", f.q_rstd.download(), sep.q_rstd.download(), 0.0f, 0.0f));
  EXPECT_TRUE(all_close("fused vs separate: k rstd", f.k_rstd.download(), sep.k_rstd.download(), 0.0f, 0.0f));
  if constexpr (sizeof(DW) == 4) {
    EXPECT_TRUE(all_close("fused vs separate: dwq", f.dwq.download(), sep.dwq.download(), 0.0f, 0.0f));
    EXPECT_TRUE(all_close("fused vs separate: dwk", f.dwk.download(), sep.dwk.download(), 0.0f, 0.0f));
  } else {
    EXPECT_TRUE(all_close("fused vs separate: dwq", to_f32(f.dwq.download()), to_f32(sep.dwq.download()), 0.0f, 0.0f));
    EXPECT_TRUE(all_close("fused vs separate: dwk", to_f32(f.dwk.download()), to_f32(sep.dwk.download()), 0.0f, 0.0f));
  }
}

TEST(CudaQkNormRope, FusedQkMatchesCpuAndSeparateCalls) {
  GHT_REQUIRE_GPU();
  run_fused<float>(2, 64, 8, 2, 128, 900);   // GQA, the model's head_dim
  run_fused<float>(1, 9000, 4, 1, 64, 910);  // > 16·512 tokens: warps take several tokens
  run_fused<float>(3, 50, 3, 3, 48, 920);    // MHA, D/2 < 32
  run_fused<bf16>(2, 64, 8, 2, 128, 930);
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
