#pragma once
/**
 * @file train.hpp
 * @brief The training loop: micro-batches with gradient accumulation, AdamW from optimizer/,
 * LR schedule, periodic eval on held-out shards, logging, atomic checkpoints with exact resume,
 * and SIGTERM/SIGINT save-and-exit. The loop is shared by the backends (trainer/loop.hpp).
 *
 * Backends: `cpu` is the fp32 OpenMP reference backend (trainer/model.hpp); `cuda` is the GPU
 * backend (trainer/cuda/train_cuda.hpp: bf16 compute, fp32 state where the plan says); `auto`
 * picks `cuda` when the build has CUDA and a device is present, else `cpu`.
 */
#include <cstdint>
#include <optional>
#include <string>

#include "trainer/train_config.hpp"

namespace ght::trainer {

struct TrainRunOptions {
  std::string resume;                ///< "": fresh start; "auto": newest good checkpoint in out; else a checkpoint or run dir
  /// A fresh start (resume "") into a run directory that holds a previous run's checkpoints or
  /// log.jsonl deletes them first; without it such a start is refused.
  bool overwrite = false;
  std::optional<std::int64_t> stop_at;  ///< stop (with a checkpoint) after this step, schedule unchanged
  bool quiet = false;                ///< no console output (tests)
  /// cuda backend: write the per-step breakdown (forward, backward, exposed optimizer, link GB)
  /// of this run's first N steps to <out>/profile.json, rewritten after each of them; 0 = off.
  /// Every step's breakdown also goes to log.jsonl as a "profile" record either way.
  std::int64_t profile_steps = 0;
  /// cuda backend: trace the kernels of the last profiled step with CUPTI and write the per-op
  /// GPU time to <out>/kernel_breakdown.{json,md} (trainer/cuda/kernel_trace.hpp); needs
  /// profile_steps >= 1. The cpu backend says so and ignores it.
  bool trace_kernels = false;
};

struct TrainSummary {
  std::int64_t first_step = 0;       ///< 0 on a fresh start, the checkpoint's step on resume
  std::int64_t last_step = 0;
  double last_loss = 0;              ///< training loss of the last step
  std::optional<double> eval_loss;   ///< last eval (nats/token)
  std::string last_checkpoint;
  bool stopped_by_signal = false;
  std::string backend;
  int rank = 0;        ///< this process's rank in a data-parallel run (0 alone); rank 0 reports
  int world_size = 1;  ///< processes in the run
};

/**
 * @brief Run training; returns after `steps` (or stop_at, or a stop signal) with a final
 * checkpoint. The loop itself is trainer/loop.hpp; this picks the backend.
 * @throws ght::logic_error for a bad config, a run directory in use by another run or holding
 *         one (see TrainRunOptions::overwrite); ght::io_error for bad data or checkpoints
 */
TrainSummary train(const TrainConfig& cfg, const TrainRunOptions& run = {});

}  // namespace ght::trainer
