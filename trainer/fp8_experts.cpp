#include "trainer/fp8_experts.hpp"

#include <algorithm>
#include <cstdint>

#include "tier/config.hpp"
#ifdef GHT_HAVE_CUDA
#include "kernels/cuda/expert_gemm_fp8.hpp"
#endif

namespace ght::trainer {

namespace {

constexpr std::size_t kTile = 128;  // kernels/cuda/fp8_quant.hpp's kFp8TileK (no CUDA header here)

std::size_t tiles(std::int64_t n) { return (static_cast<std::size_t>(n) + kTile - 1) / kTile; }

std::size_t routed_rows(const ModelConfig& c, std::int64_t tokens) {
  const std::int64_t n = tokens > 0 ? tokens : std::int64_t{c.micro_batch} * c.seq_len;
  return static_cast<std::size_t>(n) * static_cast<std::size_t>(c.top_k);
}

}  // namespace

Fp8Gemms fp8_gemms_from_config() {
  return config::cfg().get_string(config::Key::GHT_FP8) == "experts" ? Fp8Gemms::experts : Fp8Gemms::off;
}

std::size_t fp8_gate_up_scales(const ModelConfig& c) { return tiles(2 * std::int64_t{c.expert_ffn}) * tiles(c.d_model); }

std::size_t fp8_down_scales(const ModelConfig& c) { return tiles(c.d_model) * tiles(c.expert_ffn); }

std::string fp8_shape_refusal(const ModelConfig& c) {
  constexpr std::int64_t kUnit = 16;  // kernels/cuda/expert_gemm_fp8.hpp: k and n in 16-byte e4m3 rows
  if (c.experts <= 0) return "model " + c.name + " has no experts";
  if (c.d_model % kUnit != 0) return "d_model " + std::to_string(c.d_model) + " is not a multiple of 16";
  if (c.expert_ffn % kUnit != 0) return "expert_ffn " + std::to_string(c.expert_ffn) + " is not a multiple of 16";
  return {};
}

std::string fp8_unavailable_here() {
#ifdef GHT_HAVE_CUDA
  return ght::kernels::cuda::fp8_gemm_unavailable_reason();
#else
  return "this build has no CUDA";
#endif
}

Fp8ExpertSizes fp8_expert_sizes(const ModelConfig& c, std::int64_t tokens) {
  const auto experts = static_cast<std::size_t>(c.layers) * static_cast<std::size_t>(c.experts);
  const std::int64_t widest = std::max(c.d_model, c.expert_ffn);
  Fp8ExpertSizes s;
  s.weight_codes = experts * static_cast<std::size_t>(c.expert_params());
  s.weight_scales = experts * (fp8_gate_up_scales(c) + fp8_down_scales(c)) * sizeof(float);
  s.act_codes = routed_rows(c, tokens) * static_cast<std::size_t>(widest);
  s.act_scales = routed_rows(c, tokens) * tiles(widest) * sizeof(float);
  return s;
}

double fp8_expert_forward_flops(const ModelConfig& c) {
  return 2.0 * static_cast<double>(c.expert_params()) * static_cast<double>(c.tokens_per_step()) * c.top_k *
         c.layers;
}

double fp8_saved_seconds(const ModelConfig& c, double assumed_tflops, double speedup, double hbm_bps) {
  const double rate = assumed_tflops * 1e12;
  const double gemm = fp8_expert_forward_flops(c) / rate * (1.0 - 1.0 / speedup);
  const Fp8ExpertSizes s = fp8_expert_sizes(c);
  const double quantise = hbm_bps > 0 ? static_cast<double>(3 * s.weight_codes + s.weight_scales) / hbm_bps : 0.0;
  return gemm - quantise;
}

void add_fp8_reservation(tier::PlanOptions& options, const ModelConfig& c) {
  options.fp8_hbm_bytes = 0;
  options.fp8_saved_seconds = 0;
  if (fp8_gemms_from_config() == Fp8Gemms::off || options.link.kind == ght::LinkKind::none) return;
  options.fp8_hbm_bytes = fp8_expert_sizes(c).total();
  options.fp8_saved_seconds = fp8_saved_seconds(c, options.assumed_tflops,
                                                config::cfg().get_float(config::Key::GHT_ASSUMED_FP8_GEMM),
                                                options.link.hbm_bps);
}

}  // namespace ght::trainer
