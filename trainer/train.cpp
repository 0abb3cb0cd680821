// Backend choice and the CPU backend: the fp32 OpenMP reference model with the CPU AdamW. The
// loop around its step is trainer/loop.cpp.
#include "trainer/train.hpp"

#include <omp.h>

#include <chrono>

#include "alloc/tiered.hpp"
#include "optimizer/adamw.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/gpu_comm.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/fp8_experts.hpp"
#include "trainer/loop.hpp"
#include "trainer/model.hpp"
#include "trainer/regions.hpp"
#include "trainer/zero.hpp"

#ifdef GHT_HAVE_CUDA
#include "tier/cuda_check.hpp"
#include "trainer/cuda/train_cuda.hpp"
#endif

namespace ght::trainer {

namespace {

/// True when a CUDA device is usable; else `why` says why not.
bool gpu_present(std::string* why) {
#ifdef GHT_HAVE_CUDA
  return ght::detail::cuda_device_count(why) > 0;
#else
  *why = "this build has no CUDA";
  return false;
#endif
}

class CpuBackend final : public TrainBackend {
 public:
  explicit CpuBackend(const TrainSession& s) : cfg_(s.cfg), comm_(*s.comm), model_(s.cfg.model) {
    if (fp8_gemms_from_config() != Fp8Gemms::off) {
      throw ght::config_error("GHT_FP8=" + config::cfg().get_string(config::Key::GHT_FP8) +
                              ": FP8 GEMMs run on the cuda backend only, and this run uses the cpu backend; "
                              "unset GHT_FP8 (or set it to off)");
    }
    if (cfg_.threads > 0) omp_set_num_threads(cfg_.threads);
    // ZeRO-1: with N > 1 data-parallel ranks each holds one contiguous 1/N of master, m and v.
    if (comm_.size() > 1 && !cfg_.diloco.on() && cfg_.dist.sharded()) {
      if (delay_) throw ght::config_error(delay_with_shards_message(comm_.size()));
      shards_ = std::make_unique<StateShards>(model_.tensors(), StateShards::whole_model(model_.tensors()), comm_.size(),
                                              comm_.rank());
    }
    slices_ = shards_ ? shards_->slices() : whole_tensors(model_.tensors());
    if (delay_) next_.resize(model_.params().size());
    // The run's allocator: the optimizer state is placed and counted there (GHT_HOST_BUDGET,
    // GHT_ALLOC_LOG). The fp32 reference model keeps its own vectors.
    opt_ = std::make_unique<optimizer::AdamW>(make_regions(), adam_options(), alloc_);
    const ModelConfig& mc = cfg_.model;
    s.say("model " + mc.name + ": " + std::to_string(mc.total_params()) + " params (" +
          std::to_string(mc.active_params()) + " active), " + std::to_string(mc.tokens_per_step()) +
          " tokens/step, backend cpu, " + std::to_string(omp_get_max_threads()) + " threads");
    if (cfg_.diloco.on()) {
      s.say("DiLoCo over " + std::to_string(comm_.size()) + " process(es) (" + comm_.name() + "): each reads " +
            std::to_string(mc.grad_accum) + " of every " + std::to_string(comm_.size() * mc.grad_accum) +
            " micro-batches and steps its own AdamW on them; no gradient all-reduce");
    } else if (comm_.size() > 1) {
      s.say("data parallel over " + std::to_string(comm_.size()) + " processes (" + comm_.name() + "): each reads " +
            std::to_string(mc.grad_accum) + " of every " + std::to_string(comm_.size() * mc.grad_accum) +
            " micro-batches; " +
            (shards_ ? "gradients reduce-scattered, AdamW state sharded (ZeRO-1: this rank holds " +
                           std::to_string(shards_->owned()) + " of " + std::to_string(model_.params().size()) +
                           " parameters' master, m and v), weights all-gathered"
                     : std::string("gradients all-reduced; AdamW state replicated on every rank "
                                   "(dist.optimizer_state=replicated)")));
    }
    if (s.run.profile_steps > 0) {
      s.say("note: --profile-steps applies to the cuda backend; the cpu backend logs each step's time and "
            "tokens/s to log.jsonl only");
    }
    if (s.run.trace_kernels) s.say("note: --trace-kernels traces CUDA kernels; the cpu backend has none to trace");
  }

  [[nodiscard]] std::string name() const override { return "cpu"; }
  [[nodiscard]] const std::vector<NamedTensor>& tensors() const override { return model_.tensors(); }
  [[nodiscard]] optimizer::AdamW& optimizer() override { return *opt_; }
  [[nodiscard]] const StateShards* state_shards() const override { return shards_.get(); }

  void init_weights(std::uint64_t seed) override {
    model_.init(seed);
    for (std::size_t r = 0; r < slices_.size(); ++r) opt_->load_state(r, param_of(r), nullptr, nullptr);
    if (delay_) std::copy(model_.params().begin(), model_.params().end(), next_.begin());
  }

  void load_weights(std::size_t r, std::span<const float> w) override {
    std::copy(w.begin(), w.end(), model_.params().begin() + tensors()[r].offset);
    if (delay_) std::copy(w.begin(), w.end(), next_.begin() + static_cast<std::ptrdiff_t>(tensors()[r].offset));
  }

  // Delayed mode: the model's fp32 parameters are the next step's compute weights, next_ those of
  // the step after (the CUDA backend's two weight buffers; master is one update ahead of next_).
  [[nodiscard]] bool delayed_update() const override { return delay_; }
  void read_compute_weights(std::size_t r, int ahead, std::span<float> out) override {
    const std::span<const float> p = compute_weights(r, ahead);
    std::copy(p.begin(), p.end(), out.begin());
  }
  void load_compute_weights(std::size_t r, int ahead, std::span<const float> w) override {
    const std::span<float> p = compute_weights(r, ahead);
    GHT_EXPECTS(w.size() == p.size(), "load_compute_weights: " + std::to_string(w.size()) + " values for " +
                                          tensors()[r].name);
    std::copy(w.begin(), w.end(), p.begin());
  }

  StepOutcome step(std::int64_t step, double lr, DataLoader& data) override {
    const bool delayed = delayed_at(step);  // false in the exact warm-up (GHT_OPT_DELAY_WARMUP)
    const ModelConfig& mc = cfg_.model;
    const int B = mc.micro_batch, T = mc.seq_len, N = comm_.size(), rank = comm_.rank();
    // Data parallel: one gradient over all N·A micro-batches (this rank computes positions rank,
    // rank+N, ...: for_each_rank_batch), summed over ranks. DiLoCo: each rank is a worker whose
    // gradient is the mean over its own A (trainer/diloco.hpp).
    const bool local = cfg_.diloco.on();
    const int share = local ? mc.grad_accum : N * mc.grad_accum;
    const auto t0 = std::chrono::steady_clock::now();
    StepOutcome o;
    model_.zero_grad();
    // A partial delay (GHT_OPT_DELAY_MICRO = j): micro-batches j+1.. wait for the previous update
    // and compute with master (after an exact step the weights already are master's).
    // The stale weights stay in next_ (otherwise unused by a partial delay) until the step ends,
    // so that a step failing after the switch can put them back (recover_after_failed_step).
    const int stale = delayed ? delay_stale_micro_batches(mc.grad_accum) : mc.grad_accum;
    switched_ = false;
    for_each_rank_batch(data, mc.grad_accum, rank, N, batch_, [&](int m, const Batch& b) {
      if (m == stale) {
        std::copy(model_.params().begin(), model_.params().end(), next_.begin());
        switched_ = true;
        copy_master_to_params();
      }
      const Loss l = model_.forward(b.inputs.data(), b.targets.data(), B, T);
      model_.backward(1.0f / static_cast<float>(share));
      o.loss += l.ce / share;
      o.aux_loss += l.aux / share;
    });
    if (N > 1 && !local) {
      auto g = model_.grads();
      if (shards_) {
        comm_.reduce_scatter_sum(g.data(), shards_->layout().counts(0));  // this rank's shard: the sum
      } else {
        comm_.allreduce_sum(g.data(), g.size());
      }
      double losses[2] = {o.loss, o.aux_loss};
      comm_.allreduce_sum(losses, 2);
      o.loss = losses[0];
      o.aux_loss = losses[1];
    }
    // Norm, clip and update (data parallel: the same on every rank, the same gradients and
    // state); the model computes on the fp32 master copy itself: after this update in exact
    // mode; in delayed mode the next step computes with what update k-1 left in next_ (master
    // after it, extrapolated by GHT_OPT_DELAY_PREDICT), and this update leaves the weights of
    // the step after in next_ (the CPU has nothing to overlap, the semantics are the CUDA
    // backend's).
    // In the exact warm-up next_ follows master, so the first delayed step computes with master.
    // A partial delay keeps the weights its fresh micro-batches computed with (master before this
    // update) for the next step's stale ones; its next_ only holds this step's stale weights.
    const bool partial = delayed && stale < mc.grad_accum;
    if (delayed && !partial) std::copy(next_.begin(), next_.end(), model_.params().begin());
    const optimizer::StepResult sr = delayed && !partial ? delayed_step(lr) : opt_->step(lr);
    if (!delayed) copy_master_to_params();
    if (delay_ && !delayed) std::copy(model_.params().begin(), model_.params().end(), next_.begin());
    o.grad_norm = sr.grad_norm;
    if (N > 1 && local) {  // the record shows the means over the workers
      double m[3] = {o.loss, o.aux_loss, o.grad_norm};
      comm_.allreduce_sum(m, 3);
      o.loss = m[0] / N;
      o.aux_loss = m[1] / N;
      o.grad_norm = m[2] / N;
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
  }

  // A step that failed after a partial delay's switch: the next step's stale micro-batches
  // compute with the weights this one's did (what a checkpoint written now keeps).
  bool recover_after_failed_step() override {
    if (switched_) std::copy(next_.begin(), next_.end(), model_.params().begin());
    switched_ = false;
    return true;
  }

  double eval_loss(const Batch& b) override {
    return model_.forward(b.inputs.data(), b.targets.data(), b.batch, b.seq_len).ce;
  }

 private:
  // One optimizer region per named tensor (the weight-decay mask is per tensor: none on norms),
  // or per slice of this rank's ZeRO-1 shard.
  std::vector<optimizer::Region> make_regions() {
    auto grads = model_.grads();
    // The CPU backend computes on the fp32 master copy itself: no bf16 weight.
    if (shards_) return shards_->regions(grads.data(), optimizer::GradType::fp32, nullptr);
    std::vector<optimizer::Region> regions;
    for (const auto& t : model_.tensors()) {
      optimizer::Region r;
      r.name = t.name;
      r.n = t.numel;
      r.weight_decay = t.decay;
      r.weight = nullptr;  // the CPU backend computes on the fp32 master copy itself
      r.grad = grads.data() + t.offset;
      r.grad_type = optimizer::GradType::fp32;
      regions.push_back(std::move(r));
    }
    return regions;
  }

  [[nodiscard]] optimizer::AdamWOptions adam_options() const {
    optimizer::AdamWOptions o;
    o.hyper = cfg_.adam;
    o.path = optimizer::PathChoice::cpu;
    o.cpu_threads = cfg_.threads;
    if (shards_) o.combine_sumsq = sumsq_over_ranks(comm_);  // the norm over every rank's shard
    return o;
  }

  // Region r's place in the model's fp32 parameters.
  float* param_of(std::size_t r) {
    return model_.params().data() + model_.tensors()[slices_[r].tensor].offset + slices_[r].first;
  }

  // Delayed mode (never sharded): the update, and next_ = master after it extrapolated by x of it,
  // p + x·(p − p_before), in the fp32 operations the AdamW kernels use for the bf16 weight.
  optimizer::StepResult delayed_step(double lr) {
    const float x = static_cast<float>(delay_weight_extrapolation(cfg_.model.grad_accum));
    for (std::size_t r = 0; r < slices_.size(); ++r) opt_->save_state(r, next_of(r), nullptr, nullptr);  // p_before
    const optimizer::StepResult sr = opt_->step(lr);
    for (std::size_t r = 0; r < slices_.size(); ++r) {
      float* w = next_of(r);
      scratch_.resize(opt_->region(r).n);
      opt_->save_state(r, scratch_.data(), nullptr, nullptr);
      for (std::size_t i = 0; i < scratch_.size(); ++i) {
        const float p = scratch_[i];
        w[i] = x != 0 ? p + x * (p - w[i]) : p;
      }
    }
    return sr;
  }

  std::span<float> compute_weights(std::size_t r, int ahead) {
    GHT_EXPECTS(delay_ && (ahead == 0 || ahead == 1), "compute weights: the delayed update's, 0 or 1 steps ahead");
    const NamedTensor& t = tensors()[r];
    return std::span<float>(ahead == 0 ? model_.params().data() : next_.data(), model_.params().size())
        .subspan(t.offset, t.numel);
  }
  float* next_of(std::size_t r) { return next_.data() + model_.tensors()[slices_[r].tensor].offset + slices_[r].first; }

  // master -> the model's fp32 parameters (ZeRO-1: this rank's shard, then every rank's).
  void copy_master_to_params() {
    for (std::size_t r = 0; r < slices_.size(); ++r) opt_->save_state(r, param_of(r), nullptr, nullptr);
    if (shards_) comm_.all_gather(model_.params().data(), shards_->layout().counts(0));
  }

  const TrainConfig& cfg_;
  dist::Communicator& comm_;
  MoEModel<float> model_;
  std::shared_ptr<alloc::tiered_allocator> alloc_ = alloc::make_default_tiered_allocator();
  bool delay_ = trainer::delayed_update();  // GHT_OPT_DELAY
  std::vector<float> next_;                 // delayed mode: the step after next's weights (partial: this step's stale ones)
  bool switched_ = false;                   // partial delay: this step's fresh micro-batches began
  std::vector<float> scratch_;              // delayed mode: one region's master
  std::unique_ptr<StateShards> shards_;      // ZeRO-1 (N > 1, dist.optimizer_state=sharded)
  std::vector<TensorSlice> slices_;          // what each optimizer region holds
  std::unique_ptr<optimizer::AdamW> opt_;
  Batch batch_;
};

}  // namespace

std::unique_ptr<TrainBackend> make_cpu_backend(const TrainSession& s) { return std::make_unique<CpuBackend>(s); }

TrainSummary train(const TrainConfig& cfg_in, const TrainRunOptions& run) {
  TrainConfig cfg = cfg_in;
  cfg.validate();
  const dist::Launch launch = dist::detect_launch(dist::process_env());
  std::string no_gpu;
  if (cfg.backend == "cuda" || (cfg.backend == "auto" && gpu_present(&no_gpu))) {
    // Several processes need NCCL (GPU data) and MPI or, torchrun-style, the TCP store (its
    // set-up): refused before anything runs.
    dist::check_gpu_launch(launch, dist::have_nccl(), dist::have_mpi());
#ifdef GHT_HAVE_CUDA
    return train_cuda(cfg, run, dist::make_cuda_host_communicator(launch));
#else
    throw ght::logic_error("train.backend=cuda: this build has no CUDA (nvcc was not found at configure time)");
#endif
  }
  TrainSession s(cfg, run, dist::make_communicator(launch));
  if (cfg.backend == "auto") {
    s.say("no CUDA device found (" + no_gpu + "): training on the CPU backend; `ght plan --profile gh200|pcie5` "
          "plans for a GPU machine");
  }
  const auto backend = make_cpu_backend(s);
  return run_training(*backend, s);
}

}  // namespace ght::trainer
