#pragma once
// Internal to the CUDA backend of the training loop (train_cuda.hpp): the run (CudaRun) and its
// timing types, shared by train_cuda.cpp (entry, weights and state), train_setup.cpp (the
// placement, model and optimizer), train_step.cpp (the step and the model's hooks),
// train_update.cpp (the update's scheduling: delay, rotation, update thread),
// train_data_parallel.cpp (NCCL: reduce, gather, shard), train_trace.cpp (--trace-kernels) and
// train_profile.cpp (the per-step breakdown and profile.json).
#include <cuda_runtime_api.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "alloc/block.hpp"
#include "alloc/tiered.hpp"
#include "kernels/cuda/gemm.hpp"
#include "optimizer/accumulate.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/bf16.hpp"
#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/log.hpp"
#include "tier/plan.hpp"
#include "tier/topology.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/cuda/graph_choice.hpp"
#include "trainer/cuda/kernel_breakdown.hpp"
#include "trainer/cuda/kernel_trace.hpp"
#include "trainer/cuda/launch_progress.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/cuda/op_costs.hpp"
#include "trainer/data.hpp"
#include "trainer/dist/gpu_comm.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/file_io.hpp"
#include "trainer/loop.hpp"
#include "trainer/plan_decide.hpp"
#include "trainer/metrics_log.hpp"
#include "trainer/regions.hpp"
#include "trainer/zero.hpp"

#include "trainer/cuda/train_cuda.hpp"

namespace ght::trainer::cuda_run {

inline constexpr double kPeakFlops = Roofline::bf16_dense_datasheet_flops;  // op_costs.hpp gives its source

/// What the allocator holds, per tier and per class on each tier (train_profile.cpp).
nlohmann::ordered_json memory_json(const alloc::tiered_allocator& a);

// ---- timing --------------------------------------------------------------------------------

class Event {
 public:
  Event() { GHT_CUDA_TRY(cudaEventCreate(&e_)); }
  ~Event() { (void)cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s) { GHT_CUDA_TRY(cudaEventRecord(e_, s)); }
  [[nodiscard]] cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};


inline double elapsed_ms(const Event& a, const Event& b) {
  float ms = 0;
  GHT_CUDA_TRY(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return ms;
}

// The events of one step (two sets alternate, since a step's breakdown also reads the previous
// step's last event).
struct StepEvents {
  explicit StepEvents(int micro, int units)
      : fwd_start(static_cast<std::size_t>(micro)), fwd_end(static_cast<std::size_t>(micro)),
        bwd_end(static_cast<std::size_t>(micro)), wait_before(static_cast<std::size_t>(units)),
        wait_after(static_cast<std::size_t>(units)), waited(static_cast<std::size_t>(units), false) {}
  std::vector<Event> fwd_start, fwd_end, bwd_end, wait_before, wait_after;
  std::vector<bool> waited;
  Event opt_start, opt_end;
  bool opt_timed = false;
  Event rotate_before, rotate_after;  // delayed mode: the wait for the previous update
  bool rotated = false;               // waited for it in this step (wait_for_update)
};

struct StepProfile {
  std::int64_t step = 0;
  double wall_ms = 0, forward_ms = 0, backward_ms = 0, opt_stall_ms = 0, step_gap_ms = 0,
         opt_exposed_ms = 0, opt_host_ms = 0, grad_stream_host_ms = 0, mfu = 0, mfu_seed = 0, tokens_per_s = 0,
         h2d_gb = 0, d2h_gb = 0;
  std::size_t speculated_params = 0;  // updated during the last backward, before the grad norm
  double spec_host_ms = 0;            // host time spent launching those updates
  bool speculation_undone = false;    // ...and recomputed or restored after it
  bool traced = false;                // its kernels were traced (--trace-kernels): perturbed
  std::int64_t cuda_graph_launches = 0;  // micro-batches of this step that ran as a graph launch
  int sm_budget = 0;               // GHT_OPT_SM_RESERVE: SMs of the GEMMs beside an update (0: all)
  int micro_batches_reserved = 0;  // micro-batches that ran their GEMMs on sm_budget SMs
  bool update_on_thread = false;   // the update was launched from the update thread (update_)
  std::optional<double> prev_opt_update_ms;
  // ZeRO-1 (CudaRun::measure_comm): the reductions' GPU time, the part of it after the last
  // backward, the previous step's all-gathers' GPU time.
  std::optional<double> dp_reduce_ms, dp_reduce_exposed_ms, dp_gather_ms;
  nlohmann::ordered_json memory;  // memory_json() after the step: bytes per tier and class
  [[nodiscard]] nlohmann::ordered_json json() const {
    nlohmann::ordered_json j = {{"step", step},
                                {"wall_ms", wall_ms},
                                {"forward_ms", forward_ms},
                                {"backward_ms", backward_ms},
                                {"opt_exposed_ms", opt_exposed_ms},
                                {"opt_stall_ms", opt_stall_ms},
                                {"step_gap_ms", step_gap_ms},
                                {"opt_host_ms", opt_host_ms},
                                {"grad_stream_host_ms", grad_stream_host_ms},
                                {"mfu", mfu},
                                {"mfu_seed", mfu_seed},
                                {"tokens_per_s", tokens_per_s},
                                {"link_gb_h2d", h2d_gb},
                                {"link_gb_d2h", d2h_gb},
                                {"speculated_params", speculated_params},
                                {"spec_host_ms", spec_host_ms},
                                {"speculation_undone", speculation_undone},
                                {"cuda_graph_launches", cuda_graph_launches},
                                {"sm_budget_beside_update", sm_budget},
                                {"micro_batches_beside_update", micro_batches_reserved},
                                {"update_launched_on_thread", update_on_thread}};
    if (prev_opt_update_ms) j["prev_opt_update_ms"] = *prev_opt_update_ms;
    if (dp_reduce_ms) j["dp_reduce_ms"] = *dp_reduce_ms;
    if (dp_reduce_exposed_ms) j["dp_reduce_exposed_ms"] = *dp_reduce_exposed_ms;
    if (dp_gather_ms) j["dp_gather_ms"] = *dp_gather_ms;
    if (traced) j["traced"] = true;
    if (!memory.is_null()) j["memory"] = memory;
    return j;
  }
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

// ---- the backend ---------------------------------------------------------------------------

class CudaRun final : public TrainBackend {
 public:
  explicit CudaRun(TrainSession& s) : s_(s), cfg_(s.cfg), run_(s.run) {}
  ~CudaRun() override {
    // Pending updates read gradients and write weights: finish them before anything is freed.
    try {
      join_update();
      if (opt_) opt_->synchronize();
    } catch (...) {
    }
    if (model_) (void)cudaStreamSynchronize(model_->stream());
    if (timer_stream_ != nullptr) (void)cudaStreamDestroy(timer_stream_);
    if (comm_stream_ != nullptr) {
      (void)cudaStreamSynchronize(comm_stream_);
      (void)cudaStreamDestroy(comm_stream_);
    }
    if (grad_ready_stream_ != nullptr) (void)cudaStreamDestroy(grad_ready_stream_);
    for (cudaStream_t t : spec_streams_) (void)cudaStreamDestroy(t);
  }
  CudaRun(const CudaRun&) = delete;
  CudaRun& operator=(const CudaRun&) = delete;
  /// setup(), then the shared loop; CUDA errors and out-of-memory come back naming the step,
  /// the memory by tier and the last good checkpoint.
  TrainSummary go();

  // ---- TrainBackend ----
  [[nodiscard]] std::string name() const override { return "cuda"; }
  [[nodiscard]] const std::vector<NamedTensor>& tensors() const override { return model_->tensors(); }
  [[nodiscard]] optimizer::AdamW& optimizer() override { return *opt_; }
  [[nodiscard]] const StateShards* state_shards() const override { return shards_.get(); }
  void init_weights(std::uint64_t seed) override;
  void load_weights(std::size_t r, std::span<const float> w) override;
  [[nodiscard]] bool delayed_update() const override { return delay_; }
  void read_compute_weights(std::size_t r, int ahead, std::span<float> out) override;
  void load_compute_weights(std::size_t r, int ahead, std::span<const float> w) override;
  StepOutcome step(std::int64_t step, double lr, DataLoader& data) override;
  double eval_loss(const Batch& b) override;
  void on_start(MetricsLogger& log) override;
  void after_step(std::int64_t step, MetricsLogger& log) override;
  void before_extra_work() override { extra_work_since_last_step_ = true; }
  void synchronize() override;
  bool recover_after_failed_step() override;
  void finish(bool ok) override;

 private:
  void say(const std::string& s) const { s_.say(s); }
  void setup();
  // setup's parts (train_setup.cpp).
  [[nodiscard]] std::int64_t plan_placement();
  [[nodiscard]] CudaGraphChoice make_model(std::int64_t lm_head_rows, CudaGraphsMode& graphs_mode);
  void make_optimizer();
  void count_link_bytes(std::size_t (&by_path)[3]);
  [[nodiscard]] std::string side_by_side_note(int sms, const std::size_t (&by_path)[3]) const;
  /// An undo arena exists and the gradients are final in HBM at the last backward (not streamed,
  /// no delay): a step speculates when this holds and the step before did not clip.
  [[nodiscard]] bool speculation_possible() const;
  void report_setup(const cudaDeviceProp& prop, const std::size_t (&by_path)[3], CudaGraphsMode graphs_mode,
                    const CudaGraphChoice& graphs);
  // step's parts (train_step.cpp).
  void start_step(std::int64_t step);
  void launch_update(const optimizer::StepResult& sr, bool delayed, bool partial);
  void keep_profile(const StepProfile& p);
  /// The breakdown of the step that just ran, from its CUDA events.
  StepProfile measure_step(double wall_s, const optimizer::StepResult& sr, double opt_host_ms);
  /// Write <out>/profile.json from profile_ if it holds steps not yet written.
  void write_profile();
  // The plan against the run's own measurements (train_replan.cpp).
  /// Keep step `step`'s forward and backward once the warm-up step is behind (traced steps left out).
  void keep_phases(std::int64_t step, const StepProfile& p);
  /// The medians of the kept phases with the plan's step and recompute FLOPs; no phases when none kept.
  [[nodiscard]] tier::Measurements measurements() const;
  /// <out>/measurements.json from measurements(), when there are phases (rank 0 alone).
  void write_measurements() const;
  /// GHT_POLICY=auto: the search again on measurements(), logged beside the plan this run follows.
  void replan_on_measurements(MetricsLogger& log) const;
  std::size_t profile_written_ = 0;
  std::string stats_report() const;
  /// Bytes of fp32 master, m and v the allocator placed on tier t.
  [[nodiscard]] std::uint64_t state_bytes(TierKind t) const {
    if (!alloc_) return 0;
    std::uint64_t b = 0;
    for (TensorClass c : {TensorClass::master, TensorClass::adam_m, TensorClass::adam_v}) {
      b += alloc_->tier_class_usage(t, c).current;
    }
    return b;
  }
  /// Delayed mode, after a step's backward: wait for the previous update, give the model the
  /// weights it wrote (not with a partial delay: the model switched to them in the step, or keeps
  /// its own) and the gradient buffer it read, and point the optimizer at the others.
  void rotate_delayed_buffers(bool partial);
  /// Partial delay (GHT_OPT_DELAY_MICRO), before the step's first fresh micro-batch: wait for the
  /// update in flight and compute with the weights it writes from now on.
  void take_fresh_weights();
  /// Delayed mode: the compute stream waits for the update in flight, once per step.
  void wait_for_update();
  /// Delayed mode: launch every region's update from a thread of its own (the dma path's
  /// launches block on a full queue for most of the update; the next step's must not wait).
  void launch_update_async();
  /// Exact mode: record the step's opt_end once every region's update is launched, from a
  /// thread of its own (a cpu region's event exists only once the optimizer's worker recorded it,
  /// and the next forward must not wait for that on the host).
  void time_update_async();
  /// opt_end of `ev` after every region's event (region_event may wait on the host).
  void record_update_end(StepEvents& ev);
  /// Wait for the update and timing threads; rethrows their error.
  void join_update();
  /// Wait for the timing thread alone (done once the next forward has waited for every unit).
  void join_timer();
  // Data parallel over NCCL (world size > 1): the functions of that section below.
  [[nodiscard]] int select_device(int visible);
  void start_data_parallel();
  void check_data_parallel(const std::string& grad_mode) const;
  void reduce_gradients();
  void mean_over_ranks(double& loss, double& aux, double& grad_norm) const;
  void start_sharding();
  void reduce_unit(int u);
  void gather_weights();
  void measure_comm(StepProfile& p) const;
  [[nodiscard]] bool data_parallel() const noexcept { return gpu_comm_ != nullptr; }
  /// The element type of the model's gradient buffer, for its collectives.
  [[nodiscard]] dist::GpuType grad_gpu_type() const {
    return model_->grad_type() == optimizer::GradType::bf16 ? dist::GpuType::bf16 : dist::GpuType::f32;
  }
  /// ZeRO-1: data parallel (not DiLoCo) with dist.optimizer_state=sharded.
  [[nodiscard]] bool zero1() const noexcept { return data_parallel() && cfg_.dist.sharded() && !cfg_.diloco.on(); }
  void before_unit_forward(int u);
  void after_unit_backward(int u);
  void stream_unit(int u);
  void speculate_unit(int u);
  // How micro-batch m of a step writes the gradients: the first one (every one, when they stream
  // to the host) assigns them instead of adding to them: no memset, and no accumulator reads in
  // the weight-gradient GEMMs. Its backward runs after its forward, which waits for the last
  // update to have read them.
  [[nodiscard]] GradWrite grad_write(int m) const {
    return m == 0 || stream_grads_ ? GradWrite::assign : GradWrite::add;
  }
  /// --trace-kernels: whether step `step` (steps completed before it) is the last profiled one.
  [[nodiscard]] bool traced_step(std::int64_t step) const;
  void begin_trace();
  /// Waits for the step's update, then writes and prints the breakdown of step `step_no`.
  void end_trace(std::int64_t step_no);

  TrainSession& s_;
  TrainConfig cfg_;
  TrainRunOptions run_;
  std::optional<tier::Plan> plan_;
  tier::Phases predicted_{};  // the plan's phases, checked against the measured ones (after_step)
  tier::PlanOptions plan_base_{};  // what the plan was made from, for the auto policy's re-plan
  PlanScope plan_scope_{};
  tier::Settings plan_settings_;   // the search's choice this run follows
  std::vector<double> phase_fwd_s_, phase_bwd_s_;  // measured after the warm-up step (keep_phases)
  bool stream_grads_ = false;
  std::vector<bool> recompute_;
  // Declaration order is destruction order reversed: the optimizer (which reads the gradient
  // buffers and writes the model's weights) goes first, the allocator they all use last.
  std::shared_ptr<alloc::tiered_allocator> alloc_;  // every byte of the run, placed by plan_
  std::unique_ptr<CudaMoEModel> model_;
  alloc::unique_block host_grads_;  // stream mode: fp32 host accumulator (mapped pinned on PCIe)
  std::unique_ptr<optimizer::GradStreamAccumulator> acc_;
  std::unique_ptr<optimizer::AdamW> opt_;
  std::vector<std::vector<std::size_t>> unit_regions_;  // regions (tensors) of each unit
  std::vector<std::pair<std::size_t, std::size_t>> unit_range_;
  double link_h2d_per_step_ = 0, link_d2h_per_step_ = 0;
  std::int64_t step_ = 0;        // steps completed before the one running
  std::int64_t first_step_ = -1;  // this process's first step

  // Per-step state read by the model hooks.
  bool training_ = false;
  bool opt_launched_ = false;
  int micro_ = 0;
  double step_lr_ = 0;
  double spec_host_ms_ = 0;
  bool speculate_now_ = false;  // this step's last backward launches updates as units finish
  bool speculation_pause_said_ = false;  // the note that a clipping step pauses speculation
  // GHT_OPT_SM_RESERVE: the SMs the model's GEMMs plan for in micro-batches beside an update
  // that a later micro-batch waits for (beside_update); 0: every SM (no gpu_link region, or the
  // reserve is 0).
  int sm_budget_beside_update_ = 0;
  int reserved_micro_batches_ = 0;  // of this step (profile.json: micro_batches_beside_update)
  [[nodiscard]] bool beside_update(int m, int A, bool delayed, int stale) const;
  int pending_unit_ = -1;
  double stream_host_ms_ = 0;
  // CUDA graphs (GHT_CUDA_GRAPHS, graph_choice.hpp): whether this run may replay micro-batches;
  // whether the hooks have nothing to do in the current one (hooks_busy_reason); whether they
  // did something in it all the same (checked: a replay would have skipped it).
  bool graphs_on_ = false;
  bool quiet_now_ = false;
  bool hooks_acted_ = false;
  std::set<std::string> graph_notes_;  // reasons for eager micro-batches, each said once
  std::int64_t train_micro_batches_ = 0;
  std::unique_ptr<StepEvents> ev_[2];
  StepEvents* cur_ = nullptr;
  StepEvents* prev_ = nullptr;
  cudaStream_t timer_stream_ = nullptr;
  cudaStream_t grad_ready_stream_ = nullptr;  // stream mode: gates the accumulator per unit
  std::vector<Event> unit_done_;              // stream mode: recorded after each unit's backward
  // Speculation launched from threads (GHT_OPT_LAUNCH_THREAD): per unit, its backward's end on the
  // model stream, and a stream that waits for it (the unit's speculate_region producer); spec_
  // is the last unit's launches, each waiting for the one before (one thread drives the optimizer).
  std::vector<Event> spec_ready_;
  std::vector<cudaStream_t> spec_streams_;
  std::future<void> spec_;
  std::vector<StepProfile> profile_;
  StepProfile last_profile_;
  bool state_in_hbm_ = false;              // every region's master/m/v in HBM (device path)
  std::unique_ptr<KernelTracer> tracer_;   // alive during the traced step only
  std::uint64_t trace_start_ns_ = 0;
  std::string mfu_formula_;
  std::string seed_formula_;  // the seed's counting, printed beside the strict one
  bool extra_work_since_last_step_ = false;
  // GHT_OPT_DELAY=1 (trainer/README.md): two weight and gradient buffers; the model computes
  // with one pair while the update of the previous step reads the other's gradient and writes
  // its weights.
  bool delay_ = false;
  // The update last launched writes the weights the model computes with (exact mode, and the
  // delayed mode's exact warm-up): the next forward waits for it unit by unit.
  bool update_in_place_ = true;
  int device_ = 0;
  alloc::unique_block delay_w_, delay_g_;  // the second pair
  __nv_bfloat16* other_w_ = nullptr;       // the pair the model does not use now
  void* other_g_ = nullptr;
  // Partial delay: other_w_ holds (or the update in flight writes) master's weights, newer than
  // the model's; the step's first fresh micro-batch switches to them (take_fresh_weights).
  bool fresh_pending_ = false;
  // ...and this step switched to them (recover_after_failed_step switches back).
  bool switched_ = false;
  std::future<void> update_;  // the update thread's launches
  LaunchProgress launched_;   // ...region by region (the next forward waits for its units' regions)
  bool launch_thread_ = true;  // GHT_OPT_LAUNCH_THREAD: exact mode launches on update_ too
  std::future<void> timer_;   // exact mode: records opt_end (time_update_async)
  dist::GpuChoice gpu_choice_;
  // ZeRO-1 (dist.optimizer_state=sharded, world size > 1): the slices of the tensors this rank's
  // optimizer regions hold (every tensor whole otherwise), and the collectives' stream and events.
  std::unique_ptr<StateShards> shards_;
  std::vector<TensorSlice> slices_;
  cudaStream_t comm_stream_ = nullptr;
  struct ZeroEvents {  // per unit; *_begin after the comm stream's waits, so a pair times one collective
    explicit ZeroEvents(std::size_t units)
        : grads_final(units), reduce_begin(units), reduce_done(units), gather_begin(units), gathered(units) {}
    std::vector<Event> grads_final, reduce_begin, reduce_done, gather_begin, gathered;
    Event reduce_end;  // after every unit's reduction: what the norm waits for
  };
  std::unique_ptr<ZeroEvents> zev_;        // made with shards_ (CUDA calls wait for setup)
  bool gathers_queued_ = false;            // gather_begin/gathered hold the last step's gathers
  std::optional<double> prev_gather_ms_;  // their time, once complete
  std::unique_ptr<dist::GpuCommunicator> gpu_comm_;  // world size > 1 only; goes first
};

}  // namespace ght::trainer::cuda_run
