#include "trainer/cuda/graph_choice.hpp"

#include "tier/error.hpp"

namespace ght::trainer {

CudaGraphsMode cuda_graphs_mode(const config::Registry& reg) {
  const std::string v = reg.get_string(config::Key::GHT_CUDA_GRAPHS);  // the registry checked it
  return v == "on" ? CudaGraphsMode::on : v == "off" ? CudaGraphsMode::off : CudaGraphsMode::automatic;
}

std::string_view to_string(CudaGraphsMode m) {
  switch (m) {
    case CudaGraphsMode::on: return "on";
    case CudaGraphsMode::off: return "off";
    case CudaGraphsMode::automatic: break;
  }
  return "auto";
}

CudaGraphChoice choose_cuda_graphs(CudaGraphsMode mode, const CudaGraphRunFacts& f) {
  if (mode == CudaGraphsMode::off) return {false, "GHT_CUDA_GRAPHS=off"};
  std::string why;
  if (f.expert_offsets_on_host) {
    why = "the expert GEMMs (" + f.expert_impl +
          ") download the expert offsets to the host once per layer, a sync a graph cannot hold (cutlass and "
          "custom keep them on the device: GHT_EXPERT_GEMM)";
  } else if (f.stream_grads) {
    why = "the plan streams the gradients to the host, so the hooks act in every micro-batch";
  } else if (f.grad_accum < 2) {
    why = "grad_accum is " + std::to_string(f.grad_accum) +
          ": the only micro-batch of a step waits for the previous update unit by unit, so it runs eagerly";
  }
  if (why.empty()) return {true, {}};
  if (mode == CudaGraphsMode::on) {
    throw config_error("GHT_CUDA_GRAPHS=on: no micro-batch of this run could replay as a CUDA graph: " + why +
                       "; use auto (graphs where usable) or off");
  }
  return {false, why};
}

const char* hooks_busy_reason(const MicroBatchHooks& h) {
  const bool last = h.micro == h.grad_accum - 1;
  if (h.micro == 0) return "micro-batch 0 waits for the previous update unit by unit";
  if (h.stream_grads) return "every unit's gradients stream to the host after its backward";
  if (h.tracing) return "--trace-kernels attributes every op of the traced step";
  if (last && h.zero1) return "ZeRO-1 reduce-scatters each unit's gradients as the last backward ends";
  if (last && h.speculate) {
    return "updates start during the last backward (GHT_OPT_SPECULATE / GHT_OPT_SPECULATE_HOST)";
  }
  return nullptr;
}

}  // namespace ght::trainer
