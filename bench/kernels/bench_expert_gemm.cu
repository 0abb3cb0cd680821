// Expert GEMM benchmark: every GroupedGemmImpl on the MoE shapes of bench-h200 (and the seed's
// HARDWARE.md reference shape, and four sweep shapes' layers), against a dense cuBLASLt GEMM
// with the same total FLOPs measured in the same run. Prints a table last and writes the full
// results as JSON.
//
//   bench_expert_gemm [--json PATH] [--iters N]
//
// FLOPs of one grouped GEMM: 2·R·n·k (var-M) or 2·m·n·R (var-K); bytes: see expert_gemm.hpp.
// "loop+sync" and "grouped+sync" include the download of the device offsets (one stream sync),
// as the trainer pays it when it does not keep host counts; the plain rows get host offsets.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/expert_gemm.hpp"
#include "kernels/cuda/gemm.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;
using bf16 = __nv_bfloat16;

struct Shape {
  std::string name;
  int experts, top_k, tokens;  // R = tokens·top_k rows in expert order
  int d_model, ffn;
  double skew;                 // 0 = uniform routing; larger = more tokens on low experts
};

struct Row {
  std::string shape, gemm, impl;
  double ms = 0, tflops = 0, dense_tflops = 0;
  std::string note;
};

std::vector<std::int32_t> make_offsets(const Shape& s, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> p(s.experts);
  for (int e = 0; e < s.experts; ++e) p[e] = std::exp(-s.skew * e / s.experts);
  std::discrete_distribution<int> d(p.begin(), p.end());
  std::vector<std::int32_t> counts(s.experts, 0);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(s.tokens) * s.top_k; ++i) ++counts[d(gen)];
  std::vector<std::int32_t> off(s.experts + 1, 0);
  for (int e = 0; e < s.experts; ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

void bench_shape(const Shape& s, int iters, cudaStream_t stream, std::vector<Row>& rows) {
  const auto off = make_offsets(s, 1234);
  const int E = s.experts;
  const std::int64_t R = off[E], C = s.d_model, F = s.ffn;
  std::printf("# %s: E=%d top_k=%d tokens=%d R=%lld d_model=%lld ffn=%lld rows/expert min %d max %d\n",
              s.name.c_str(), E, s.top_k, s.tokens, static_cast<long long>(R),
              static_cast<long long>(C), static_cast<long long>(F),
              [&] { int m = 1 << 30; for (int e = 0; e < E; ++e) m = std::min(m, off[e + 1] - off[e]); return m; }(),
              [&] { int m = 0; for (int e = 0; e < E; ++e) m = std::max(m, off[e + 1] - off[e]); return m; }());
  std::int32_t* d_off = dev_alloc<std::int32_t>(off.size());
  GHT_CUDA_TRY(cudaMemcpy(d_off, off.data(), off.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  const std::int64_t stride = 3 * F * C;  // flat per-expert layout: gate, up, down
  bf16* w = dev_alloc<bf16>(static_cast<std::size_t>(E * stride));
  bf16* x = dev_alloc<bf16>(static_cast<std::size_t>(R * std::max(C, 2 * F)));
  bf16* y = dev_alloc<bf16>(static_cast<std::size_t>(R * std::max(C, 2 * F)));
  bf16* dw16 = dev_alloc<bf16>(static_cast<std::size_t>(E * stride));
  float* dw32 = dev_alloc<float>(static_cast<std::size_t>(E * stride));
  fill(w, static_cast<std::size_t>(E * stride), 1);
  fill(x, static_cast<std::size_t>(R * std::max(C, 2 * F)), 2);
  GHT_CUDA_TRY(cudaMemset(dw32, 0, static_cast<std::size_t>(E * stride) * sizeof(float)));
  GHT_CUDA_TRY(cudaMemset(dw16, 0, static_cast<std::size_t>(E * stride) * sizeof(bf16)));

  struct VarMCase { const char* name; std::int64_t n, k; bool trans_b; std::int64_t b_off; };
  const VarMCase vm[] = {
      {"fwd gate_up  (R,C)x(2F,C)^T", 2 * F, C, true, 0},
      {"fwd down     (R,F)x(C,F)^T", C, F, true, 2 * F * C},
      {"bwd dact     (R,C)x(C,F)", F, C, false, 2 * F * C},
      {"bwd dxp      (R,2F)x(2F,C)", C, 2 * F, false, 0},
  };
  struct VarKCase { const char* name; std::int64_t m, n, c_off; };
  const VarKCase vk[] = {
      {"wgrad dWgu   (2F,R)x(R,C)", 2 * F, C, 0},
      {"wgrad dWd    (C,R)x(R,F)", C, F, 2 * F * C},
  };
  std::vector<kc::GroupedGemmImpl> impls = {kc::GroupedGemmImpl::cublaslt_loop,
                                             kc::GroupedGemmImpl::cublas_grouped,
                                             kc::GroupedGemmImpl::custom,
                                             kc::GroupedGemmImpl::cublaslt_streams};
  if (kc::cutlass_available()) impls.push_back(kc::GroupedGemmImpl::cutlass);

  auto dense = [&](std::int64_t m, std::int64_t n, std::int64_t k, bool tb, kc::DType ct) {
    // The same FLOPs as one dense GEMM: rows R stacked, one weight.
    kc::GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = x;
    g.b = w;
    g.trans_b = tb;
    g.c = ct == kc::DType::f32 ? static_cast<void*>(dw32) : static_cast<void*>(y);
    g.c_type = ct;
    const double ms = time_ms(stream, iters, [&] { kc::gemm(g, stream); });
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12;
  };

  for (const auto& c : vm) {
    const double flops = 2.0 * R * c.n * c.k;
    const double dense_tf = dense(R, c.n, c.k, c.trans_b, kc::DType::bf16);
    for (auto impl : impls) {
      for (int with_sync = 0; with_sync < 2; ++with_sync) {
        if (!kc::needs_host_offsets(impl) && with_sync) continue;
        kc::GroupedGemmVarM g;
        g.n = c.n;
        g.k = c.k;
        g.a = x;
        g.b = w + c.b_off;
        g.stride_b = stride;
        g.trans_b = c.trans_b;
        g.c = y;
        kc::GroupOffsets o;
        o.groups = E;
        o.device = d_off;
        o.host = with_sync ? nullptr : off.data();
        o.max_rows = R;
        Row r;
        r.shape = s.name;
        r.gemm = c.name;
        r.impl = std::string(kc::to_string(impl)) + (with_sync ? "+sync" : "");
        try {
          r.ms = time_ms(stream, iters, [&] { kc::grouped_gemm(g, o, impl, stream); });
          r.tflops = flops / (r.ms * 1e-3) / 1e12;
        } catch (const std::exception& e) {
          r.note = e.what();
        }
        r.dense_tflops = dense_tf;
        rows.push_back(r);
      }
    }
  }
  for (const auto& c : vk) {
    const double flops = 2.0 * c.m * c.n * R;
    for (auto ct : {kc::DType::f32, kc::DType::bf16}) {
      // Dense reference: one (m, n) weight gradient over all R rows, transposed A.
      kc::GemmArgs d;
      d.m = c.m;
      d.n = c.n;
      d.k = R;
      d.a = x;
      d.trans_a = true;
      d.b = y;
      d.c = ct == kc::DType::f32 ? static_cast<void*>(dw32) : static_cast<void*>(dw16);
      d.c_type = ct;
      d.beta = 1.0f;
      const double dms = time_ms(stream, iters, [&] { kc::gemm(d, stream); });
      const double dense_tf = flops / (dms * 1e-3) / 1e12;
      for (auto impl : impls) {
        kc::GroupedGemmVarK g;
        g.m = c.m;
        g.n = c.n;
        g.a = x;
        g.b = y;
        g.c_type = ct;
        g.c = ct == kc::DType::f32 ? static_cast<void*>(dw32 + c.c_off) : static_cast<void*>(dw16 + c.c_off);
        g.stride_c = stride;
        kc::GroupOffsets o;
        o.groups = E;
        o.device = d_off;
        o.host = off.data();
        o.max_rows = R;
        Row r;
        r.shape = s.name;
        r.gemm = std::string(c.name) + (ct == kc::DType::f32 ? " [f32 dW]" : " [bf16 dW]");
        r.impl = std::string(kc::to_string(impl));
        try {
          r.ms = time_ms(stream, iters, [&] { kc::grouped_gemm(g, o, impl, stream); });
          r.tflops = flops / (r.ms * 1e-3) / 1e12;
        } catch (const std::exception& e) {
          r.note = e.what();
        }
        r.dense_tflops = dense_tf;
        rows.push_back(r);
      }
    }
  }
  for (void* p : {static_cast<void*>(d_off), static_cast<void*>(w), static_cast<void*>(x),
                  static_cast<void*>(y), static_cast<void*>(dw16), static_cast<void*>(dw32)})
    (void)cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "bench_expert_gemm.json";
  int iters = 20;
  if (!parse_json_iters(argc, argv, json_path, iters)) return 2;
  try {
    const cudaDeviceProp prop = device_banner();
    cudaStream_t stream;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Shape shapes[] = {
        {"bench-h200 uniform", 48, 4, 4096, 4096, 800, 0.0},
        {"bench-h200 skewed", 48, 4, 4096, 4096, 800, 3.0},
        // The same layer at micro-batch 4 (16k tokens per call, ~1,365 rows per expert): the
        // split that runs bench-h200's 64k-token step fastest (bench/NOTES.md, 16k-token micro-batches).
        {"bench-h200 mb4 uniform", 48, 4, 16384, 4096, 800, 0.0},
        // seed-21b's layer (64 experts x ffn 800 over d_model 4096, top-4) at micro-batch 1 and 2
        // of 4,096 tokens: 256 and 512 rows per expert on average.
        {"seed-21b uniform", 64, 4, 4096, 4096, 800, 0.0},
        {"seed-21b mb2 uniform", 64, 4, 8192, 4096, 800, 0.0},
        {"hw-ref 64x1024 2048->1408", 64, 1, 65536, 2048, 1408, 0.0},
        // Two sweep shapes' layers (bench/trainer/sweep.py): many small experts.
        {"qwen3-like 128x768 top-8", 128, 8, 8192, 2048, 768, 0.0},
        {"fine-grained 64x512 top-4", 64, 4, 8192, 3072, 512, 0.0},
        {"olmoe-like 64x1024 top-8", 64, 8, 8192, 2048, 1024, 0.0},
        {"mixtral-like 16x2048 top-2", 16, 2, 8192, 4096, 2048, 0.0},
    };
    std::vector<Row> rows;
    for (const auto& s : shapes) bench_shape(s, iters, stream, rows);

    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "{\"device\": \"%s\", \"iters\": %d, \"results\": [\n", prop.name, iters);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::fprintf(f,
                     "  {\"shape\": \"%s\", \"gemm\": \"%s\", \"impl\": \"%s\", \"ms\": %.5f, "
                     "\"tflops\": %.2f, \"dense_tflops\": %.2f, \"ratio_to_dense\": %.4f, "
                     "\"note\": \"%s\"}%s\n",
                     json_escape(r.shape).c_str(), json_escape(r.gemm).c_str(), json_escape(r.impl).c_str(),
                     r.ms, r.tflops, r.dense_tflops,
                     r.dense_tflops > 0 ? r.tflops / r.dense_tflops : 0.0,
                     json_escape(r.note).c_str(), i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
      std::printf("# wrote %s\n", json_path.c_str());
    }
    std::printf("\n%-28s %-36s %-30s %9s %9s %9s %7s\n", "shape", "gemm", "impl", "ms", "TFLOP/s",
                "dense", "ratio");
    for (const auto& r : rows) {
      if (!r.note.empty()) {
        std::printf("%-28s %-36s %-30s %s\n", r.shape.c_str(), r.gemm.c_str(), r.impl.c_str(),
                    "n/a (unsupported)");
        continue;
      }
      std::printf("%-28s %-36s %-30s %9.4f %9.1f %9.1f %7.3f\n", r.shape.c_str(), r.gemm.c_str(),
                  r.impl.c_str(), r.ms, r.tflops, r.dense_tflops, r.tflops / r.dense_tflops);
    }
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_expert_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
