// The CUDA model's FP8 experts (CudaModelOptions::fp8_experts, trainer/fp8_experts.hpp): the
// weights' FP8 copies, their quantisation once per weight change, and the experts' forward GEMMs
// on e4m3 operands.
#include "trainer/cuda/model_cuda_impl.hpp"
#include "trainer/fp8_experts.hpp"

namespace ght::trainer {

// Availability first (a build without CUTLASS or a GPU other than sm_90 says why), then every
// layer's weight copies, which live as long as the model.
void CudaMoEModel::Impl::fp8_setup() {
  if (!kc::fp8_gemm_available()) {
    throw ght::config_error("GHT_FP8=experts: FP8 GEMMs cannot run here: " + kc::fp8_gemm_unavailable_reason() +
                            "; unset GHT_FP8 (or set it to off) to train in bf16");
  }
  if (const std::string why = fp8_shape_refusal(cfg); !why.empty()) {
    throw ght::config_error("GHT_FP8=experts: the FP8 expert GEMMs cannot take this model: " + why +
                            "; unset GHT_FP8 (or set it to off) to train in bf16");
  }
  const Fp8ExpertSizes s = fp8_expert_sizes(cfg);
  fp8_w = as<__nv_fp8_e4m3>(alloc(s.weight_codes, kWork, "FP8 expert weight codes"));
  fp8_w_scales = as<float>(alloc(s.weight_scales, kWork, "FP8 expert weight scales"));
  fp8_stale = true;
}

// Layer l's copies: every expert's gate/up rows (2F, d), then every expert's down rows (d, F),
// each group packed; the scales in the same order; layer after layer.
CudaMoEModel::Impl::Fp8LayerCopies CudaMoEModel::Impl::fp8_layer(int l) const {
  const auto ul = static_cast<std::size_t>(l);
  const auto ue = static_cast<std::size_t>(E);
  const std::size_t gu_codes = ue * static_cast<std::size_t>(2 * F * d);
  const std::size_t gu_scales = ue * fp8_gate_up_scales(cfg);
  const std::size_t layer_scales = gu_scales + ue * fp8_down_scales(cfg);
  Fp8LayerCopies c;
  c.gate_up = fp8_w + ul * ue * static_cast<std::size_t>(3 * F * d);
  c.down = c.gate_up + gu_codes;
  c.gate_up_scales = fp8_w_scales + ul * layer_scales;
  c.down_scales = c.gate_up_scales + gu_scales;
  return c;
}

// Each expert's weights sit 3·d·F apart in W: gate/up rows first, then down.
void CudaMoEModel::Impl::fp8_quantize_weights(int l) {
  const Fp8LayerCopies c = fp8_layer(l);
  const bf16* w = W + lo[static_cast<std::size_t>(l)].expert0;
  const std::int64_t stride = 3 * d * F;
  op("FP8 expert weight quantisation", l);
  kc::quantize_fp8_blocks(c.gate_up, c.gate_up_scales, w, static_cast<int>(E), 2 * F, d, d, stride, stream);
  kc::quantize_fp8_blocks(c.down, c.down_scales, w + 2 * d * F, static_cast<int>(E), d, F, F, stride, stream);
}

void CudaMoEModel::Impl::fp8_grouped_m(int l, const Acts& a, bool gate_up, bf16* C) {
  const Fp8LayerCopies c = fp8_layer(l);
  kc::Fp8GroupedGemmVarM g;
  g.n = gate_up ? 2 * F : d;
  g.k = gate_up ? d : F;
  g.a = fp8_act;
  g.a_scales = fp8_act_scales;
  g.b = gate_up ? c.gate_up : c.down;
  g.b_scales = gate_up ? c.gate_up_scales : c.down_scales;
  g.c = C;
  kc::grouped_gemm_fp8(g, offsets_of(a), stream);
}

}  // namespace ght::trainer
