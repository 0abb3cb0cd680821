// Block-scaled FP8 expert GEMMs against bf16 ones, at seed-21b's expert shapes: 64 experts,
// d_model 4096, expert FFN 800, top-4 of 4096 tokens (16384 routed rows, 256 per expert). The two
// forward GEMMs of an expert MLP:
//   gate_up  (R, 4096) x (1600, 4096)^T   n = 2·800, k = 4096
//   down     (R, 800)  x (4096, 800)^T    n = 4096,  k = 800
// bf16 runs the default grouped GEMM (expert_gemm.hpp; CUTLASS where built in); FP8 runs
// grouped_gemm_fp8 on pre-quantised weights, alone and after quantising its bf16 activations
// (what a forward pays when its input arrives in bf16). The quantisation kernels are timed on
// their own (GB/s over the bytes they must move). Median of --iters runs (at least 20) after
// warm-up, CUDA events. Prints a table last and writes the full results as JSON.
//
//   bench_fp8_grouped [--json PATH] [--iters N]
//
// FLOPs 2·R·n·k. Bytes: bf16 2·(R·k + E·n·k + R·n); FP8 R·k + E·n·k + 4·(R + E·ceil(n/128))·ceil(k/128)
// + 2·R·n; quantisation 3 per element + 4 per scale tile.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/expert_gemm.hpp"
#include "kernels/cuda/expert_gemm_fp8.hpp"
#include "kernels/cuda/fp8_quant.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;
using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

constexpr int kExperts = 64, kTopK = 4, kTokens = 4096, kModel = 4096, kFfn = 800;

struct Row {
  Row(std::string w, std::string i) : what(std::move(w)), impl(std::move(i)) {}
  std::string what, impl;
  double ms = 0, tflops = 0, gbps = 0, flops = 0, bytes = 0;
  std::string note;
};

std::int64_t tiles(std::int64_t x) { return (x + kc::kFp8TileK - 1) / kc::kFp8TileK; }

// The rows as JSON at `json_path` and as a table, each with its ratio to the bf16 row of its GEMM.
void report(const std::vector<Row>& rows, const char* device, int iters, int E, std::int64_t R,
            const std::string& json_path) {
  // Ratio of each row's TFLOP/s to the bf16 row of the same GEMM.
  auto bf16_tflops = [&](const std::string& what) {
    for (const auto& r : rows)
      if (r.what == what && r.impl.rfind("bf16", 0) == 0) return r.tflops;
    return 0.0;
  };
  if (FILE* fj = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(fj, "{\"device\": \"%s\", \"iters\": %d, \"experts\": %d, \"rows\": %lld, \"results\": [\n",
                 json_escape(device).c_str(), iters, E, static_cast<long long>(R));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const double base = bf16_tflops(r.what);
      std::fprintf(fj,
                   "  {\"gemm\": \"%s\", \"impl\": \"%s\", \"ms\": %.5f, \"flops\": %.0f, \"bytes\": %.0f, "
                   "\"tflops\": %.2f, \"gbps\": %.1f, \"ratio_to_bf16\": %.4f, \"note\": \"%s\"}%s\n",
                   json_escape(r.what).c_str(), json_escape(r.impl).c_str(), r.ms, r.flops, r.bytes, r.tflops,
                   r.gbps, r.flops > 0 && base > 0 ? r.tflops / base : 0.0, json_escape(r.note).c_str(),
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(fj, "]}\n");
    std::fclose(fj);
    std::printf("# wrote %s\n", json_path.c_str());
  }
  std::printf("\n%-36s %-26s %9s %9s %9s %8s\n", "gemm", "impl", "ms", "TFLOP/s", "GB/s", "vs bf16");
  for (const auto& r : rows) {
    if (!r.note.empty()) {
      std::printf("%-36s %-26s n/a (%s)\n", r.what.c_str(), r.impl.c_str(), r.note.c_str());
      continue;
    }
    const double base = bf16_tflops(r.what);
    if (r.flops > 0) {
      std::printf("%-36s %-26s %9.4f %9.1f %9.1f %8.3f\n", r.what.c_str(), r.impl.c_str(), r.ms, r.tflops, r.gbps,
                  base > 0 ? r.tflops / base : 0.0);
    } else {
      std::printf("%-36s %-26s %9.4f %9s %9.1f %8s\n", r.what.c_str(), r.impl.c_str(), r.ms, "-", r.gbps, "-");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "bench_fp8_grouped.json";
  int iters = 50;
  if (!parse_json_iters(argc, argv, json_path, iters)) return 2;
  iters = std::max(iters, 20);
  try {
    const cudaDeviceProp prop = device_banner();
    cudaStream_t stream;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    const int E = kExperts;
    const std::int64_t R = static_cast<std::int64_t>(kTokens) * kTopK;
    std::vector<std::int32_t> off(E + 1);
    for (int e = 0; e <= E; ++e) off[e] = static_cast<std::int32_t>(R * e / E);  // spread evenly
    std::printf("# seed-21b experts: E=%d top_k=%d tokens=%d R=%lld d_model=%d ffn=%d rows/expert=%lld\n", E, kTopK,
                kTokens, static_cast<long long>(R), kModel, kFfn, static_cast<long long>(R / E));
    const bool fp8_ok = kc::fp8_gemm_available();
    const std::string fp8_why = fp8_ok ? std::string() : kc::fp8_gemm_unavailable_reason();
    if (!fp8_ok) std::printf("# FP8 grouped GEMM unavailable: %s\n", fp8_why.c_str());
    const kc::GroupedGemmImpl bf16_impl = kc::default_grouped_gemm_impl();

    std::int32_t* d_off = dev_alloc<std::int32_t>(off.size());
    GHT_CUDA_TRY(cudaMemcpy(d_off, off.data(), off.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    kc::GroupOffsets o;
    o.groups = E;
    o.device = d_off;
    o.host = off.data();
    o.max_rows = R;

    struct Case { const char* name; std::int64_t n, k; };
    const Case cases[] = {{"fwd gate_up (R,4096)x(1600,4096)^T", 2 * kFfn, kModel},
                          {"fwd down    (R,800)x(4096,800)^T", kModel, kFfn}};
    std::vector<Row> rows;
    for (const auto& c : cases) {
      const std::int64_t n = c.n, k = c.k;
      const double flops = 2.0 * static_cast<double>(R) * n * k;
      bf16* x = dev_alloc<bf16>(static_cast<std::size_t>(R * k));
      bf16* w = dev_alloc<bf16>(static_cast<std::size_t>(E * n * k));
      bf16* y = dev_alloc<bf16>(static_cast<std::size_t>(R * n));
      fp8* qx = dev_alloc<fp8>(static_cast<std::size_t>(R * k));
      fp8* qw = dev_alloc<fp8>(static_cast<std::size_t>(E * n * k));
      float* sx = dev_alloc<float>(static_cast<std::size_t>(R * tiles(k)));
      float* sw = dev_alloc<float>(static_cast<std::size_t>(E * tiles(n) * tiles(k)));
      fill(x, static_cast<std::size_t>(R * k), 1);
      fill(w, static_cast<std::size_t>(E * n * k), 2);
      GHT_CUDA_TRY(cudaDeviceSynchronize());

      kc::GroupedGemmVarM g;
      g.n = n;
      g.k = k;
      g.a = x;
      g.b = w;
      g.stride_b = n * k;
      g.trans_b = true;
      g.c = y;
      Row rb{c.name, std::string("bf16 ") + std::string(kc::to_string(bf16_impl))};
      rb.flops = flops;
      rb.bytes = 2.0 * (R * k + static_cast<double>(E) * n * k + R * n);
      rb.ms = time_ms(stream, iters, [&] { kc::grouped_gemm(g, o, bf16_impl, stream); });
      rb.tflops = flops / (rb.ms * 1e-3) / 1e12;
      rb.gbps = rb.bytes / (rb.ms * 1e-3) / 1e9;
      rows.push_back(rb);

      // Quantisation kernels: activations every forward, weights once per optimiser step.
      Row qa{c.name, "quantise act 1x128"};
      qa.bytes = 3.0 * R * k + 4.0 * R * tiles(k);
      qa.ms = time_ms(stream, iters, [&] { kc::quantize_fp8_rows(qx, sx, x, R, k, k, stream); });
      qa.gbps = qa.bytes / (qa.ms * 1e-3) / 1e9;
      rows.push_back(qa);
      Row qw_row{c.name, "quantise weights 128x128"};
      qw_row.bytes = 3.0 * E * n * k + 4.0 * E * tiles(n) * tiles(k);
      qw_row.ms = time_ms(stream, iters, [&] { kc::quantize_fp8_blocks(qw, sw, w, E, n, k, k, n * k, stream); });
      qw_row.gbps = qw_row.bytes / (qw_row.ms * 1e-3) / 1e9;
      rows.push_back(qw_row);

      kc::Fp8GroupedGemmVarM f;
      f.n = n;
      f.k = k;
      f.a = qx;
      f.a_scales = sx;
      f.b = qw;
      f.b_scales = sw;
      f.c = y;
      Row rf{c.name, "fp8 blockwise (cutlass)"};
      rf.flops = flops;
      rf.bytes = static_cast<double>(R) * k + static_cast<double>(E) * n * k +
                 4.0 * (R + E * tiles(n)) * tiles(k) + 2.0 * R * n;
      Row rq{c.name, "fp8 + quantise act"};
      rq.flops = flops;
      rq.bytes = rf.bytes + qa.bytes;
      if (fp8_ok) {
        try {
          rf.ms = time_ms(stream, iters, [&] { kc::grouped_gemm_fp8(f, o, stream); });
          rf.tflops = flops / (rf.ms * 1e-3) / 1e12;
          rf.gbps = rf.bytes / (rf.ms * 1e-3) / 1e9;
          rq.ms = time_ms(stream, iters, [&] {
            kc::quantize_fp8_rows(qx, sx, x, R, k, k, stream);
            kc::grouped_gemm_fp8(f, o, stream);
          });
          rq.tflops = flops / (rq.ms * 1e-3) / 1e12;
          rq.gbps = rq.bytes / (rq.ms * 1e-3) / 1e9;
        } catch (const std::exception& e) {
          rf.note = rq.note = e.what();
        }
      } else {
        rf.note = rq.note = fp8_why;
      }
      rows.push_back(rf);
      rows.push_back(rq);
      for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y), static_cast<void*>(qx),
                      static_cast<void*>(qw), static_cast<void*>(sx), static_cast<void*>(sw)})
        (void)cudaFree(p);
    }
    (void)cudaFree(d_off);

    report(rows, prop.name, iters, E, R, json_path);
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fp8_grouped: %s\n", e.what());
    return 1;
  }
  return 0;
}
