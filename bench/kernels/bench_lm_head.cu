// LM head + cross-entropy benchmark: kernels/cuda/lm_head_ce's training call (logits, CE, dx, dW)
// on bench-h200's head (d 4096, vocab 151,936 tied, fp32 dW) and fine-grained's (d 3072, 100,352)
// at several chunk sizes, and their three GEMMs alone at the chunk shapes, against a dense 8192^3
// cuBLASLt GEMM measured in the same run. Which chunk is fastest is what default_ce_chunk_rows
// (trainer/regions.hpp) assumes.
//
//   bench_lm_head [--json PATH] [--iters N]
//
// FLOPs of one call: 6·N·V·C (each GEMM 2·rows·V·C per chunk). Bytes it must move per chunk:
// the logits written, read twice and dlogits written (4 × 2·rows·V, CE kernel 3 of them), W read
// twice (2 × 2·V·C), dW read and written (8·V·C in fp32): the dW term is per chunk, so it shrinks
// with the number of chunks. Printed: ms per call, TFLOP/s and the ratio to the dense GEMM.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/lm_head_ce.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;
using bf16 = __nv_bfloat16;

struct Row {
  std::string head, what;
  std::int64_t tokens = 0, rows = 0;
  double ms = 0, flops = 0, bytes = 0;
};

__global__ void targets_kernel(std::int32_t* t, std::int64_t n, int v) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    t[i] = static_cast<std::int32_t>((static_cast<std::uint64_t>(i) * 2654435761u) % static_cast<unsigned>(v));
  }
}

double dense_tflops(cudaStream_t stream, int iters) {
  const std::int64_t n = 8192;
  bf16* a = dev_alloc<bf16>(n * n);
  bf16* b = dev_alloc<bf16>(n * n);
  bf16* c = dev_alloc<bf16>(n * n);
  fill(a, n * n, 1);
  fill(b, n * n, 2);
  kc::GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a;
  g.b = b;
  g.c = c;
  const double ms = time_ms(stream, iters, [&] { kc::gemm(g, stream); });
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c)}) (void)cudaFree(p);
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

// One LM head: its whole training call per (tokens, rows per chunk), bf16 or fp32 dW, and its
// three GEMMs alone at the chunk shapes in `gemm_rows` (the logits chunk is the workspace).
struct Case {
  std::int64_t tokens, rows;
  bool bf16_dw;
};
struct Head {
  std::string name;
  int C, V;
  std::vector<Case> cases;
  std::vector<std::int64_t> gemm_rows;
};

void bench_head(const Head& hd, cudaStream_t stream, int iters, std::vector<Row>& rows) {
  const int C = hd.C, V = hd.V;
  std::int64_t max_tokens = 0, max_rows = 0;
  for (const auto& cs : hd.cases) {
    max_tokens = std::max(max_tokens, cs.tokens);
    max_rows = std::max(max_rows, cs.rows);
  }
  for (std::int64_t r : hd.gemm_rows) max_rows = std::max(max_rows, r);
  max_tokens = std::max(max_tokens, max_rows);
  bf16* x = dev_alloc<bf16>(max_tokens * C);
  bf16* w = dev_alloc<bf16>(static_cast<std::size_t>(V) * C);
  bf16* dx = dev_alloc<bf16>(max_tokens * C);
  float* dw = dev_alloc<float>(static_cast<std::size_t>(V) * C);
  bf16* dw16 = dev_alloc<bf16>(static_cast<std::size_t>(V) * C);
  auto* tg = dev_alloc<std::int32_t>(max_tokens);
  auto* loss = dev_alloc<float>(1);
  auto* valid = dev_alloc<std::int32_t>(1);
  const std::size_t ws_bytes = kc::lm_head_ce_workspace_bytes(max_rows, V);
  void* ws = dev_alloc<char>(ws_bytes);
  fill(x, max_tokens * C, 3);
  fill(w, static_cast<std::size_t>(V) * C, 4);
  GHT_CUDA_TRY(cudaMemset(dw, 0, static_cast<std::size_t>(V) * C * 4));
  GHT_CUDA_TRY(cudaMemset(dw16, 0, static_cast<std::size_t>(V) * C * 2));
  targets_kernel<<<256, 256>>>(tg, max_tokens, V);
  GHT_CUDA_CHECK_LAUNCH();
  GHT_CUDA_TRY(cudaDeviceSynchronize());
  kc::CeOutputs out;
  out.loss = loss;
  out.valid = valid;

  for (const auto& cs : hd.cases) {
    const std::int64_t N = cs.tokens, r = cs.rows, chunks = (N + r - 1) / r;
    const double ms = time_ms(stream, iters, [&] {
      if (cs.bf16_dw) {
        kc::lm_head_ce_forward_backward(out, dx, dw16, x, w, tg, N, C, V, 1.0f, kc::kCeIgnoreIndex, r, ws,
                                        ws_bytes, stream);
      } else {
        kc::lm_head_ce_forward_backward(out, dx, dw, x, w, tg, N, C, V, 1.0f, kc::kCeIgnoreIndex, r, ws,
                                        ws_bytes, stream);
      }
    });
    const double dwb = cs.bf16_dw ? 4.0 : 8.0;
    rows.push_back({hd.name, std::string("LM head + CE fwd+bwd, dW ") + (cs.bf16_dw ? "bf16" : "fp32"), N, r, ms,
                    6.0 * N * V * C, 8.0 * N * V + 2.0 * N * C * 3 + chunks * (4.0 * V * C + dwb * V * C)});
  }
  auto* logits = static_cast<bf16*>(ws);
  for (std::int64_t r : hd.gemm_rows) {
    kc::GemmArgs f;  // logits (r, V) = x (r, C) · W^T
    f.m = r; f.n = V; f.k = C; f.a = x; f.b = w; f.trans_b = true; f.c = logits;
    kc::GemmArgs d;  // dx (r, C) = dlogits (r, V) · W
    d.m = r; d.n = C; d.k = V; d.a = logits; d.b = w; d.c = dx;
    kc::GemmArgs h;  // dW (V, C) += dlogits^T · x
    h.m = V; h.n = C; h.k = r; h.a = logits; h.trans_a = true; h.b = x; h.c = dw; h.c_type = kc::DType::f32;
    h.beta = 1.0f;
    const double fl = 2.0 * r * V * C;
    rows.push_back({hd.name, "GEMM logits = x·W^T", r, r, time_ms(stream, iters, [&] { kc::gemm(f, stream); }), fl,
                    2.0 * (r * C + static_cast<double>(V) * C + r * static_cast<double>(V))});
    rows.push_back({hd.name, "GEMM dx = dlogits·W", r, r, time_ms(stream, iters, [&] { kc::gemm(d, stream); }), fl,
                    2.0 * (r * static_cast<double>(V) + static_cast<double>(V) * C + r * C)});
    rows.push_back({hd.name, "GEMM dW += dlogits^T·x (fp32)", r, r,
                    time_ms(stream, iters, [&] { kc::gemm(h, stream); }), fl,
                    2.0 * (r * static_cast<double>(V) + r * C) + 8.0 * V * C});
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(dx), static_cast<void*>(dw),
                  static_cast<void*>(dw16), static_cast<void*>(tg), static_cast<void*>(loss),
                  static_cast<void*>(valid), ws})
    (void)cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "bench_lm_head.json";
  int iters = 5;
  if (!parse_json_iters(argc, argv, json_path, iters)) return 2;
  try {
    const cudaDeviceProp prop = device_banner();
    cudaStream_t stream;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double dense = dense_tflops(stream, iters);
    std::printf("# dense bf16 GEMM 8192^3: %.1f TFLOP/s\n", dense);

    // 832: the first fixed chunk (256 MiB of logits); 4096: bench-h200's whole micro-batch at micro-batch
    // 1; at 16k tokens (micro-batch 4) the chunk sizes default_ce_chunk_rows could pick: 5504
    // (3 equal chunks under 2 GiB, rounded to 64 rows), 5632 (rounded to 256), 4096 (4 chunks),
    // 8192 (2 chunks, 2.5 GB of logits), 16384 (the whole micro-batch, 5 GB of logits). fine-grained's head (sweep.py: d 3072, untied 100,352,
    // 8192 tokens per micro-batch) and two more sweep heads whose whole micro-batch is one chunk
    // today (olmoe-like: d 2048, 50,304, 8192 tokens; switch-like: d 1024, 32,768, 16,384
    // tokens), each against 4096-row chunks.
    const std::vector<Head> heads = {
        {"bench-h200", 4096, 151936,
         {{4096, 832, false}, {4096, 1024, false}, {4096, 2048, false}, {4096, 4096, false}, {4096, 832, true},
          {4096, 4096, true}, {16384, 832, false}, {16384, 4096, false}, {16384, 5504, false},
          {16384, 5632, false}, {16384, 8192, false}, {16384, 16384, false}},
         {832, 4096, 5504, 8192, 16384}},
        {"fine-grained", 3072, 100352, {{8192, 4096, false}, {8192, 8192, false}}, {4096, 8192}},
        {"olmoe-like", 2048, 50304, {{8192, 4096, false}, {8192, 8192, false}}, {}},
        {"switch-like", 1024, 32768, {{16384, 4096, false}, {16384, 16384, false}}, {}},
    };
    std::vector<Row> rows;
    for (const auto& hd : heads) bench_head(hd, stream, iters, rows);

    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "{\"device\": \"%s\", \"iters\": %d, \"dense_tflops\": %.2f, \"results\": [\n", prop.name,
                   iters, dense);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::fprintf(f,
                     "  {\"head\": \"%s\", \"what\": \"%s\", \"tokens\": %lld, \"rows\": %lld, \"ms\": %.5f, "
                     "\"tflops\": %.2f, \"ratio_to_dense\": %.4f, \"gbps\": %.1f}%s\n",
                     r.head.c_str(), json_escape(r.what).c_str(), static_cast<long long>(r.tokens),
                     static_cast<long long>(r.rows), r.ms, r.flops / (r.ms * 1e-3) / 1e12,
                     r.flops / (r.ms * 1e-3) / 1e12 / dense, r.bytes / (r.ms * 1e-3) / 1e9,
                     i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
      std::printf("# wrote %s\n", json_path.c_str());
    }
    std::printf("\n%-13s %-34s %7s %6s %9s %9s %7s %9s\n", "head", "what", "tokens", "rows", "ms", "TFLOP/s",
                "/dense", "GB/s");
    for (const auto& r : rows) {
      const double tf = r.flops / (r.ms * 1e-3) / 1e12;
      std::printf("%-13s %-34s %7lld %6lld %9.3f %9.1f %7.3f %9.0f\n", r.head.c_str(), r.what.c_str(),
                  static_cast<long long>(r.tokens), static_cast<long long>(r.rows), r.ms, tf, tf / dense,
                  r.bytes / (r.ms * 1e-3) / 1e9);
    }
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_lm_head: %s\n", e.what());
    return 1;
  }
  return 0;
}
