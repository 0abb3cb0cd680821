#pragma once
/**
 * @file loop.hpp
 * @brief The training loop, once for every backend.
 *
 * A backend (CPU reference, CUDA) supplies one optimizer step, the loss of one held-out batch,
 * and where its weights and optimizer live. Everything around the step lives here:
 *   - the run directory: lock, refusal to train over a previous run without --resume or
 *     --overwrite, a run id on every log.jsonl record;
 *   - the data: every shard checked before step 1, the training loader, the held-out loader;
 *   - resume (config check, optimizer state, weights, data position) and fresh initialisation;
 *   - the step record, eval every eval_every steps and at the end, SIGTERM/SIGINT save-and-exit,
 *     checkpoints every ckpt_every steps and at the last step;
 *   - after a failure in a step or an eval: a checkpoint of the last completed step, then the
 *     error again.
 *
 *     TrainSession s(cfg, run);      // out dir locked, data validated, loaders made
 *     CpuBackend b(s);               // the model and its optimizer
 *     TrainSummary sum = run_training(b, s);
 *
 * Several processes (data parallel, TrainSession::comm of size N > 1): every rank runs this loop
 * in lockstep with the same weights, and either its shard of the optimizer state (ZeRO-1,
 * TrainBackend::state_shards(), trainer/zero.hpp: every rank writes its part of each checkpoint,
 * and a resume on any N reshards) or all of it; every rank reads the same data stream
 * (so the loader's position is the same everywhere) and the backend computes its share of it.
 * Rank 0 alone owns the run directory: the lock, config.json, log.jsonl and the checkpoints.
 * Every rank reads the checkpoint on resume (the run directory must be on a shared file system).
 * Evals split the held-out batches over the ranks; a stop signal on any rank stops all of them
 * after the same step.
 *
 * DiLoCo (cfg.diloco.inner_steps > 0, trainer/diloco.hpp): the backend's step is local to each
 * rank, and the loop runs the outer step after every H steps and the last, on the optimizer's
 * master; every rank writes its own shard of each checkpoint (trainer/README.md).
 */
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/data.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/model.hpp"
#include "trainer/run_dir.hpp"
#include "trainer/train.hpp"
#include "trainer/train_config.hpp"

namespace ght::optimizer {
class AdamW;
}

namespace ght::trainer {

class MetricsLogger;
class StateShards;

/// What one optimizer step produced; the loop turns it into the step record.
struct StepOutcome {
  double loss = 0;       ///< mean training cross-entropy over the step's micro-batches
  double aux_loss = 0;   ///< mean load-balance loss
  double grad_norm = 0;  ///< global norm before clipping
  double seconds = 0;    ///< the step's wall time (tokens/s is computed from it)
  std::optional<double> mfu, mfu_seed, link_gb_h2d, link_gb_d2h;
};

/// The state of one `train` invocation that outlives its backend's pieces.
class TrainSession {
 public:
  /**
   * @brief Validate the config, lock the run directory, check it against `run` (an old run
   * there needs run.resume or run.overwrite), check every train and val shard, make the loaders.
   * `comm`: the processes of a data-parallel run (null: this process alone). A collective
   * agrees on the run id; only rank 0 locks and writes the run directory.
   * @throws ght::logic_error (config, a locked or non-empty run directory), ght::io_error (data)
   */
  TrainSession(const TrainConfig& cfg, const TrainRunOptions& run,
               std::shared_ptr<dist::Communicator> comm = nullptr);

  /// A progress note (info level; nothing when run.quiet, nor on ranks other than 0).
  void say(const std::string& s) const;
  /**
   * @brief Train with `micro_batch` sequences per micro-batch and `grad_accum` of them per step
   * (the plan's choice, same tokens per step) before the first step: the training loader is made
   * again and config.json rewritten. The held-out loader keeps the configured micro-batch, so that
   * evaluation reads the same tokens whatever the plan chose (backends evaluate Batch::batch rows).
   * @throws ght::logic_error when the tokens per step would change
   */
  void reshape(int micro_batch, int grad_accum);
  /// Rank 0: the one that writes the run directory.
  [[nodiscard]] bool leader() const noexcept { return comm->rank() == 0; }
  /// Tokens of one optimizer step over all ranks.
  [[nodiscard]] std::int64_t tokens_per_step() const noexcept {
    return cfg.model.tokens_per_step() * comm->size();
  }

  TrainConfig cfg;
  TrainRunOptions run;
  DataSplit split;
  std::unique_ptr<DataLoader> loader;      ///< the training data
  std::unique_ptr<DataLoader> val_loader;  ///< held-out data (null when there is none)
  std::string run_id;
  std::int64_t step = 0;  ///< optimizer steps completed so far
  TrainSummary summary;   ///< filled as the run goes (what an error report can cite)
  /// The processes of this run (world size 1 when not launched as several); never null.
  std::shared_ptr<dist::Communicator> comm;

 private:
  void write_config() const;  // config.json in the run directory (rank 0)
  std::unique_ptr<RunDirLock> lock_;
};

/// One backend of the loop. Its parameter tensors are its optimizer's regions, in order, unless
/// its state is sharded (state_shards()).
class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual const std::vector<NamedTensor>& tensors() const = 0;
  [[nodiscard]] virtual optimizer::AdamW& optimizer() = 0;
  /**
   * @brief ZeRO-1 (dist.optimizer_state=sharded with N > 1 data-parallel ranks, trainer/zero.hpp):
   * which slice of which tensor each of this rank's optimizer regions holds. Checkpoints are
   * then written per rank and resume on any number of ranks. Null: region r is tensor r, whole.
   */
  [[nodiscard]] virtual const StateShards* state_shards() const { return nullptr; }
  /// Fresh start: the initial weights (from the seed) into the model and the optimizer's master.
  virtual void init_weights(std::uint64_t seed) = 0;
  /// Resume: tensor r's fp32 weights into the model (the optimizer state is loaded already).
  virtual void load_weights(std::size_t r, std::span<const float> w) = 0;
  /**
   * @brief GHT_OPT_DELAY=1, the one-step-delayed update: the update of step k is applied to what
   * the model computes with only after step k+1's forward and backward, so step k+1 computes
   * with the weights after update k-1 (extrapolated by GHT_OPT_DELAY_PREDICT of that update).
   * Checkpoints then also keep those compute weights, and a resume restores them after
   * load_weights (read_compute_weights, load_compute_weights).
   */
  [[nodiscard]] virtual bool delayed_update() const { return false; }
  /// Delayed mode: tensor r's weights as the step `ahead` steps after the next one computes with
  /// them, as fp32: ahead 0 is the next step, 1 the one after (the update in flight writes those).
  virtual void read_compute_weights(std::size_t r, int ahead, std::span<float> out);
  /// Delayed mode, on resume after load_weights(r, master): tensor r's weights for that step.
  virtual void load_compute_weights(std::size_t r, int ahead, std::span<const float> w);
  /**
   * @brief One optimizer step: grad_accum micro-batches from `data`, forward and backward, then
   * the update at `lr`. `step` is the number of steps completed before this one. With N ranks,
   * each step reads N·grad_accum micro-batches from `data`, and rank r computes the ones at
   * positions r, r+N, ...; the outcome's losses are the means over all of them. Data
   * parallel updates with the gradient over all of them; with DiLoCo each rank updates its own
   * optimizer with the gradient over its own (no gradient all-reduce).
   */
  virtual StepOutcome step(std::int64_t step, double lr, DataLoader& data) = 0;
  /// Mean cross-entropy of one held-out batch (no gradients, no update).
  virtual double eval_loss(const Batch& b) = 0;

  /// Once, after log.jsonl is open: records of its own (e.g. the MFU formula).
  virtual void on_start(MetricsLogger& /*log*/) {}
  /// After each step's record is logged: extra records and lines (e.g. the CUDA profile).
  virtual void after_step(std::int64_t /*step*/, MetricsLogger& /*log*/) {}
  /// An eval or a checkpoint runs between this step and the next (not step time).
  virtual void before_extra_work() {}
  /// Wait for asynchronous work (before a checkpoint is read, at the end of the run).
  virtual void synchronize() {}
  /**
   * @brief After step() threw: make the optimizer state that of the last completed step, if it
   * can be (e.g. undo speculative updates). false: the state cannot be trusted; no checkpoint.
   */
  virtual bool recover_after_failed_step() { return true; }
  /// The run ended: normally (ok) or by an exception.
  virtual void finish(bool /*ok*/) {}
};

/// The CPU reference backend (fp32 OpenMP model, CPU AdamW), defined in train.cpp.
[[nodiscard]] std::unique_ptr<TrainBackend> make_cpu_backend(const TrainSession& s);

/// Run the loop on `s` until cfg.steps (or run.stop_at, or a stop signal), with a checkpoint at
/// the end. @throws what the backend or the data throws, after a checkpoint where one is safe
TrainSummary run_training(TrainBackend& backend, TrainSession& s);

}  // namespace ght::trainer
