#include "trainer/loop.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "optimizer/adamw.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/log.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/diloco.hpp"
#include "trainer/metrics_log.hpp"
#include "trainer/regions.hpp"
#include "trainer/signals.hpp"
#include "trainer/zero.hpp"

namespace ght::trainer {

namespace fs = std::filesystem;

namespace {

// Uninstalls the stop handlers however the loop ends.
struct StopHandlers {
  StopHandlers() { install_stop_handlers(); }
  ~StopHandlers() { uninstall_stop_handlers(); }
  StopHandlers(const StopHandlers&) = delete;
  StopHandlers& operator=(const StopHandlers&) = delete;
};

// DiLoCo's outer optimizer, with the backend's tensors laid out flat in tensor order; streaming
// DiLoCo's fragments as tensor lists (`fragments`) and flat ranges (the outer optimizer's).
struct Diloco {
  // `offset` is declared first: it is filled while `outer` is constructed.
  Diloco(TrainBackend& be, const TrainSession& s) : outer(s.cfg.diloco, flat_size(be, offset), *s.comm, be.optimizer().allocator()) {
    if (!s.cfg.diloco.streaming()) return;
    fragments = diloco_fragment_tensors(be.tensors(), static_cast<int>(s.cfg.diloco.fragments));
    std::vector<std::vector<dist::Range>> ranges;
    for (const auto& f : fragments) {
      auto& r = ranges.emplace_back();
      for (std::size_t t : f) r.push_back({offset[t], offset[t] + be.tensors()[t].numel});
    }
    outer.set_fragments(std::move(ranges));
  }
  // Offsets of the tensors in the flat buffers; returns the total.
  static std::size_t flat_size(TrainBackend& be, std::vector<std::size_t>& offset) {
    std::size_t n = 0;
    for (const NamedTensor& t : be.tensors()) {
      offset.push_back(n);
      n += t.numel;
    }
    return n;
  }
  // Tensor r's part of a flat buffer.
  [[nodiscard]] std::span<float> slice(std::span<float> flat, std::size_t r, const TrainBackend& be) const {
    return flat.subspan(offset[r], be.tensors()[r].numel);
  }
  std::vector<std::size_t> offset;
  DilocoOuter outer;
  std::vector<std::vector<std::size_t>> fragments;  // streaming: tensor indices per fragment
};

// The shared part's momentum file and each rank's shard: its θ_local (= its AdamW master), m and
// v as tensors "master.<name>", "adam_m.<name>", "adam_v.<name>", its AdamW step in the metadata.
constexpr const char* kMomentumFile = "diloco.momentum.safetensors";
// Streaming DiLoCo: the summed pseudo-gradients of the fragment in flight at the checkpoint.
constexpr const char* kPendingFile = "diloco.pending.safetensors";
// GHT_OPT_DELAY=1: the weights the next step computes with (one update behind master; with a
// partial delay, GHT_OPT_DELAY_MICRO, its first micro-batches, the others compute with master),
// and with a weight prediction (GHT_OPT_DELAY_PREDICT ≠ 0) also those of the step after it,
// which the update in flight at the checkpoint wrote (without one they are master's).
constexpr const char* kComputeWeightsFiles[2] = {"delayed.compute_weights.safetensors",
                                                 "delayed.next_compute_weights.safetensors"};
int compute_weight_files(int grad_accum) { return delay_weight_extrapolation(grad_accum) != 0 ? 2 : 1; }
constexpr const char* kShardPrefixes[3] = {"master.", "adam_m.", "adam_v."};
std::string shard_file(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "diloco.rank_%05d.safetensors", rank);
  return buf;
}

// Every tensor, in order.
std::vector<std::size_t> all_tensors(const TrainBackend& be) {
  std::vector<std::size_t> t(be.tensors().size());
  for (std::size_t r = 0; r < t.size(); ++r) t[r] = r;
  return t;
}

// θ_local (the optimizer's master) -> outer.local(), for the tensors `which`.
void gather_local(TrainBackend& be, Diloco& d, const std::vector<std::size_t>& which) {
  // The CUDA backend may still be launching the inner step's update from a thread of its own
  // (GHT_OPT_LAUNCH_THREAD): the optimizer is not to be touched from here until it is done.
  be.synchronize();
  for (std::size_t r : which) be.optimizer().save_state(r, d.slice(d.outer.local(), r, be).data(), nullptr, nullptr);
}

// A flat buffer (θ_global, or a streaming fragment's merged weights) -> the optimizer's master
// and the model's weights, for the tensors `which`.
void scatter(TrainBackend& be, Diloco& d, std::span<float> flat, const std::vector<std::size_t>& which) {
  for (std::size_t r : which) {
    const std::span<float> g = d.slice(flat, r, be);
    be.optimizer().load_state(r, g.data(), nullptr, nullptr);
    be.load_weights(r, g);
  }
}

// The outer optimizer's work after inner step `step` (plain: the whole-model step every H steps
// and after the last; streaming: the fragment schedule, DilocoOuter::due_streaming); returns the
// outer record to log, if any.
std::optional<nlohmann::ordered_json> outer_work(TrainBackend& be, Diloco& d, const TrainConfig& cfg, std::int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  auto record = [&](double norm, std::optional<std::size_t> fragment) {
    nlohmann::ordered_json j = {{"type", "outer"}, {"step", step}};
    if (fragment) j["fragment"] = *fragment;
    j["pseudo_grad_norm"] = norm;
    // The outer work's time (state copies, the all-reduce or its unhidden wait, the update).
    j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    j["allreduce_seconds"] = d.outer.last_allreduce_seconds();
    j["allreduce_bytes"] = d.outer.last_allreduce_bytes();  // per rank: 4 per value, 2 with bf16 pseudo-gradients
    return j;
  };
  // The whole model's outer step: every θ_local in, θ_global out.
  auto whole_step = [&] {
    const std::vector<std::size_t> every = all_tensors(be);
    gather_local(be, d, every);
    const double norm = d.outer.step();
    scatter(be, d, d.outer.global(), every);
    return record(norm, std::nullopt);
  };
  if (!cfg.diloco.streaming()) {
    if (!d.outer.due(step, cfg.steps)) return std::nullopt;
    return whole_step();
  }
  const OuterDue due = d.outer.due_streaming(step, cfg.steps);
  std::optional<nlohmann::ordered_json> out;
  if (due.send) {
    gather_local(be, d, d.fragments[*due.send]);
    d.outer.send(*due.send, step);
  }
  if (due.apply) {
    const auto& f = d.fragments[*due.apply];
    gather_local(be, d, f);
    const double norm = d.outer.apply(*due.apply);
    scatter(be, d, d.outer.local(), f);
    out = record(norm, *due.apply);
  }
  if (due.full) out = whole_step();  // the closing step's record (a fragment's applied just before goes unlogged)
  d.outer.progress();
  return out;
}

std::vector<CheckpointTensorView> flat_views(const TrainBackend& be, const Diloco& d, std::span<const float> flat) {
  std::vector<CheckpointTensorView> v;
  for (std::size_t r = 0; r < be.tensors().size(); ++r) {
    const NamedTensor& t = be.tensors()[r];
    v.push_back({t.name, t.shape, flat.subspan(d.offset[r], t.numel)});
  }
  return v;
}

// Rank 0 learns the size and checksum of every rank's shard (one broadcast per rank); `file`
// names rank r's.
std::vector<CheckpointFile> gather_shard_entries(dist::Communicator& comm, const CheckpointFile& mine,
                                                 std::string (*file)(int) = shard_file) {
  std::vector<CheckpointFile> all;
  for (int root = 0; root < comm.size(); ++root) {
    std::uint64_t e[2] = {mine.size, mine.xxh3_64};
    comm.broadcast(e, sizeof e, root);
    all.push_back({file(root), e[0], e[1]});
  }
  return all;
}

// Region r's master (i = 0), m (1) or v (2) as fp32 on the host: in place where it lives there
// as fp32, else copied into a buffer of `owned` (HBM state; bf16 m and v are widened, exactly).
std::span<const float> host_state(optimizer::AdamW& opt, std::size_t r, int i, std::vector<std::vector<float>>& owned) {
  const TensorClass cls[3] = {TensorClass::master, TensorClass::adam_m, TensorClass::adam_v};
  const optimizer::StateBuffer& sb = opt.state(r, cls[i]);
  const std::size_t n = opt.region(r).n;
  if (sb.host != nullptr && (i == 0 || opt.state_type() == optimizer::StateType::fp32)) {
    return {static_cast<const float*>(sb.host), n};
  }
  auto& o = owned.emplace_back(n);
  opt.save_state(r, i == 0 ? o.data() : nullptr, i == 1 ? o.data() : nullptr, i == 2 ? o.data() : nullptr);
  return o;
}

// What every checkpoint records besides the tensors.
CheckpointView checkpoint_base(const TrainSession& s) {
  CheckpointView v;
  v.data_position = s.loader->state().to_json();
  v.rng = {{"init_seed", s.cfg.seed}, {"note", "training draws no random numbers after init"}};
  v.config = s.cfg.to_json();
  return v;
}

// ZeRO-1 (trainer/zero.hpp; every rank calls it, a collective): model.safetensors holds the whole
// fp32 master, gathered one tensor at a time (rank 0 writes it), and every rank writes the m and
// v of its slices to its zero.rank_NNNNN file in the staging directory; rank 0 commits once
// every shard is written. Returns the directory on rank 0, "" on the others.
std::string save_sharded(TrainBackend& be, const TrainSession& s, std::int64_t step, const StateShards& zs) {
  GHT_EXPECTS(!be.delayed_update(), "checkpoint: sharded optimizer state with GHT_OPT_DELAY=1 is not built");
  be.synchronize();
  optimizer::AdamW& opt = be.optimizer();
  opt.synchronize();
  const auto& ts = be.tensors();
  const auto& sl = zs.slices();
  std::vector<CheckpointTensorView> mine;  // adam_m.<name>..., then adam_v.<name>...
  std::vector<std::vector<float>> owned;
  owned.reserve(2 * sl.size());
  for (int i = 1; i < 3; ++i) {
    for (std::size_t r = 0; r < sl.size(); ++r) {
      mine.push_back({kShardPrefixes[i] + ts[sl[r].tensor].name, {static_cast<std::int64_t>(sl[r].n)},
                      host_state(opt, r, i, owned)});
    }
  }
  // Tensor t's master: this rank's slice of it (at most one), then every rank's.
  auto gather = [&](std::size_t t, std::span<float> out) {
    for (std::size_t r = 0; r < sl.size(); ++r) {
      if (sl[r].tensor == t) opt.save_state(r, out.data() + sl[r].first, nullptr, nullptr);
    }
    s.comm->all_gather(out.data(), zs.tensor_counts(t));
  };
  const int rank = s.comm->rank(), ranks = s.comm->size();
  auto write_shards = [&](const std::string& staging) {
    s.comm->barrier();  // rank 0 has made the staging directory
    const CheckpointFile f =
        write_tensor_file(staging, zero_shard_file(rank), mine, zero_shard_metadata(ts, sl, rank, ranks));
    return gather_shard_entries(*s.comm, f, zero_shard_file);
  };
  if (!s.leader()) {
    std::size_t largest = 0;
    for (const NamedTensor& t : ts) largest = std::max(largest, t.numel);
    FloatBuffer buf(largest);
    for (std::size_t t = 0; t < ts.size(); ++t) gather(t, std::span<float>(buf.data(), ts[t].numel));
    (void)write_shards(staging_dir(s.cfg.out, step));
    return {};
  }
  CheckpointView v = checkpoint_base(s);
  for (const NamedTensor& t : ts) v.weights.push_back({t.name, t.shape, {}});
  v.weights_source = gather;
  v.optimizer = {{"step", opt.step_count()},
                 {"state_dtype", optimizer::to_string(opt.state_type())},
                 {"steps_skipped_nonfinite", opt.stats().steps_skipped_nonfinite},
                 {"world_size", ranks},
                 {"delayed_update", false},
                 {"zero_ranks", ranks}};
  v.extra_files = write_shards;
  const std::string dir = save(s.cfg.out, step, v);
  prune(s.cfg.out, s.cfg.keep);
  return dir;
}

// The checkpoint of the backend's current state: the optimizer's fp32 master (also the weights,
// as on every backend), m and v, read in place where they live on the host as fp32. bf16 m and v
// (GHT_OPT_STATE=bf16) are widened into F32 tensors, q8 ones dequantized (both exact, and loading
// them gives back the same bytes, so such a run resumes byte for byte; one file format for every
// type); optimizer.json records the type. With DiLoCo every rank calls
// it (a collective): rank 0 writes θ_global as the weights, the momentum and the shared files,
// every rank its own shard into the same staging directory, and rank 0 commits the whole once
// every shard is written. Returns the directory on rank 0, "" on the others. ZeRO-1: save_sharded.
std::string save_checkpoint(TrainBackend& be, const TrainSession& s, std::int64_t step, Diloco* dl) {
  if (const StateShards* zs = be.state_shards()) return save_sharded(be, s, step, *zs);
  be.synchronize();
  optimizer::AdamW& opt = be.optimizer();
  opt.synchronize();
  const auto& ts = be.tensors();
  std::vector<CheckpointTensorView> state[3];  // master, m, v
  std::vector<std::vector<float>> owned;  // state that lives in HBM is copied down
  owned.reserve(3 * ts.size());
  for (std::size_t r = 0; r < ts.size(); ++r) {
    for (int i = 0; i < 3; ++i) {
      state[i].push_back({(dl != nullptr ? kShardPrefixes[i] : "") + ts[r].name, ts[r].shape, host_state(opt, r, i, owned)});
    }
  }
  CheckpointView v = checkpoint_base(s);
  if (dl == nullptr) {
    v.weights = state[0];
    v.master = state[0];
    v.adam_m = state[1];
    v.adam_v = state[2];
    v.optimizer = {{"step", opt.step_count()},
                   {"state_dtype", optimizer::to_string(opt.state_type())},
                   {"steps_skipped_nonfinite", opt.stats().steps_skipped_nonfinite},
                   {"world_size", s.comm->size()},
                   {"delayed_update", be.delayed_update()}};
    if (be.delayed_update()) {
      const int files_kept = compute_weight_files(s.cfg.model.grad_accum);
      v.extra_files = [&be, &ts, files_kept](const std::string& staging) {
        std::vector<CheckpointFile> files;
        for (int ahead = 0; ahead < files_kept; ++ahead) {
          std::vector<FloatBuffer> w;
          std::vector<CheckpointTensorView> views;
          w.reserve(ts.size());
          for (std::size_t r = 0; r < ts.size(); ++r) {
            FloatBuffer& b = w.emplace_back(ts[r].numel);
            be.read_compute_weights(r, ahead, std::span<float>(b.data(), b.size()));
            views.push_back({ts[r].name, ts[r].shape, std::span<const float>(b.data(), b.size())});
          }
          files.push_back(write_tensor_file(staging, kComputeWeightsFiles[ahead], views, {{"format", "pt"}}));
        }
        return files;
      };
    }
    const std::string dir = save(s.cfg.out, step, v);
    prune(s.cfg.out, s.cfg.keep);
    return dir;
  }
  // DiLoCo: master, m and v are per rank (the shards); the standard optimizer files hold none.
  std::vector<CheckpointTensorView> shard;
  for (const auto& part : state) shard.insert(shard.end(), part.begin(), part.end());
  const StMetadata shard_meta = {{"format", "pt"},
                                 {"rank", std::to_string(s.comm->rank())},
                                 {"optimizer_step", std::to_string(opt.step_count())}};
  v.weights = flat_views(be, *dl, dl->outer.global());
  v.optimizer = {{"state_dtype", optimizer::to_string(opt.state_type())}, {"world_size", s.comm->size()}, {"diloco", true}};
  // Streaming: a fragment's all-reduce in flight is waited for, and its (identical on every rank)
  // sum goes into the checkpoint, to be applied after the same step on resume.
  const std::span<const float> pending = dl->outer.settle();
  const std::optional<std::size_t> pending_fragment = dl->outer.pending();
  auto write_shards = [&](const std::string& staging) {
    s.comm->barrier();  // rank 0 has made the staging directory
    std::vector<CheckpointFile> files;
    if (s.leader()) files.push_back(write_tensor_file(staging, kMomentumFile, flat_views(be, *dl, dl->outer.momentum()), {{"format", "pt"}}));
    if (s.leader() && pending_fragment) {
      files.push_back(write_tensor_file(staging, kPendingFile, {{"pending", {static_cast<std::int64_t>(pending.size())}, pending}},
                                        {{"format", "pt"},
                                         {"fragment", std::to_string(*pending_fragment)},
                                         {"sent_at", std::to_string(dl->outer.pending_sent_at())}}));
    }
    const CheckpointFile mine = write_tensor_file(staging, shard_file(s.comm->rank()), shard, shard_meta);
    for (CheckpointFile& f : gather_shard_entries(*s.comm, mine)) files.push_back(std::move(f));
    return files;
  };
  if (!s.leader()) {
    (void)write_shards(staging_dir(s.cfg.out, step));
    return {};
  }
  v.extra_files = write_shards;
  const std::string dir = save(s.cfg.out, step, v);
  prune(s.cfg.out, s.cfg.keep);
  return dir;
}

// Tensor r of a checkpoint's list must be the backend's tensor r.
void check_tensor(const std::string& where, const std::string& what, const CheckpointTensor& c, const NamedTensor& t,
                  const std::string& prefix = "") {
  GHT_EXPECTS(c.name == prefix + t.name && c.data.size() == t.numel,
              "checkpoint " + where + ": " + what + " tensor " + c.name + " does not match the model's " + prefix + t.name);
}

// DiLoCo's part of a resume: θ_global and the momentum (shared), this rank's shard.
void restore_diloco(TrainBackend& be, const TrainSession& s, const LoadedCheckpoint& ck, Diloco& dl) {
  const CheckpointData& c = ck.data;
  const auto& ts = be.tensors();
  const int rank = s.comm->rank();
  auto file = [&](const std::string& name) -> const CheckpointTensorFile& {
    const auto it = c.tensor_files.find(name);
    if (it == c.tensor_files.end()) {
      throw io_error("checkpoint " + ck.dir + ": its manifest lists no " + name + " (rank " + std::to_string(rank) +
                     " of a DiLoCo run needs it)");
    }
    GHT_EXPECTS(it->second.tensors.size() == (name == kMomentumFile ? 1 : 3) * ts.size(),
                "checkpoint " + ck.dir + ": " + name + " holds " + std::to_string(it->second.tensors.size()) +
                    " tensors; the model has " + std::to_string(ts.size()) + " per part");
    return it->second;
  };
  const CheckpointTensorFile& momentum = file(kMomentumFile);
  const CheckpointTensorFile& shard = file(shard_file(rank));
  GHT_EXPECTS(c.weights.size() == ts.size(), "checkpoint " + ck.dir + " has " + std::to_string(c.weights.size()) +
                                                 " weight tensors; the model has " + std::to_string(ts.size()));
  optimizer::AdamW& opt = be.optimizer();
  for (std::size_t r = 0; r < ts.size(); ++r) {
    const CheckpointTensor* part[3];
    for (int i = 0; i < 3; ++i) {
      part[i] = &shard.tensors[i * ts.size() + r];
      check_tensor(ck.dir, shard_file(rank), *part[i], ts[r], kShardPrefixes[i]);
    }
    check_tensor(ck.dir, "weight", c.weights[r], ts[r]);
    check_tensor(ck.dir, kMomentumFile, momentum.tensors[r], ts[r]);
    opt.load_state(r, part[0]->data.data(), part[1]->data.data(), part[2]->data.data());
    be.load_weights(r, std::span<const float>(part[0]->data.data(), ts[r].numel));
    std::copy(c.weights[r].data.begin(), c.weights[r].data.end(), dl.slice(dl.outer.global(), r, be).begin());
    std::copy(momentum.tensors[r].data.begin(), momentum.tensors[r].data.end(), dl.slice(dl.outer.momentum(), r, be).begin());
  }
  const auto step = shard.metadata.find("optimizer_step");
  GHT_EXPECTS(step != shard.metadata.end(), "checkpoint " + ck.dir + ": " + shard_file(rank) + " has no optimizer_step");
  opt.set_step_count(std::stoll(step->second));
  // Streaming: the fragment in flight when the checkpoint was written, on the same fragments.
  if (const auto p = c.tensor_files.find(kPendingFile); p != c.tensor_files.end()) {
    const DilocoConfig saved = TrainConfig::from_json(c.config).diloco;
    GHT_EXPECTS(saved.fragments == s.cfg.diloco.fragments && saved.overlap_steps == s.cfg.diloco.overlap_steps,
                "checkpoint " + ck.dir + " holds a streaming DiLoCo fragment in flight of diloco.fragments=" +
                    std::to_string(saved.fragments) + ", overlap_steps=" + std::to_string(saved.overlap_steps) +
                    "; this run has " + std::to_string(s.cfg.diloco.fragments) + " and " +
                    std::to_string(s.cfg.diloco.overlap_steps) + ": resume it with the same two");
    const auto& m = p->second.metadata;
    GHT_EXPECTS(m.contains("fragment") && m.contains("sent_at") && p->second.tensors.size() == 1,
                "checkpoint " + ck.dir + ": " + kPendingFile + " is malformed");
    dl.outer.restore_pending(std::stoul(m.at("fragment")), std::stoll(m.at("sent_at")), p->second.tensors[0].data);
  }
}

// Delayed mode: the next step (and with a weight prediction the one after) computes with the
// weights the checkpoint kept for it. A checkpoint of exact mode has none: the first step after
// the resume then computes with master, as the first step of a fresh run does (the delay starts
// over); one without the second file: the step after computes with master. Exact mode ignores
// them: it computes with master.
void restore_compute_weights(TrainBackend& be, const TrainSession& s, const LoadedCheckpoint& ck) {
  const auto it = ck.data.tensor_files.find(kComputeWeightsFiles[0]);
  if (!be.delayed_update()) {
    if (ck.data.optimizer.value("delayed_update", false)) {
      s.say("note: checkpoint " + ck.dir + " was written with GHT_OPT_DELAY=1; this run updates exactly and computes "
            "with its master weights from the first step on");
    }
    return;
  }
  if (it == ck.data.tensor_files.end()) {
    s.say("note: checkpoint " + ck.dir + " was written without GHT_OPT_DELAY: the first step after the resume computes "
          "with its master weights, and the one-step delay starts from there");
    return;
  }
  const auto& ts = be.tensors();
  for (int ahead = 0; ahead < compute_weight_files(s.cfg.model.grad_accum); ++ahead) {
    const char* name = kComputeWeightsFiles[ahead];
    const auto f = ck.data.tensor_files.find(name);
    if (f == ck.data.tensor_files.end()) {  // ahead 1 only: the first is there (above)
      s.say("note: checkpoint " + ck.dir + " was written without GHT_OPT_DELAY_PREDICT: the second step after the "
            "resume computes with its master weights, not with a prediction");
      continue;
    }
    GHT_EXPECTS(f->second.tensors.size() == ts.size(), "checkpoint " + ck.dir + ": " + name + " holds " +
                                                           std::to_string(f->second.tensors.size()) +
                                                           " tensors; the model has " + std::to_string(ts.size()));
    for (std::size_t r = 0; r < ts.size(); ++r) {
      const auto& t = f->second.tensors[r];
      check_tensor(ck.dir, name, t, ts[r]);
      be.load_compute_weights(r, ahead, std::span<const float>(t.data.data(), t.data.size()));
    }
  }
}

// The optimizer regions of a backend: its ZeRO-1 slices, or every tensor whole.
std::vector<TensorSlice> optimizer_slices(const TrainBackend& be) {
  return be.state_shards() != nullptr ? be.state_shards()->slices() : whole_tensors(be.tensors());
}

// Master, m and v of each of the backend's optimizer regions (whole tensors, or this rank's
// ZeRO-1 slices) from what the checkpoint holds: whole tensors, or the ZeRO-1 shards of any
// number of ranks, which `za` assembled while the checkpoint loaded. Either way the weights are
// the whole fp32 master, and they go into the model whole.
void restore_state(TrainBackend& be, const TrainSession& s, const LoadedCheckpoint& ck, const SliceAssembler& za) {
  const CheckpointData& c = ck.data;
  const std::string& where = ck.dir;
  const auto& ts = be.tensors();
  const int zero_ranks = c.optimizer.value("zero_ranks", 0);
  GHT_EXPECTS(c.weights.size() == ts.size(), "checkpoint " + where + " has " + std::to_string(c.weights.size()) +
                                                 " weight tensors; the model has " + std::to_string(ts.size()));
  for (std::size_t t = 0; t < ts.size(); ++t) check_tensor(where, "weight", c.weights[t], ts[t]);
  if (zero_ranks > 0) {
    za.check_complete(where, zero_ranks);
  } else {
    GHT_EXPECTS(c.master.size() == ts.size() && c.adam_m.size() == ts.size() && c.adam_v.size() == ts.size(),
                "checkpoint " + where + " has " + std::to_string(c.master.size()) + " optimizer tensors; the model has " +
                    std::to_string(ts.size()));
    for (std::size_t t = 0; t < ts.size(); ++t) {
      check_tensor(where, "master", c.master[t], ts[t]);
      check_tensor(where, "adam_m", c.adam_m[t], ts[t]);
      check_tensor(where, "adam_v", c.adam_v[t], ts[t]);
    }
  }
  // A ZeRO-1 checkpoint's master is its weights file.
  const std::vector<CheckpointTensor>& master = zero_ranks > 0 ? c.weights : c.master;
  optimizer::AdamW& opt = be.optimizer();
  const std::vector<TensorSlice> slices = optimizer_slices(be);
  for (std::size_t r = 0; r < slices.size(); ++r) {
    const TensorSlice& x = slices[r];
    const float* m = zero_ranks > 0 ? za.m(r).data() : c.adam_m[x.tensor].data.data() + x.first;
    const float* v = zero_ranks > 0 ? za.v(r).data() : c.adam_v[x.tensor].data.data() + x.first;
    opt.load_state(r, master[x.tensor].data.data() + x.first, m, v);
  }
  for (std::size_t t = 0; t < ts.size(); ++t) be.load_weights(t, std::span<const float>(master[t].data.data(), ts[t].numel));
  restore_compute_weights(be, s, ck);
  opt.set_step_count(c.optimizer.at("step").get<std::int64_t>());
  const int saved_world = c.optimizer.value("world_size", 1);
  if (saved_world != s.comm->size() && s.leader()) {
    log::warn("checkpoint " + where + " was written by " + std::to_string(saved_world) + " process(es), this run has " +
              std::to_string(s.comm->size()) + (zero_ranks > 0 || be.state_shards() != nullptr ? " (optimizer state resharded)" : "") +
              ": the data continues where it stopped, but each step now reads " + std::to_string(s.comm->size()) + "/" +
              std::to_string(saved_world) + " times as many tokens");
  }
}

void restore(TrainBackend& be, TrainSession& s, const LoadedCheckpoint& ck, Diloco* dl, const SliceAssembler& za) {
  const CheckpointData& c = ck.data;
  const std::string& where = ck.dir;
  // The architecture must match; training knobs may change on resume.
  const TrainConfig saved = TrainConfig::from_json(c.config);
  const nlohmann::json saved_model = {{"model", saved.to_json()["model"]}};
  const nlohmann::json this_model = {{"model", s.cfg.to_json()["model"]}};
  // The plan may have chosen another micro-batch here than where the checkpoint was written.
  const bool reshaped = saved.model.micro_batch != s.cfg.model.micro_batch &&
                        saved.model.tokens_per_step() == s.cfg.model.tokens_per_step();
  GHT_EXPECTS(saved_model == this_model,
              "checkpoint " + where + " was written for a different model config: " +
                  describe_difference(saved_model, this_model) +
                  (reshaped ? "; to resume with the checkpoint's micro-batch, add -o model.micro_batch=" +
                                  std::to_string(saved.model.micro_batch)
                            : std::string()));
  optimizer::AdamW& opt = be.optimizer();
  // Checkpoints of older builds carry no state type: theirs was fp32. Across types load_state
  // converts the F32 values the checkpoint holds: into bf16 it rounds m and v to nearest, into
  // q8 it quantizes them per block, into fp32 it takes them as they are (exact).
  const std::string saved_state = c.optimizer.value("state_dtype", "fp32");
  const optimizer::StateType state = optimizer::parse_state_type(saved_state);
  if (state != opt.state_type()) {
    const optimizer::StateType now = opt.state_type();
    s.say("note: checkpoint " + where + " holds " + saved_state + " AdamW m and v, this run keeps " +
          optimizer::to_string(now) + " (GHT_OPT_STATE): converted on load" +
          (now == optimizer::StateType::bf16 ? ", rounded to nearest"
           : now == optimizer::StateType::q8 ? ", quantized per 256-element block"
                                             : ", exactly"));
  }
  // Checkpoints of older builds carry no world size: they were written by one process.
  const int saved_world = c.optimizer.value("world_size", 1);
  // DiLoCo's inner states are per rank: they neither reshard nor merge into one.
  const bool saved_diloco = c.optimizer.value("diloco", false);
  GHT_EXPECTS(saved_diloco == (dl != nullptr),
              "checkpoint " + where + " was written " + (saved_diloco ? "with" : "without") +
                  " DiLoCo (diloco.inner_steps=" + std::to_string(saved.diloco.inner_steps) + "); this run has diloco.inner_steps=" +
                  std::to_string(s.cfg.diloco.inner_steps) + ": resume it with DiLoCo " + (saved_diloco ? "on" : "off"));
  if (dl != nullptr) {
    GHT_EXPECTS(saved_world == s.comm->size(),
                "checkpoint " + where + " holds the DiLoCo inner states of " + std::to_string(saved_world) +
                    " ranks, but this run has " + std::to_string(s.comm->size()) +
                    ": each rank's AdamW state is its own and cannot be resharded; resume on " +
                    std::to_string(saved_world) + " ranks");
    restore_diloco(be, s, ck, *dl);
  } else {
    restore_state(be, s, ck, za);
  }
  s.loader->restore(LoaderState::from_json(c.data_position));
  s.step = c.step;
}

// Every rank must resume from the same step (a checkpoint written in between, or a run directory
// that is not shared, would make them differ).
void check_same_step(const TrainSession& s) {
  if (s.comm->size() == 1) return;
  std::int64_t root_step = s.step;
  s.comm->broadcast(&root_step, sizeof root_step, 0);
  GHT_EXPECTS(root_step == s.step, "rank " + std::to_string(s.comm->rank()) + " starts at step " +
                                       std::to_string(s.step) + " but rank 0 at step " + std::to_string(root_step) +
                                       ": every rank must read the same checkpoint (is " + s.cfg.out +
                                       " on a file system all ranks share?)");
}

double evaluate(TrainBackend& be, TrainSession& s) {
  DataLoader& val = *s.val_loader;
  val.reset();  // every eval reads the same batches
  // With N ranks, rank r takes batches r, r+N, ... and the sums are added up.
  const int n = s.comm->size(), r = s.comm->rank();
  double sum = 0;
  Batch b;
  for (int i = 0; i < s.cfg.eval_batches; ++i) {
    val.next(b);
    if (i % n == r) sum += be.eval_loss(b);
  }
  s.comm->allreduce_sum(&sum, 1);
  return sum / s.cfg.eval_batches;
}

// A stop signal may reach the ranks at different steps; they all stop after the same one.
bool stop_everywhere(const TrainSession& s) {
  if (s.comm->size() == 1) return stop_requested();
  double any = stop_requested() ? 1 : 0;
  s.comm->allreduce_sum(&any, 1);
  return any > 0;
}


// DiLoCo's state when it is on (nullptr when off), its checkpoint files added to `lo`, and the
// lines that tell what it does.
std::unique_ptr<Diloco> start_diloco(TrainBackend& be, TrainSession& s, LoadOptions& lo) {
  const TrainConfig& cfg = s.cfg;
  if (!cfg.diloco.on()) return nullptr;
  auto dl = std::make_unique<Diloco>(be, s);
  lo.tensor_files = {kMomentumFile, shard_file(s.comm->rank()), kPendingFile};
  GHT_EXPECTS(!be.delayed_update(), "GHT_OPT_DELAY=1 with DiLoCo (diloco.inner_steps=" +
                                        std::to_string(cfg.diloco.inner_steps) +
                                        "): the delayed update is not built for DiLoCo's inner steps; unset one");
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "DiLoCo: %d worker(s), an outer step every %lld inner steps (and after step %lld), outer lr %g, "
                "Nesterov momentum %g, %s pseudo-gradients",
                s.comm->size(), static_cast<long long>(cfg.diloco.inner_steps), static_cast<long long>(cfg.steps),
                cfg.diloco.outer_lr, cfg.diloco.outer_momentum, cfg.diloco.bf16_pseudo_grads ? "bf16" : "fp32");
  s.say(buf);
  if (cfg.diloco.streaming()) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "streaming DiLoCo: %lld fragments (the model's units dealt out by stride), each synchronised "
                  "every %lld steps, %lld steps apart; each all-reduce overlaps %lld inner step(s); a synchronised "
                  "fragment keeps %g of its local weights",
                  static_cast<long long>(cfg.diloco.fragments), static_cast<long long>(cfg.diloco.inner_steps),
                  static_cast<long long>(cfg.diloco.inner_steps / cfg.diloco.fragments),
                  static_cast<long long>(cfg.diloco.overlap_steps), cfg.diloco.mix);
    s.say(line);
  }
  return dl;
}

// With a one-step-delayed update: its compute-weight files added to `lo`, and what it does told.
void start_delayed_update(const TrainBackend& be, const TrainSession& s, LoadOptions& lo) {
  if (!be.delayed_update()) return;
  for (const char* f : kComputeWeightsFiles) lo.tensor_files.push_back(f);
  const long long warm = delay_warmup_steps();
  const int A = s.cfg.model.grad_accum, stale = delay_stale_micro_batches(A);
  char what[320];
  if (stale < A) {
    std::snprintf(what, sizeof what,
                  "in its first %d of %d micro-batches (GHT_OPT_DELAY_MICRO), while update k runs; the other %d "
                  "wait for update k and compute with its weights; from step %lld on",
                  stale, A, A - stale, warm + 1);
  } else {
    std::snprintf(what, sizeof what,
                  "extrapolated by %g of that update (GHT_OPT_DELAY_PREDICT), in all %d micro-batches, while "
                  "update k runs, from step %lld on",
                  delay_weight_extrapolation(A), A, warm + 1);
  }
  s.say(std::string("optimizer: one-step-delayed update (GHT_OPT_DELAY=1): step k+1 computes with the weights "
                    "after update k-1 ") +
        what + (warm > 0 ? " (steps 1-" + std::to_string(warm) + " update exactly: GHT_OPT_DELAY_WARMUP)" : std::string()) +
        "; evals see the weights of the next step's first micro-batch, checkpoints keep them next to master");
  if (stale < A && config::cfg().get_float(config::Key::GHT_OPT_DELAY_PREDICT) != 0) {
    s.say("note: GHT_OPT_DELAY_PREDICT applies to the whole-step delay only; with GHT_OPT_DELAY_MICRO=" +
          std::to_string(stale) + " the weights are master's (unextrapolated)");
  }
}

// The run's state from the checkpoint --resume names, or fresh weights when there is none.
void resume_or_init(TrainBackend& be, TrainSession& s, Diloco* dl, LoadOptions& lo) {
  // ZeRO-1 shards stream through the assembler: it keeps the slices this rank holds now.
  SliceAssembler za(be.tensors(), optimizer_slices(be));
  lo.stream_prefix = kZeroShardPrefix;
  lo.stream = [&za](const std::string& dir, const std::string& file, const StMetadata& meta,
                    const CheckpointTensorView& t) { za.take(dir, file, meta, t); };
  if (const auto ck = load_for_resume(s.run.resume, s.cfg.out, [&](const std::string& m) { s.say(m); }, lo)) {
    restore(be, s, *ck, dl, za);
    s.say("resumed from " + ck->dir + " at step " + std::to_string(s.step));
  } else {
    be.init_weights(s.cfg.seed);  // the same seed on every rank: the same weights
    if (dl) {
      gather_local(be, *dl, all_tensors(be));
      std::copy(dl->outer.local().begin(), dl->outer.local().end(), dl->outer.global().begin());
    }
  }
}

// rank 0 logs for the run; the others stay silent
MetricsLogOptions metrics_log_options(const TrainSession& s) {
  MetricsLogOptions lopt;
  if (s.leader()) lopt.jsonl_path = (fs::path(s.cfg.out) / "log.jsonl").string();
  lopt.total_steps = s.cfg.steps;
  lopt.quiet = s.run.quiet || !s.leader();
  lopt.console_every = s.cfg.log_every;
  lopt.run_id = s.run_id;
  return lopt;
}

// The run's checkpoints: which ranks write them, and the last step saved.
class RunCheckpoints {
 public:
  RunCheckpoints(TrainBackend& be, TrainSession& s, Diloco* dl)
      : be_(be), s_(s), dl_(dl), enabled_(config::cfg().get_bool(config::Key::GHT_SAVE_CHECKPOINTS)),
        // With DiLoCo or ZeRO-1 every rank writes its shard of each checkpoint; otherwise rank 0
        // alone writes.
        per_rank_shards_(dl != nullptr || be.state_shards() != nullptr) {}

  bool enabled() const { return enabled_; }

  void save(std::int64_t step) {
    if (!enabled_ || (!s_.leader() && !per_rank_shards_)) return;
    s_.summary.last_checkpoint = save_checkpoint(be_, s_, step, dl_);
    saved_step_ = step;
  }

  // After an error: keep the last completed step's work (a fresh run's step 0 is not work).
  void save_before_rethrow(const char* where) {
    if (!enabled_ || !s_.leader() || s_.step == s_.summary.first_step || s_.step == saved_step_) return;
    if (per_rank_shards_ && s_.comm->size() > 1) {
      log::warn(std::string("the run failed in ") + where + "; no checkpoint of step " + std::to_string(s_.step) +
                ": a " + (dl_ ? "DiLoCo" : "sharded (ZeRO-1)") +
                " checkpoint needs every rank's shard, and the other ranks are not saving");
      return;
    }
    try {
      save(s_.step);
      log::warn(std::string("the run failed in ") + where + "; saved a checkpoint of step " +
                std::to_string(s_.step) + " first: " + s_.summary.last_checkpoint);
    } catch (const std::exception& e) {
      log::error(std::string("could not save a checkpoint after the failure: ") + e.what());
    }
  }

 private:
  TrainBackend& be_;
  TrainSession& s_;
  Diloco* dl_;
  bool enabled_;
  bool per_rank_shards_;
  std::int64_t saved_step_ = -1;
};

// One training step; after a failure that left the state of the step before, the loader is
// rewound and that step's work saved before the error goes on.
StepOutcome guarded_step(TrainBackend& be, TrainSession& s, double lr, RunCheckpoints& ckpt) {
  optimizer::AdamW& opt = be.optimizer();
  const LoaderState data_before = s.loader->state();
  const std::int64_t taken_before = opt.step_count(), skipped_before = opt.stats().steps_skipped_nonfinite;
  try {
    return be.step(s.step, lr, *s.loader);
  } catch (const ght::cuda_error&) {
    throw;  // the device's state is unknown: the last checkpoint is the one to trust
  } catch (...) {
    // Only when the update did not run: then the state is that of the step before.
    if (opt.step_count() == taken_before && opt.stats().steps_skipped_nonfinite == skipped_before &&
        be.recover_after_failed_step()) {
      s.loader->restore(data_before);
      ckpt.save_before_rethrow("a training step");
    }
    throw;
  }
}

StepRecord step_record(const StepOutcome& o, std::int64_t step, double lr, double tokens_per_step,
                       double elapsed_s, std::int64_t skipped_steps) {
  return {.step = step, .loss = o.loss, .aux_loss = o.aux_loss, .grad_norm = o.grad_norm, .lr = lr,
          .tokens_per_s = o.seconds > 0 ? tokens_per_step / o.seconds : 0, .mfu = o.mfu, .mfu_seed = o.mfu_seed,
          .link_gb_h2d = o.link_gb_h2d, .link_gb_d2h = o.link_gb_d2h, .elapsed_s = elapsed_s,
          .skipped_steps = skipped_steps};
}

// The eval after a step; after a failure that is not the device's, the step's work is saved first.
double guarded_eval(TrainBackend& be, TrainSession& s, RunCheckpoints& ckpt) {
  be.before_extra_work();
  try {
    return evaluate(be, s);
  } catch (const ght::cuda_error&) {
    throw;
  } catch (...) {
    ckpt.save_before_rethrow("an eval");
    throw;
  }
}

// The steps from s.step up to the last one this run takes, with their evals, checkpoints and
// stop signals.
void run_steps(TrainBackend& be, TrainSession& s, Diloco* dl, MetricsLogger& log) {
  const TrainConfig& cfg = s.cfg;
  TrainSummary& summary = s.summary;
  RunCheckpoints ckpt(be, s, dl);
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };
  const std::int64_t last = s.run.stop_at ? std::min(*s.run.stop_at, cfg.steps) : cfg.steps;
  const auto tokens_per_step = static_cast<double>(s.tokens_per_step());
  optimizer::AdamW& opt = be.optimizer();
  while (s.step < last) {
    const double lr = lr_at(cfg.schedule, s.step);
    const StepOutcome o = guarded_step(be, s, lr, ckpt);
    ++s.step;
    const std::optional<nlohmann::ordered_json> outer = dl ? outer_work(be, *dl, cfg, s.step) : std::nullopt;

    log.log_step(step_record(o, s.step, lr, tokens_per_step, elapsed(), opt.stats().steps_skipped_nonfinite));
    if (outer) log.log_event(*outer);
    be.after_step(s.step, log);
    summary.last_loss = o.loss;

    if (((cfg.eval_every > 0 && s.step % cfg.eval_every == 0) || s.step == cfg.steps) && s.val_loader) {
      summary.eval_loss = guarded_eval(be, s, ckpt);
      log.log_eval(s.step, *summary.eval_loss, elapsed());
    }
    if (stop_everywhere(s)) {
      const std::string by = stop_requested() ? "signal " + std::to_string(stop_signal()) : "another rank's stop signal";
      log.print(by + " received: checkpointing at step " + std::to_string(s.step) + " and exiting");
      ckpt.save(s.step);
      summary.stopped_by_signal = true;
      break;
    }
    if ((cfg.ckpt_every > 0 && s.step % cfg.ckpt_every == 0) || s.step == last) {
      be.before_extra_work();
      ckpt.save(s.step);
      if (ckpt.enabled() && s.leader()) log.print("checkpoint: " + summary.last_checkpoint);
    }
  }
}

}  // namespace

TrainSummary run_training(TrainBackend& be, TrainSession& s) {
  const TrainConfig& cfg = s.cfg;
  TrainSummary& summary = s.summary;
  summary.backend = be.name();
  summary.rank = s.comm->rank();
  summary.world_size = s.comm->size();
  bool ok = false;
  try {
    LoadOptions lo;
    const std::unique_ptr<Diloco> dl = start_diloco(be, s, lo);
    start_delayed_update(be, s, lo);
    resume_or_init(be, s, dl.get(), lo);
    check_same_step(s);
    summary.first_step = s.step;

    MetricsLogger log(metrics_log_options(s));
    log.log_event({{"type", "config"}, {"step", s.step}, {"config", cfg.to_json()}});
    be.on_start(log);

    const StopHandlers handlers;
    run_steps(be, s, dl.get(), log);
    be.synchronize();
    log.finish();
    ok = true;
  } catch (...) {
    be.finish(false);
    throw;
  }
  summary.last_step = s.step;
  be.finish(ok);
  return summary;
}

void TrainBackend::read_compute_weights(std::size_t /*r*/, int /*ahead*/, std::span<float> /*out*/) {
  throw ght::logic_error("the " + name() + " backend has no delayed update (GHT_OPT_DELAY)");
}

void TrainBackend::load_compute_weights(std::size_t /*r*/, int /*ahead*/, std::span<const float> /*w*/) {
  throw ght::logic_error("the " + name() + " backend has no delayed update (GHT_OPT_DELAY)");
}

}  // namespace ght::trainer
