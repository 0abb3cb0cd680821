#pragma once
/**
 * @file graph_choice.hpp
 * @brief When the CUDA training step replays its micro-batches as CUDA graphs (GHT_CUDA_GRAPHS).
 *
 * Plain C++ (no CUDA), so that the decision is unit-tested without a GPU. The step
 * (trainer/cuda/train_cuda.cpp) asks two things:
 *  - once, before the model is made: can any micro-batch of this run replay
 *    (choose_cuda_graphs); `auto` turns graphs off with the reason, `on` refuses the run;
 *  - per micro-batch: do the step's hooks act in it (hooks_busy_reason)? A micro-batch whose
 *    hooks do nothing may replay (CudaMoEModel::set_hooks_quiet); one whose hooks act runs
 *    eagerly, since a graph replay calls no hook.
 * The hooks' conditions live in train_cuda.cpp; that file checks after every eager micro-batch
 * that hooks_busy_reason() said "quiet" only where the hooks did nothing.
 */
#include <string>
#include <string_view>

#include "tier/config.hpp"

namespace ght::trainer {

/// GHT_CUDA_GRAPHS.
enum class CudaGraphsMode { automatic, on, off };

/// GHT_CUDA_GRAPHS of `reg` (the process registry by default).
[[nodiscard]] CudaGraphsMode cuda_graphs_mode(const config::Registry& reg = config::cfg());
[[nodiscard]] std::string_view to_string(CudaGraphsMode m);

/// What decides before a run starts whether any of its micro-batches could replay.
struct CudaGraphRunFacts {
  /// The expert GEMMs need the expert offsets on the host (a stream sync per layer, which a
  /// graph cannot hold): the cuBLAS(Lt) variants; cutlass and custom keep them on the device.
  bool expert_offsets_on_host = false;
  std::string expert_impl;  ///< its name, for the message
  int grad_accum = 1;       ///< micro-batches per step (per rank)
  bool stream_grads = false;  ///< the plan streams the gradients to the host every micro-batch
};

struct CudaGraphChoice {
  bool on = false;
  /// Off: why (one clause, for the start-up line). On: empty.
  std::string why_off;
};

/**
 * @brief Whether this run replays micro-batches as CUDA graphs.
 * @throws ght::config_error for GHT_CUDA_GRAPHS=on where no micro-batch could replay, naming the
 *         variable and the reason (an on/off A/B must not measure eager against eager)
 */
[[nodiscard]] CudaGraphChoice choose_cuda_graphs(CudaGraphsMode mode, const CudaGraphRunFacts& f);

/// What the training step's hooks do in one micro-batch.
struct MicroBatchHooks {
  int micro = 0;           ///< this micro-batch, 0..grad_accum-1 (per rank)
  int grad_accum = 1;
  bool stream_grads = false;  ///< every unit's gradients stream to the host after its backward
  bool zero1 = false;         ///< ZeRO-1: each unit's gradients are reduce-scattered after the last backward
  bool speculate = false;     ///< updates start as units finish in the last backward (GHT_OPT_SPECULATE*)
  bool tracing = false;       ///< --trace-kernels: every op of this step is attributed
};

/// Why the hooks act in this micro-batch (a static string); nullptr: they do nothing, so it may
/// run as a graph replay.
[[nodiscard]] const char* hooks_busy_reason(const MicroBatchHooks& h);

}  // namespace ght::trainer
