// GPU test of kernels/cuda/attention (cuDNN SDPA through cudnn-frontend and through the
// hand-written backend graph, and the fallback kernels) against kernels/cpu/attention (fp32), and
// a CPU check that the acceptance bounds reject the mistakes an attention path can make.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

// Acceptance bounds |got - ref| <= tol + |ref|·eps of every comparison below. cuDNN feeds bf16 P
// and dS to its tensor-core matmuls (~2^-8 relative per term), hence the gradients' bound
// relative to the tensor's largest value. TolerancesCatchWrongResults shows they are tight
// enough to catch a wrong mask, scale, head mapping, statistic or GQA reduction.
constexpr float kOutTol = 1e-2f, kOutEps = 1e-2f;
constexpr float kLseTol = 2e-3f, kLseEps = 1e-3f;
constexpr float kGradRel = 2e-2f;  // tol = kGradRel·max|ref|, eps = kGradRel

::testing::AssertionResult out_close(const std::vector<float>& got, const std::vector<float>& ref) {
  return all_close("out", got, ref, kOutTol, kOutEps);
}
::testing::AssertionResult lse_close(const std::vector<float>& got, const std::vector<float>& ref) {
  return all_close("lse", got, ref, kLseTol, kLseEps);
}
::testing::AssertionResult grad_close(const char* what, const std::vector<float>& got,
                                      const std::vector<float>& ref) {
  return all_close(what, got, ref, kGradRel * max_abs(ref), kGradRel);
}

// What a request runs: cudnn is cudnn-frontend where the build has it, else the backend graph.
kc::AttentionImpl expected_run(kc::AttentionImpl impl) {
  if (impl == kc::AttentionImpl::cudnn && !kc::detail::cudnn_frontend_attention_compiled())
    return kc::AttentionImpl::cudnn_backend;
  return impl;
}

struct Case {
  int B, T, H, KV, D;
  bool docs = false;
  bool fused_qkv = false;  // q, k, v as slices of one (B·T, (H + 2·KV)·D) buffer
};

std::vector<std::int32_t> doc_ids(int B, int T, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> len(1, T / 3 + 1);
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

// Packed (token, head, dim) host tensor <-> strided device layout.
std::vector<float> scatter_rows(const std::vector<float>& packed, std::int64_t rows,
                                std::int64_t width, std::int64_t ld, std::int64_t offset,
                                std::vector<float> into) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < width; ++j) into[r * ld + offset + j] = packed[r * width + j];
  return into;
}
std::vector<float> gather_rows(const std::vector<float>& strided, std::int64_t rows,
                               std::int64_t width, std::int64_t ld, std::int64_t offset) {
  std::vector<float> out(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < width; ++j) out[r * width + j] = strided[r * ld + offset + j];
  return out;
}

void run_case(const Case& c, kc::AttentionImpl impl, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "impl=" << kc::to_string(impl) << " B=" << c.B << " T=" << c.T
                                    << " H=" << c.H << " KV=" << c.KV << " D=" << c.D
                                    << " docs=" << c.docs << " fused_qkv=" << c.fused_qkv);
  const std::int64_t N = static_cast<std::int64_t>(c.B) * c.T;
  const std::int64_t qd = static_cast<std::int64_t>(c.H) * c.D, kd = static_cast<std::int64_t>(c.KV) * c.D;
  const auto q = random_bf16_values(N * qd, seed);
  const auto k = random_bf16_values(N * kd, seed + 1);
  const auto v = random_bf16_values(N * kd, seed + 2);
  const auto dout = random_bf16_values(N * qd, seed + 3);
  const auto docs = doc_ids(c.B, c.T, seed + 4);
  const std::int32_t* h_docs = c.docs ? docs.data() : nullptr;

  std::vector<float> out(N * qd), lse(static_cast<std::size_t>(c.B) * c.H * c.T);
  cpu::attention_forward<float>(out.data(), lse.data(), q.data(), k.data(), v.data(), h_docs, c.B,
                                c.T, c.H, c.KV, c.D);

  kc::AttentionShape s{c.B, c.T, c.H, c.KV, c.D};
  const std::int64_t ld = c.fused_qkv ? qd + 2 * kd : 0;
  const std::int64_t q_off = 0, k_off = qd, v_off = qd + kd;
  TestStream stream;
  DeviceBuffer<bf16> d_qkv, d_q, d_k, d_v, d_dqkv, d_dq, d_dk, d_dv;
  const bf16 *pq, *pk, *pv;
  bf16 *pdq, *pdk, *pdv;
  if (c.fused_qkv) {
    s.q_row = s.k_row = s.v_row = ld;
    std::vector<float> all(static_cast<std::size_t>(N * ld), 0.25f);
    all = scatter_rows(q, N, qd, ld, q_off, all);
    all = scatter_rows(k, N, kd, ld, k_off, all);
    all = scatter_rows(v, N, kd, ld, v_off, all);
    d_qkv = upload_bf16(all);
    d_dqkv = DeviceBuffer<bf16>(all.size());
    d_dqkv.poison();
    pq = d_qkv.get() + q_off;
    pk = d_qkv.get() + k_off;
    pv = d_qkv.get() + v_off;
    pdq = d_dqkv.get() + q_off;
    pdk = d_dqkv.get() + k_off;
    pdv = d_dqkv.get() + v_off;
  } else {
    d_q = upload_bf16(q);
    d_k = upload_bf16(k);
    d_v = upload_bf16(v);
    d_dq = DeviceBuffer<bf16>(q.size());
    d_dk = DeviceBuffer<bf16>(k.size());
    d_dv = DeviceBuffer<bf16>(v.size());
    d_dq.poison();
    d_dk.poison();
    d_dv.poison();
    pq = d_q.get();
    pk = d_k.get();
    pv = d_v.get();
    pdq = d_dq.get();
    pdk = d_dk.get();
    pdv = d_dv.get();
  }
  DeviceBuffer<std::int32_t> d_docs(docs);
  const std::int32_t* g_docs = c.docs ? d_docs.get() : nullptr;
  DeviceBuffer<bf16> d_out(N * qd);
  DeviceBuffer<float> d_lse(lse.size());
  d_out.poison();
  const auto ran = kc::attention_forward(d_out.get(), d_lse.get(), pq, pk, pv, g_docs, s, impl,
                                         stream.get());
  stream.sync();
  if (impl != kc::AttentionImpl::automatic) EXPECT_EQ(ran, expected_run(impl));
  std::printf("[ attention ] forward ran %s\n", std::string(kc::to_string(ran)).c_str());
  const auto got_out = download_f32(d_out);
  const auto got_lse = d_lse.download();
  EXPECT_TRUE(out_close(got_out, out));
  EXPECT_TRUE(lse_close(got_lse, lse));

  // Backward from the GPU forward's own (bf16) out and lse, fed to both sides.
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_backward<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                 v.data(), got_out.data(), got_lse.data(), h_docs, c.B, c.T, c.H,
                                 c.KV, c.D);
  auto d_dout = upload_bf16(dout);
  const auto ran_b = kc::attention_backward(pdq, pdk, pdv, d_dout.get(), pq, pk, pv, d_out.get(),
                                            d_lse.get(), g_docs, s, impl, stream.get());
  stream.sync();
  if (impl != kc::AttentionImpl::automatic) EXPECT_EQ(ran_b, expected_run(impl));
  std::vector<float> gdq, gdk, gdv;
  if (c.fused_qkv) {
    const auto all = download_f32(d_dqkv);
    gdq = gather_rows(all, N, qd, ld, q_off);
    gdk = gather_rows(all, N, kd, ld, k_off);
    gdv = gather_rows(all, N, kd, ld, v_off);
  } else {
    gdq = download_f32(d_dq);
    gdk = download_f32(d_dk);
    gdv = download_f32(d_dv);
  }
  EXPECT_TRUE(grad_close("dq", gdq, dq));
  EXPECT_TRUE(grad_close("dk", gdk, dk));
  EXPECT_TRUE(grad_close("dv", gdv, dv));
}

const Case kCudnnCases[] = {
    {2, 100, 4, 2, 64},            // GQA, T not a tile multiple
    {1, 257, 4, 1, 128},           // MQA, head_dim 128
    {2, 64, 2, 2, 128, false, true},  // MHA, q/k/v slices of a fused qkv buffer
    {1, 130, 8, 2, 64, false, true},
};

TEST(CudaAttention, FallbackMatchesCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& c : kCudnnCases) run_case(c, kc::AttentionImpl::fallback, seed += 10);
  run_case({2, 96, 2, 2, 32, true}, kc::AttentionImpl::fallback, 500);   // document masking
  run_case({1, 70, 3, 1, 48, true}, kc::AttentionImpl::fallback, 510);
  run_case({1, 40, 2, 1, 256}, kc::AttentionImpl::fallback, 520);       // largest head_dim
}

// cudnn-frontend's SDPA nodes (where built; else this is the backend graph again). The first case
// runs a second time on new buffers: the cached graph must take the new pointers.
TEST(CudaAttention, CudnnMatchesCpu) {
  GHT_REQUIRE_GPU();
  std::printf("[ attention ] this build %s cudnn-frontend\n",
              kc::detail::cudnn_frontend_attention_compiled() ? "has" : "does not have");
  std::uint32_t seed = 100;
  for (const auto& c : kCudnnCases) run_case(c, kc::AttentionImpl::cudnn, seed += 10);
  run_case(kCudnnCases[0], kc::AttentionImpl::cudnn, 190);
}

TEST(CudaAttention, CudnnBackendMatchesCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 200;
  for (const auto& c : kCudnnCases) run_case(c, kc::AttentionImpl::cudnn_backend, seed += 10);
}

TEST(CudaAttention, AutomaticMatchesCpu) {
  GHT_REQUIRE_GPU();
  run_case(kCudnnCases[0], kc::AttentionImpl::automatic, 300);
  run_case({2, 96, 2, 2, 32, true}, kc::AttentionImpl::automatic, 310);  // must fall back
}

// ---- the bounds above reject wrong attention (CPU only) -------------------------------------

// Head h of a (B, T, heads, D) tensor as a (B, T, 1, D) tensor, and back.
std::vector<float> head_of(const std::vector<float>& x, int B, int T, int heads, int D, int h) {
  std::vector<float> out(static_cast<std::size_t>(B) * T * D);
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(B) * T; ++r)
    for (int d = 0; d < D; ++d) out[r * D + d] = x[(r * heads + h) * D + d];
  return out;
}
void put_head(std::vector<float>& x, const std::vector<float>& one, int B, int T, int heads, int D,
              int h, bool add) {
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(B) * T; ++r)
    for (int d = 0; d < D; ++d) {
      float& dst = x[(r * heads + h) * D + d];
      dst = (add ? dst : 0.0f) + one[r * D + d];
    }
}

TEST(CudaAttention, TolerancesCatchWrongResults) {
  const int B = 2, T = 100, H = 4, KV = 2, D = 64, G = H / KV;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const auto q = random_bf16_values(N * H * D, 61);
  const auto k = random_bf16_values(N * KV * D, 62);
  const auto v = random_bf16_values(N * KV * D, 63);
  const auto g = random_bf16_values(N * H * D, 64);
  auto forward = [&](const std::vector<float>& qq, const std::int32_t* docs, std::vector<float>& o,
                     std::vector<float>& l) {
    o.assign(q.size(), 0.0f);
    l.assign(static_cast<std::size_t>(B) * H * T, 0.0f);
    cpu::attention_forward<float>(o.data(), l.data(), qq.data(), k.data(), v.data(), docs, B, T, H,
                                  KV, D);
  };
  std::vector<float> out, lse, bad_out, bad_lse;
  forward(q, nullptr, out, lse);
  ASSERT_TRUE(out_close(out, out));

  // Scale 1/D instead of 1/sqrt(D).
  std::vector<float> q_small(q);
  for (auto& x : q_small) x /= std::sqrt(static_cast<float>(D));
  forward(q_small, nullptr, bad_out, bad_lse);
  EXPECT_FALSE(out_close(bad_out, out)) << "a wrong softmax scale passes the output bound";
  EXPECT_FALSE(lse_close(bad_lse, lse)) << "a wrong softmax scale passes the lse bound";

  // A mask that hides keys it should not (documents of 50 tokens).
  std::vector<std::int32_t> docs(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) docs[i] = static_cast<std::int32_t>((i % T) / 50);
  forward(q, docs.data(), bad_out, bad_lse);
  EXPECT_FALSE(out_close(bad_out, out)) << "a wrong mask passes the output bound";

  // Statistics in log2 instead of the natural log.
  std::vector<float> lse2(lse);
  for (auto& x : lse2) x *= 1.4426950f;
  EXPECT_FALSE(lse_close(lse2, lse)) << "log2 stats pass the lse bound";

  // Query head h paired with kv head h % KV instead of h / (H/KV), one head at a time.
  std::vector<float> swapped(q.size(), 0.0f);
  for (int h = 0; h < H; ++h) {
    std::vector<float> o1(static_cast<std::size_t>(N) * D), l1(static_cast<std::size_t>(B) * T);
    const auto qh = head_of(q, B, T, H, D, h), kh = head_of(k, B, T, KV, D, h % KV),
               vh = head_of(v, B, T, KV, D, h % KV);
    cpu::attention_forward<float>(o1.data(), l1.data(), qh.data(), kh.data(), vh.data(), nullptr, B,
                                  T, 1, 1, D);
    put_head(swapped, o1, B, T, H, D, h, false);
  }
  EXPECT_FALSE(out_close(swapped, out)) << "a wrong GQA head mapping passes the output bound";

  // Backward: the reference, then dK/dV without the sum over a kv head's query heads, and the
  // backward fed statistics off by 0.1.
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_backward<float>(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                 v.data(), out.data(), lse.data(), nullptr, B, T, H, KV, D);
  std::vector<float> dk_one(k.size(), 0.0f), dv_one(v.size(), 0.0f);
  for (int kvh = 0; kvh < KV; ++kvh) {
    const int h = kvh * G;  // only the first query head of the group
    const auto qh = head_of(q, B, T, H, D, h), kh = head_of(k, B, T, KV, D, kvh),
               vh = head_of(v, B, T, KV, D, kvh), gh = head_of(g, B, T, H, D, h),
               oh = head_of(out, B, T, H, D, h);
    std::vector<float> lh(static_cast<std::size_t>(B) * T);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) lh[b * T + t] = lse[(static_cast<std::size_t>(b) * H + h) * T + t];
    std::vector<float> dq1(qh.size()), dk1(kh.size()), dv1(vh.size());
    cpu::attention_backward<float>(dq1.data(), dk1.data(), dv1.data(), gh.data(), qh.data(),
                                   kh.data(), vh.data(), oh.data(), lh.data(), nullptr, B, T, 1, 1, D);
    put_head(dk_one, dk1, B, T, KV, D, kvh, false);
    put_head(dv_one, dv1, B, T, KV, D, kvh, false);
  }
  EXPECT_FALSE(grad_close("dk", dk_one, dk)) << "dK without the GQA sum passes the gradient bound";
  EXPECT_FALSE(grad_close("dv", dv_one, dv)) << "dV without the GQA sum passes the gradient bound";
  std::vector<float> lse_off(lse);
  for (auto& x : lse_off) x += 0.1f;
  std::vector<float> dq_b(q.size()), dk_b(k.size()), dv_b(v.size());
  cpu::attention_backward<float>(dq_b.data(), dk_b.data(), dv_b.data(), g.data(), q.data(),
                                 k.data(), v.data(), out.data(), lse_off.data(), nullptr, B, T, H,
                                 KV, D);
  EXPECT_FALSE(grad_close("dv", dv_b, dv)) << "wrong statistics pass the dV bound";
  EXPECT_FALSE(grad_close("dq", dq_b, dq)) << "wrong statistics pass the dQ bound";
}

TEST(CudaAttention, FallbackBackwardIsDeterministic) {
  GHT_REQUIRE_GPU();
  const int B = 1, T = 128, H = 4, KV = 2, D = 64;
  const std::int64_t N = B * T;
  const auto q = random_bf16_values(N * H * D, 901);
  const auto k = random_bf16_values(N * KV * D, 902);
  const auto v = random_bf16_values(N * KV * D, 903);
  const auto g = random_bf16_values(N * H * D, 904);
  const kc::AttentionShape s{B, T, H, KV, D};
  TestStream stream;
  auto d_q = upload_bf16(q);
  auto d_k = upload_bf16(k);
  auto d_v = upload_bf16(v);
  auto d_g = upload_bf16(g);
  DeviceBuffer<bf16> d_out(q.size()), d_dq(q.size()), d_dk(k.size()), d_dv(v.size());
  DeviceBuffer<float> d_lse(static_cast<std::size_t>(B) * H * T);
  kc::attention_forward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), nullptr, s,
                        kc::AttentionImpl::fallback, stream.get());
  std::vector<bf16> first;
  for (int rep = 0; rep < 2; ++rep) {
    kc::attention_backward(d_dq.get(), d_dk.get(), d_dv.get(), d_g.get(), d_q.get(), d_k.get(),
                           d_v.get(), d_out.get(), d_lse.get(), nullptr, s,
                           kc::AttentionImpl::fallback, stream.get());
    stream.sync();
    auto dk = d_dk.download();
    if (rep == 0) {
      first = dk;
    } else {
      EXPECT_TRUE(all_close("dk repeat", to_f32(dk), to_f32(first), 0.0f, 0.0f));
    }
  }
}

TEST(CudaAttention, CudnnRejectsDocumentMasks) {
  const kc::AttentionShape s{1, 8, 2, 1, 64};
  const std::int32_t fake = 0;
  for (auto impl : {kc::AttentionImpl::cudnn, kc::AttentionImpl::cudnn_backend}) {
    EXPECT_THROW(kc::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, &fake, s, impl,
                                       nullptr),
                 ght::logic_error);
  }
  const kc::AttentionShape bad{1, 8, 3, 2, 64};  // H % KV != 0
  EXPECT_THROW(kc::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, bad,
                                     kc::AttentionImpl::fallback, nullptr),
               ght::logic_error);
}

}  // namespace
