// TrainSession (loop.hpp): the state of one `train` invocation that outlives its backend's pieces:
// the run id, the run directory's lock and previous-run check, the checked shards and their
// loaders, config.json, and the plan's micro-batch (reshape).
#include "trainer/loop.hpp"

#include <cstdio>
#include <filesystem>

#include "tier/error.hpp"
#include "tier/log.hpp"
#include "trainer/file_io.hpp"
#include "trainer/run_dir.hpp"

namespace ght::trainer {

namespace fs = std::filesystem;

namespace {

LoaderOptions loader_options(const TrainConfig& cfg, bool shuffle) {
  LoaderOptions lo;
  lo.batch = cfg.model.micro_batch;
  lo.seq_len = cfg.model.seq_len;
  lo.vocab = cfg.model.vocab;
  lo.shuffle = shuffle;
  if (shuffle) lo.seed = cfg.seed;
  return lo;
}

}  // namespace

TrainSession::TrainSession(const TrainConfig& cfg_in, const TrainRunOptions& run_in,
                           std::shared_ptr<dist::Communicator> comm_in)
    : cfg(cfg_in), run(run_in), comm(comm_in ? std::move(comm_in) : dist::make_single_communicator()) {
  cfg.validate();
  run_id = new_run_id();
  // The run id goes in every rank's records; rank 0's is the run's.
  if (comm->size() > 1) {
    char id[64] = {};
    run_id.copy(id, sizeof id - 1);
    comm->broadcast(id, sizeof id, 0);
    run_id = id;
  }
  if (leader()) lock_ = std::make_unique<RunDirLock>(cfg.out);
  if (leader() && run.resume.empty() && holds_run(cfg.out)) {
    GHT_EXPECTS(run.overwrite, "run directory " + cfg.out +
                                   " already holds a run (checkpoints or log.jsonl); use --resume auto to "
                                   "continue it, or --overwrite to delete its checkpoints and log and start over");
    clear_run(cfg.out);
    say("--overwrite: removed the previous run's checkpoints and log from " + cfg.out);
  }

  // Every shard the run reads is checked now, not at its first use hours in: headers and sizes
  // of the training shards (the loader range-checks their tokens as it loads each one), and all
  // of the held-out data, which every eval reads.
  split = resolve_split(cfg.data);
  GHT_EXPECTS(!split.train.empty(), "no train_* shards under " + cfg.data + " (run `ght prep` first)");
  for (const auto& p : split.train) (void)read_shard_info(p);
  for (const auto& p : split.val) (void)read_shard(p, cfg.model.vocab);
  loader = std::make_unique<DataLoader>(split.train, loader_options(cfg, true));
  if (!split.val.empty()) val_loader = std::make_unique<DataLoader>(split.val, loader_options(cfg, false));
  write_config();

  const double needed = static_cast<double>(cfg.steps) * static_cast<double>(tokens_per_step());
  const auto have = static_cast<double>(loader->tokens_per_epoch());
  if (have > 0 && needed > have && leader()) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.3g tokens of training (%lld steps) is %.2f passes over the %.3g tokens of train shards: the data repeats",
                  needed, static_cast<long long>(cfg.steps), needed / have, have);
    log::warn(buf);
  }
}

void TrainSession::write_config() const {
  // The resolved configuration, for people and tools that look in the run directory (it is also
  // in log.jsonl's config record and in each checkpoint).
  if (leader()) {
    fileio::atomic_write((fs::path(cfg.out) / "config.json").string(), cfg.to_json().dump(2) + "\n");
  }
}

void TrainSession::reshape(int micro_batch, int grad_accum) {
  const std::int64_t before = cfg.model.tokens_per_step();
  GHT_EXPECTS(static_cast<std::int64_t>(cfg.model.seq_len) * micro_batch * grad_accum == before,
              "reshape: micro-batch " + std::to_string(micro_batch) + " x " + std::to_string(grad_accum) +
                  " accumulation steps does not keep the step's " + std::to_string(before) + " tokens");
  if (micro_batch == cfg.model.micro_batch) return;
  say("the plan trains with micro-batches of " + std::to_string(micro_batch) + " sequences, " +
      std::to_string(grad_accum) + " per step (configured: " + std::to_string(cfg.model.micro_batch) + " x " +
      std::to_string(cfg.model.grad_accum) + "); evaluation keeps the configured micro-batch, so it reads the "
      "same held-out tokens");
  cfg.model.micro_batch = micro_batch;
  cfg.model.grad_accum = grad_accum;
  loader = std::make_unique<DataLoader>(split.train, loader_options(cfg, true));
  write_config();
}

void TrainSession::say(const std::string& s) const {
  if (!run.quiet && leader()) log::info(s);
}

}  // namespace ght::trainer
