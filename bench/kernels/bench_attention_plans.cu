// Attention engine survey: every engine configuration cudnn-frontend offers for the causal GQA
// attention forward and backward of the sweep's shapes (heuristics mode A, all plans), each
// timed on the same buffers, with the heuristics' first choice (plan 0, the one
// AttentionImpl::cudnn runs) marked. It answers whether a different configuration would be
// faster than the one we run, per shape (bench/NOTES.md, "The attention engines cuDNN offers": head_dim 64's backward at
// 269 TFLOP/s against 439 at 128).
//
//   bench_attention_plans [--json PATH] [--iters N]
//
// Shapes (B, T, H, KV, D) are the sweep's micro-batches (bench/trainer/sweep.py). FLOPs, causal,
// as trainer/cuda/op_costs.cpp counts them: forward 2·B·H·T²·D, backward 2.5× that. Printed:
// ms (median), TFLOP/s, and the ratio to plan 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/attention.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;
using bf16 = __nv_bfloat16;

struct Shape {
  const char* name;
  int B, T, H, KV, D;
};

constexpr Shape kShapes[] = {
    {"fine-grained", 4, 2048, 48, 24, 64}, {"switch-like", 8, 2048, 16, 16, 64},
    {"qwen3-like", 2, 4096, 32, 4, 128},   {"olmoe-like", 2, 4096, 16, 16, 128},
    {"bench-h200", 1, 4096, 40, 8, 128},
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iters = 20;
  if (!parse_json_iters(argc, argv, json_path, iters)) return 2;
  try {
    (void)device_banner();
    if (!kc::detail::cudnn_frontend_attention_compiled()) {
      std::printf("this build has no cudnn-frontend: nothing to survey\n");
      return 1;
    }
    cudaStream_t stream = nullptr;
    GHT_CUDA_TRY(cudaStreamCreate(&stream));
    std::string json = "[";
    std::printf("\n| shape | pass | plan | ms | TFLOP/s | speed vs plan 0 | configuration |\n|---|---|---:|---:|---:|---:|---|\n");
    for (const Shape& s : kShapes) {
      const std::size_t nq = static_cast<std::size_t>(s.B) * s.T * s.H * s.D;
      const std::size_t nk = static_cast<std::size_t>(s.B) * s.T * s.KV * s.D;
      bf16 *q = dev_alloc<bf16>(nq), *k = dev_alloc<bf16>(nk), *v = dev_alloc<bf16>(nk), *o = dev_alloc<bf16>(nq);
      bf16 *d_o = dev_alloc<bf16>(nq), *dq = dev_alloc<bf16>(nq), *dk = dev_alloc<bf16>(nk), *dv = dev_alloc<bf16>(nk);
      float* lse = dev_alloc<float>(static_cast<std::size_t>(s.B) * s.H * s.T);
      fill(q, nq, 1);
      fill(k, nk, 2);
      fill(v, nk, 3);
      fill(d_o, nq, 4);
      const kc::AttentionShape sh{s.B, s.T, s.H, s.KV, s.D};  // packed rows
      (void)kc::attention_forward(o, lse, q, k, v, nullptr, sh, kc::AttentionImpl::cudnn, stream);
      const kc::detail::AttentionTensors t{q, k, v, o, lse, d_o, dq, dk, dv};
      const double fwd_flops = 2.0 * s.B * s.H * static_cast<double>(s.T) * s.T * s.D;
      for (const bool backward : {false, true}) {
        const double flops = backward ? 2.5 * fwd_flops : fwd_flops;
        const auto plans = kc::detail::cudnn_frontend_attention_plan_times(backward, t, sh, iters, stream);
        const double ms0 = plans.empty() ? -1 : plans[0].ms;
        for (std::size_t i = 0; i < plans.size(); ++i) {
          const auto& p = plans[i];
          const char* pass = backward ? "backward" : "forward";
          if (p.ms < 0) {
            std::printf("| %s | %s | %zu | – | – | – | %s (failed: %.80s) |\n", s.name, pass, i, p.name.c_str(),
                        p.error.c_str());
          } else {
            std::printf("| %s | %s | %zu | %.3f | %.1f | %.3f | %s |\n", s.name, pass, i, p.ms,
                        flops / (p.ms * 1e-3) / 1e12, ms0 > 0 ? ms0 / p.ms : 0.0, p.name.c_str());
          }
          json += std::string(json.size() > 1 ? "," : "") + "{\"shape\":\"" + s.name + "\",\"pass\":\"" + pass +
                  "\",\"plan\":" + std::to_string(i) + ",\"ms\":" + std::to_string(p.ms) +
                  ",\"flops\":" + std::to_string(flops) + ",\"name\":\"" + json_escape(p.name) +
                  "\",\"error\":\"" + json_escape(p.error) + "\"}";
        }
      }
      for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                      static_cast<void*>(d_o), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                      static_cast<void*>(lse)}) {
        GHT_CUDA_TRY(cudaFree(p));
      }
    }
    json += "]\n";
    if (!json_path.empty()) {
      if (FILE* f = std::fopen(json_path.c_str(), "w")) {
        std::fputs(json.c_str(), f);
        std::fclose(f);
      }
    }
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention_plans: %s\n", e.what());
    return 1;
  }
  return 0;
}
