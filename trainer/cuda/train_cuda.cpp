// The CUDA backend of the training loop (see train_cuda.hpp). The loop itself (resume, eval,
// checkpoints, signals, the step record) is trainer/loop.cpp; this file supplies the step: the
// placement, the model and optimizer, forward/backward over the micro-batches, the norm and the
// update, and the per-step breakdown (profile).
#include "trainer/cuda/train_cuda.hpp"

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
#include "trainer/metrics_log.hpp"
#include "trainer/regions.hpp"
#include "trainer/zero.hpp"

namespace ght::trainer {

namespace fs = std::filesystem;

namespace {

constexpr double kPeakFlops = Roofline::bf16_dense_datasheet_flops;  // op_costs.hpp gives its source

// ---- placement -----------------------------------------------------------------------------

// The plan this run follows, made for the allocator's own budgets so that what it predicts is
// what the allocator enforces: greedy by default (GHT_POLICY), GHT_PLACE rules when set. `ranks`:
// the data-parallel ranks that shard the optimizer state (ZeRO-1; 1: none). The LM-head chunk is
// sized with the plan (from free HBM), and the model must run with it.
ModelPlan make_run_plan(const ModelConfig& mc, const alloc::tiered_allocator& a, int ranks) {
  const config::Registry& reg = config::cfg();
  const tier::LinkNumbers link = tier::resolve_link_numbers();
  const tier::Capacities caps = tier::machine_capacities();
  tier::PlanOptions options = tier::plan_options_from_config(reg, link, caps, model_step_flops(mc));
  // The allocator's budgets, less a margin for what the plan does not model (allocation
  // rounding, the norm scratch): 1 MiB + 0.25%.
  auto planned = [](std::uint64_t b) { return b - std::min(b, (std::uint64_t{1} << 20) + b / 400); };
  options.budgets.hbm = planned(a.report(TierKind::hbm).budget);
  options.budgets.host = planned(a.report(TierKind::host).budget);
  add_trainer_reservations(options, mc);
  return plan_model(mc, options, ranks);
}

// What the allocator holds, per tier and per class on each tier: {"hbm": {"current", "peak",
// "classes": {"weight": {"current", "peak"}, ...}}, "host": {...}}.
nlohmann::ordered_json memory_json(const alloc::tiered_allocator& a) {
  nlohmann::ordered_json j;
  for (TierKind t : {TierKind::hbm, TierKind::host}) {
    const alloc::Usage u = a.tier_usage(t);
    nlohmann::ordered_json cls = nlohmann::ordered_json::object();
    for (int c = 0; c < kNumTensorClasses; ++c) {
      const alloc::Usage cu = a.tier_class_usage(t, static_cast<TensorClass>(c));
      if (cu.count > 0) {
        cls[std::string(ght::to_string(static_cast<TensorClass>(c)))] = {{"current", cu.current}, {"peak", cu.peak}};
      }
    }
    j[std::string(ght::to_string(t))] = {{"current", u.current}, {"peak", u.peak}, {"classes", cls}};
  }
  return j;
}

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

double elapsed_ms(const Event& a, const Event& b) {
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
         opt_exposed_ms = 0, opt_host_ms = 0, grad_stream_host_ms = 0, mfu = 0, tokens_per_s = 0,
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fmt(const char* f, double a) {
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
  /// The breakdown of the step that just ran, from its CUDA events.
  StepProfile measure_step(double wall_s, const optimizer::StepResult& sr, double opt_host_ms);
  /// Write <out>/profile.json from profile_ if it holds steps not yet written.
  void write_profile();
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

void CudaRun::setup() {
  cfg_.validate();
  const ModelConfig& mc = cfg_.model;
  if (cfg_.threads > 0) omp_set_num_threads(cfg_.threads);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    throw ght::logic_error("train.backend=cuda: no usable CUDA device");
  }
  const int dev = select_device(devices);
  GHT_CUDA_TRY(cudaSetDevice(dev));
  device_ = dev;
  start_data_parallel();  // before the allocator: its HBM budget leaves NCCL's buffers out
  cudaDeviceProp prop{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));

  // The data (train and val loaders) is the session's, checked before this runs.

  // ---- the allocator and the plan it follows ----
  alloc_ = alloc::make_default_tiered_allocator();
  ModelPlan run_plan = make_run_plan(mc, *alloc_, zero1() ? s_.comm->size() : 1);
  plan_ = std::move(run_plan.plan);
  const tier::Plan& plan = *plan_;
  say("plan (" + std::string(tier::to_string(plan.options().policy)) + "; set GHT_POLICY or GHT_PLACE to change it):\n" +
      plan.format_table(false));
  // State allocations carry their tensor's name; the plan knows them by group and class.
  alloc_->set_placement([&plan](std::string_view region, TensorClass cls) -> std::optional<TierKind> {
    if (const tier::Decision* d = plan.find(plan_region_of(region, cls))) return d->tier;
    return std::nullopt;
  });
  // One gradient buffer for the whole model: it is streamed when the plan streams any of it
  // (HBM then holds only the bf16 micro-batch gradient, less than the plan predicts for "mixed").
  const std::string grad_mode = plan.mode_summary(TensorClass::grad);
  stream_grads_ = grad_mode == "stream" || grad_mode == "mixed";
  if (grad_mode == "mixed") {
    say("note: the plan streams some gradient regions; the model has one gradient buffer, so all are streamed");
  }
  check_data_parallel(grad_mode);
  recompute_.assign(static_cast<std::size_t>(mc.layers), false);
  for (int l = 0; l < mc.layers; ++l) {
    const tier::Decision* d = plan.find("layer" + std::to_string(l) + ".activation");
    recompute_[static_cast<std::size_t>(l)] = d != nullptr && d->mode == tier::Mode::recompute;
  }

  // ---- the model ----
  CudaModelOptions mo;
  // Streamed gradients are bf16 per micro-batch (half the D2H bytes); HBM accumulation is fp32
  // unless GHT_GRAD_ACCUM=bf16 (the plan counts the same, trainer/regions.cpp).
  mo.grad_type = stream_grads_ ? optimizer::GradType::bf16 : hbm_grad_type();
  mo.recompute = recompute_;
  const std::string att = config::cfg().get_string(config::Key::GHT_ATTENTION);
  mo.attention_impl = att == "cudnn"           ? kernels::cuda::AttentionImpl::cudnn
                      : att == "cudnn_backend" ? kernels::cuda::AttentionImpl::cudnn_backend
                      : att == "fallback"      ? kernels::cuda::AttentionImpl::fallback
                                               : kernels::cuda::AttentionImpl::automatic;
  const std::string in_copy = config::cfg().get_string(config::Key::GHT_INPUT_COPY);
  mo.input_copy = in_copy == "sm"       ? CudaModelOptions::InputCopy::sm
                  : in_copy == "engine" ? CudaModelOptions::InputCopy::engine
                                        : CudaModelOptions::InputCopy::automatic;
  const std::string gemm = config::cfg().get_string(config::Key::GHT_EXPERT_GEMM);
  if (gemm == "cutlass" && !kernels::cuda::cutlass_available()) {
    throw config_error("GHT_EXPERT_GEMM=cutlass: this build has no CUTLASS (CMake did not find it; "
                       "scripts/install-deps.sh installs it, or set GHT_CUTLASS_DIR); use auto");
  }
  mo.expert_impl = gemm == "cutlass"            ? kernels::cuda::GroupedGemmImpl::cutlass
                   : gemm == "cublas_grouped"   ? kernels::cuda::GroupedGemmImpl::cublas_grouped
                   : gemm == "custom"           ? kernels::cuda::GroupedGemmImpl::custom
                   : gemm == "cublaslt_streams" ? kernels::cuda::GroupedGemmImpl::cublaslt_streams
                   : gemm == "cublaslt_loop"    ? kernels::cuda::GroupedGemmImpl::cublaslt_loop
                                                : kernels::cuda::default_grouped_gemm_impl();
  mo.fused_kernels = config::cfg().get_bool(config::Key::GHT_FUSED_KERNELS);
  mo.ce_chunk_rows = run_plan.lm_head_rows;  // what the plan counted
  mo.allocator = alloc_;
  CudaGraphRunFacts graph_facts;
  graph_facts.expert_offsets_on_host = kernels::cuda::needs_host_offsets(mo.expert_impl);
  graph_facts.expert_impl = kernels::cuda::to_string(mo.expert_impl);
  graph_facts.grad_accum = mc.grad_accum;
  graph_facts.stream_grads = stream_grads_;
  const CudaGraphsMode graphs_mode = cuda_graphs_mode();
  const CudaGraphChoice graphs = choose_cuda_graphs(graphs_mode, graph_facts);  // `on` that cannot: throws
  graphs_on_ = graphs.on;
  mo.cuda_graphs = graphs.on;
  mo.cuda_graphs_fall_back = graphs_mode == CudaGraphsMode::automatic;
  model_ = std::make_unique<CudaMoEModel>(mc, mo);
  const int U = model_->num_units();
  delay_ = trainer::delayed_update();  // GHT_OPT_DELAY (the member of that name reports it)
  if (delay_) {
    if (stream_grads_) {
      throw config_error("GHT_OPT_DELAY=1: the plan streams the gradients to a host accumulator (HBM is short), "
                         "and the delayed update needs a second gradient buffer in HBM; raise the HBM budget "
                         "(GHT_HBM_BUDGET), shrink the model, or unset GHT_OPT_DELAY");
    }
    const std::size_t n = model_->num_params();
    delay_w_ = alloc::unique_block(*alloc_, n * sizeof(__nv_bfloat16),
                                   {TensorClass::weight, "model.weights_delayed", TierKind::hbm, false});
    delay_g_ = alloc::unique_block(*alloc_, n * optimizer::grad_type_size(model_->grad_type()),
                                   {TensorClass::grad, "model.grads_delayed", TierKind::hbm, false});
    other_w_ = delay_w_.as<__nv_bfloat16>();
    other_g_ = delay_g_.get();
  }
  for (int u = 0; u < U; ++u) unit_range_.push_back(model_->unit_range(u));

  // ---- the optimizer ----
  if (stream_grads_) {
    host_grads_ = alloc::unique_block(*alloc_, model_->num_params() * sizeof(float),
                                      {TensorClass::grad, "model.grads_host_accumulator", TierKind::host, false});
    acc_ = std::make_unique<optimizer::GradStreamAccumulator>(optimizer::GradStreamAccumulator::Options{}, alloc_);
  }
  std::vector<optimizer::Region> regions;
  const auto& ts = model_->tensors();
  start_sharding();  // slices_: every tensor whole, or this rank's ZeRO-1 slices
  unit_regions_.assign(static_cast<std::size_t>(U), {});
  for (std::size_t r = 0; r < slices_.size(); ++r) {
    const NamedTensor& t = ts[slices_[r].tensor];
    const std::size_t at = t.offset + slices_[r].first;  // the region's flat offset
    optimizer::Region g;
    g.name = t.name;
    g.n = slices_[r].n;
    g.first = slices_[r].first;
    g.weight_decay = t.decay;
    g.weight = model_->weights() + at;
    if (stream_grads_) {
      g.grad = host_grads_.as<float>() + at;
      g.grad_type = optimizer::GradType::fp32;
    } else {
      g.grad = static_cast<const char*>(model_->grads()) + at * optimizer::grad_type_size(model_->grad_type());
      g.grad_type = model_->grad_type();
    }
    regions.push_back(std::move(g));
    for (int u = 0; u < U; ++u) {
      if (at >= unit_range_[static_cast<std::size_t>(u)].first && at < unit_range_[static_cast<std::size_t>(u)].second) {
        unit_regions_[static_cast<std::size_t>(u)].push_back(r);
      }
    }
  }
  optimizer::AdamWOptions ao;
  ao.hyper = cfg_.adam;
  ao.hyper.weight_extrapolation = 0;  // step() sets the delayed update's prediction per step
  ao.cpu_threads = cfg_.threads;
  if (data_parallel()) ao.speculate_bytes = 0;  // gradients are final only after the all-reduce
  if (shards_) ao.combine_sumsq = sumsq_over_ranks(*s_.comm);  // the norm over every rank's shard
  opt_ = std::make_unique<optimizer::AdamW>(std::move(regions), ao, alloc_);

  // Link bytes per step, from each region's path (the optimizer's own traffic and the stream).
  std::size_t by_path[3] = {0, 0, 0};
  const double state_bytes_per_param = optimizer::state_bytes_per_param(opt_->state_type());
  for (std::size_t r = 0; r < opt_->num_regions(); ++r) {
    const auto n = static_cast<double>(opt_->region(r).n);
    const optimizer::Path p = opt_->path(r);
    by_path[static_cast<int>(p)] += opt_->region(r).n;
    if (p == optimizer::Path::gpu_link) {
      // Host master, m and v read and written once (12 bytes each way, 8 with bf16 m and v,
      // 6.03 with q8); a host gradient is read too. (A region whose state the plan split between
      // tiers is counted as all-host: an upper bound.)
      link_h2d_per_step_ += state_bytes_per_param * n + (stream_grads_ ? 4 * n : 0);
      link_d2h_per_step_ += state_bytes_per_param * n;
    } else if (p == optimizer::Path::cpu) {
      link_d2h_per_step_ += stream_grads_ ? 0 : 4 * n;  // fp32 gradient down
      link_h2d_per_step_ += 2 * n;                       // bf16 weight up
    } else if (stream_grads_) {
      link_h2d_per_step_ += 4 * n;  // device state, host gradient
    }
    if (stream_grads_) link_d2h_per_step_ += 2.0 * n * mc.grad_accum;  // bf16 per micro-batch
  }
  state_in_hbm_ = by_path[0] == 0 && by_path[1] == 0;

  model_->set_hooks({[this](int u) { before_unit_forward(u); }, [this](int u) { after_unit_backward(u); }});
  model_->set_hooks_quiet([this] { return training_ && quiet_now_; });
  ev_[0] = std::make_unique<StepEvents>(mc.grad_accum, U);
  ev_[1] = std::make_unique<StepEvents>(mc.grad_accum, U);
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&timer_stream_, cudaStreamNonBlocking));
  if (stream_grads_) {
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&grad_ready_stream_, cudaStreamNonBlocking));
    unit_done_ = std::vector<Event>(static_cast<std::size_t>(U));
  }

  const double fpt = mc.flops_per_token();
  mfu_formula_ = "MFU = flops_per_token x tokens_per_step / step_seconds / 989.4e12, flops_per_token = "
                 "6 x N_active_nonembedding + 12 x L x H x d_head x T = 6 x " +
                 std::to_string(mc.active_nonembedding_params()) + " + 12 x " + std::to_string(mc.layers) +
                 " x " + std::to_string(mc.heads) + " x " + std::to_string(mc.head_dim) + " x " +
                 std::to_string(mc.seq_len) + " = " + fmt("%.4g", fpt) + " FLOP/token";
  const auto mem = model_->memory();
  say("model " + mc.name + ": " + std::to_string(mc.total_params()) + " params (" +
      std::to_string(mc.active_params()) + " active), " + std::to_string(mc.tokens_per_step()) +
      " tokens/step, backend cuda on " + prop.name + "; attention requested " +
      std::string(kernels::cuda::to_string(model_->options().attention_impl)) + ", expert GEMMs " +
      std::string(kernels::cuda::to_string(model_->options().expert_impl)) + ", fused kernels " +
      (model_->options().fused_kernels ? "on" : "off"));
  say("memory: HBM weights " + config::format_bytes(mem.weights) + ", gradients " + config::format_bytes(mem.grads) +
      (stream_grads_ ? " (bf16, streamed to a " + config::format_bytes(host_grads_.bytes()) + " fp32 host accumulator)"
                     : std::string(model_->grad_type() == optimizer::GradType::bf16
                                       ? " (bf16, accumulated in HBM: GHT_GRAD_ACCUM=bf16)"
                                       : " (fp32, accumulated in HBM)")) +
      "; optimizer state HBM " + config::format_bytes(state_bytes(TierKind::hbm)) + ", host " +
      config::format_bytes(state_bytes(TierKind::host)));
  say("optimizer paths: gpu_link " + std::to_string(by_path[0]) + ", cpu " + std::to_string(by_path[1]) +
      ", device " + std::to_string(by_path[2]) + " params; link per step " + fmt("%.2f", link_h2d_per_step_ / 1e9) +
      " GB h2d, " + fmt("%.2f", link_d2h_per_step_ / 1e9) + " GB d2h");
  launch_thread_ = config::cfg().get_bool(config::Key::GHT_OPT_LAUNCH_THREAD);
  const auto reserve = config::cfg().get_int(config::Key::GHT_OPT_SM_RESERVE);
  if (by_path[0] > 0 && reserve > 0) {
    sm_budget_beside_update_ = static_cast<int>(std::max<std::int64_t>(1, prop.multiProcessorCount - reserve));
  }
  if (sm_budget_beside_update_ > 0 && delay_ && delay_partial(mc.grad_accum)) {
    say("optimizer: a partial delay's stale micro-batches (beside the gpu_link update) run their GEMMs on " +
        std::to_string(sm_budget_beside_update_) + " of " + std::to_string(prop.multiProcessorCount) +
        " SMs, leaving the rest to the update's AdamW kernels (GHT_OPT_SM_RESERVE=" + std::to_string(reserve) + ")");
  }
  if (delay_) {
    say("optimizer: one-step-delayed update (GHT_OPT_DELAY=1): launched from its own thread after each step's "
        "backward, it runs during the next step's forward and backward (" +
        (delay_partial(mc.grad_accum) ? "its first " + std::to_string(delay_stale_micro_batches(mc.grad_accum)) +
                                            " micro-batches, GHT_OPT_DELAY_MICRO"
                                      : std::string("all of it")) +
        "); second weight and gradient buffers " +
        config::format_bytes(delay_w_.bytes() + delay_g_.bytes()) + " of HBM");
  } else if ((opt_->speculate_capacity() > 0 || opt_->speculate_host_capacity() > 0) && !stream_grads_) {
    say("optimizer: updates of layers whose gradients are final start during the last backward, within a " +
        config::format_bytes(opt_->speculate_capacity()) + " HBM undo arena (gpu_link regions, GHT_OPT_SPECULATE) and a " +
        config::format_bytes(opt_->speculate_host_capacity()) +
        " host undo arena (cpu regions, GHT_OPT_SPECULATE_HOST); a clipped or skipped step undoes them exactly" +
        (launch_thread_ ? "; launched from host threads of their own, beside the backward's launches" : ""));
    if (launch_thread_) {
      spec_ready_ = std::vector<Event>(unit_regions_.size());
      spec_streams_.assign(unit_regions_.size(), nullptr);
      for (cudaStream_t& t : spec_streams_) GHT_CUDA_TRY(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    }
  } else {
    say(std::string("optimizer: updates start after backward (") +
        (stream_grads_    ? "gradients streamed to the host"
         : data_parallel() ? "data parallel: gradients are final after the all-reduce"
                           : "GHT_OPT_SPECULATE / GHT_OPT_SPECULATE_HOST off, or no memory left for them") +
        ")");
  }
  if (opt_->split_cpu_share()) {
    say("optimizer: GHT_OPTIMIZER=split at a CPU share of " + fmt("%.3f", *opt_->split_cpu_share()) +
        " (GHT_OPT_CPU_SHARE; -1 = the cost model's best): the cpu regions run on the optimizer's worker thread while "
        "the gpu_link regions launch");
  }
  int rc = 0;
  for (bool b : recompute_) rc += b ? 1 : 0;
  say("activations: " + std::to_string(rc) + " of " + std::to_string(mc.layers) + " layers recomputed");
  say("CUDA graphs (GHT_CUDA_GRAPHS=" + std::string(to_string(graphs_mode)) + "): " +
      (graphs.on ? "on: micro-batches 1.." + std::to_string(mc.grad_accum - 1) +
                       " of each step replay one captured graph of forward, LM head and backward where the "
                       "step's hooks have nothing to do (bit-identical); micro-batch 0 runs eagerly (it waits for "
                       "the previous update unit by unit), and so does any other whose "
                       "hooks act (each reason is noted once)"
                 : "off: " + graphs.why_off));
  say(mfu_formula_);
}

// ---- weights and state (the loop calls these on a fresh start or a resume) ----------------------

void CudaRun::init_weights(std::uint64_t seed) {
  // Same values as the CPU backend's init: fp32 master, bf16 compute weights.
  const auto& ts = model_->tensors();
  init_params_host(ts, seed, [&](std::size_t t, std::span<const float> v) {
    load_weights(t, v);
    for (std::size_t r = 0; r < slices_.size(); ++r) {
      if (slices_[r].tensor == t) opt_->load_state(r, v.data() + slices_[r].first, nullptr, nullptr);
    }
  });
}

// Delayed mode: the other weight buffer gets the same values, the weights the update of the
// step before would have written (the first two steps both compute with the initial weights).
void CudaRun::load_weights(std::size_t r, std::span<const float> w) {
  const std::size_t off = model_->tensors()[r].offset;
  model_->load_weights(off, w);
  if (delay_) {
    GHT_CUDA_TRY(cudaMemcpy(other_w_ + off, model_->weights() + off, w.size() * sizeof(__nv_bfloat16),
                            cudaMemcpyDeviceToDevice));
  }
}

// ahead 0: the buffer the model computes with next; 1: the other one, which the update in flight
// writes (rotate_delayed_buffers swaps them after the next step's backward).
void CudaRun::read_compute_weights(std::size_t r, int ahead, std::span<float> out) {
  const NamedTensor& t = model_->tensors()[r];
  GHT_EXPECTS(out.size() == t.numel, "read_compute_weights: " + std::to_string(out.size()) + " values for " + t.name);
  GHT_EXPECTS(ahead == 0 || ahead == 1, "read_compute_weights: ahead must be 0 or 1");
  synchronize();  // the update in flight writes the other buffer
  std::vector<std::uint16_t> bits(t.numel);
  const __nv_bfloat16* src = (ahead == 0 ? model_->weights() : other_w_) + t.offset;
  GHT_CUDA_TRY(cudaMemcpy(bits.data(), src, t.numel * sizeof(std::uint16_t), cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < t.numel; ++i) out[i] = optimizer::bf16_bits_to_float(bits[i]);
}

void CudaRun::load_compute_weights(std::size_t r, int ahead, std::span<const float> w) {
  const NamedTensor& t = model_->tensors()[r];
  GHT_EXPECTS(ahead == 0 || ahead == 1, "load_compute_weights: ahead must be 0 or 1");
  if (ahead == 0) {
    model_->load_weights(t.offset, w);
    // A partial delay's fresh micro-batches compute with master's weights, which load_weights
    // left in the other buffer.
    fresh_pending_ = delay_partial(cfg_.model.grad_accum);
    return;
  }
  GHT_EXPECTS(w.size() == t.numel, "load_compute_weights: " + std::to_string(w.size()) + " values for " + t.name);
  std::vector<std::uint16_t> bits(t.numel);
  for (std::size_t i = 0; i < t.numel; ++i) bits[i] = optimizer::float_to_bf16_bits(w[i]);
  GHT_CUDA_TRY(cudaMemcpy(other_w_ + t.offset, bits.data(), t.numel * sizeof(std::uint16_t), cudaMemcpyHostToDevice));
}

void CudaRun::on_start(MetricsLogger& log) {
  model_->zero_grad();
  log.log_event({{"type", "mfu_formula"}, {"formula", mfu_formula_}});
}

void CudaRun::synchronize() {
  join_update();
  if (comm_stream_ != nullptr) gpu_comm_->wait(comm_stream_);  // ZeRO-1's gathers
  opt_->synchronize();
  GHT_CUDA_TRY(cudaStreamSynchronize(model_->stream()));
}

bool CudaRun::recover_after_failed_step() {
  // An update launched during the failed step's backward (speculation) is undone exactly.
  try {
    join_update();
    opt_->cancel_speculation();
    opt_->synchronize();
  } catch (const std::exception&) {
    return false;
  }
  // A partial delay that switched to the fresh weights: the model gets back the stale ones,
  // which the next step's first micro-batches compute with (and a checkpoint written now keeps).
  if (switched_) {
    other_w_ = model_->swap_buffers(other_w_, model_->grads()).first;
    fresh_pending_ = true;
    switched_ = false;
  }
  // A step that failed among its stale micro-batches left their SM budget on the model's stream.
  if (sm_budget_beside_update_ > 0) kernels::cuda::set_stream_sm_budget(model_->stream(), 0);
  return true;
}

double CudaRun::eval_loss(const Batch& b) {
  // The forward hooks wait for the pending update (training_ is false: nothing is zeroed).
  return model_->forward(b.inputs.data(), b.targets.data(), cfg_.model.micro_batch, cfg_.model.seq_len).ce;
}

// ---- hooks -----------------------------------------------------------------------------------

void CudaRun::before_unit_forward(int u) {
  const cudaStream_t s = model_->stream();
  const auto uu = static_cast<std::size_t>(u);
  // Later micro-batches are ordered after micro-batch 0 on the same stream: one wait suffices.
  // Delayed mode: the update in flight writes the weights the model does not use.
  if (opt_launched_ && update_in_place_ && (!training_ || micro_ == 0)) {
    // The unit's weights are final once every one of its regions' last chunk is written.
    const bool timed = training_;
    hooks_acted_ = true;
    if (timed) cur_->wait_before[uu].record(s);
    if (shards_) {
      GHT_CUDA_TRY(cudaStreamWaitEvent(s, zev_->gathered[uu].get(), 0));  // ZeRO-1: every rank's part of it
    } else {
      for (std::size_t r : unit_regions_[uu]) {
        // Launched from the update thread: its events must be recorded before we wait on them.
        if (update_.valid() && !launched_.wait(r)) join_update();  // rethrows the thread's error
        GHT_CUDA_TRY(cudaStreamWaitEvent(s, opt_->region_event(r), 0));
      }
    }
    if (timed) {
      cur_->wait_after[uu].record(s);
      cur_->waited[uu] = true;
    }
    // Every unit's update is recorded now: the update and timing threads are done (or nearly),
    // and must be before this step's speculation hands the optimizer new work for the same regions.
    if (u == model_->num_units() - 1) join_update();
  }
  // The forward's end (the profile's forward/backward split) is recorded by the model itself,
  // graph replays included (forward_backward_async's forward_end).
}

void CudaRun::after_unit_backward(int u) {
  if (!training_) return;
  const bool last = micro_ == cfg_.model.grad_accum - 1;
  if (shards_ && last) {
    reduce_unit(u);  // its gradients are final
    hooks_acted_ = true;
  }
  if (speculate_now_ && last) {
    speculate_unit(u);
    hooks_acted_ = true;
  }
  if (!stream_grads_) return;
  hooks_acted_ = true;
  unit_done_[static_cast<std::size_t>(u)].record(model_->stream());
  // One unit behind: the accumulator blocks the host until the unit's gradients are added, so
  // the next unit's backward must already be queued to keep the GPU busy meanwhile.
  if (pending_unit_ >= 0) stream_unit(pending_unit_);
  pending_unit_ = u;
}

// The unit's gradients are final: update its regions now, over the rest of backward. The
// optimizer validates this in begin_step (exact: undone when the step clips or skips).
void CudaRun::speculate_unit(int u) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto uu = static_cast<std::size_t>(u);
  // Each path has its own undo arena (HBM for gpu_link, host for cpu): one that is full (or off)
  // returns no_room for its regions and leaves the other path speculating.
  if (!spec_streams_.empty() && tracer_ == nullptr) {
    // From a thread: the dma launches block on a full driver queue, and on this thread they held
    // back the rest of the backward's launches (bench/results/2026-11-30-h200-speculation.md). The
    // unit's own stream waits for its backward now, so the launches, whenever they run, wait for
    // nothing later. A traced step (its kernels labelled by op on this thread) launches here.
    spec_ready_[uu].record(model_->stream());
    GHT_CUDA_TRY(cudaStreamWaitEvent(spec_streams_[uu], spec_ready_[uu].get(), 0));
    spec_ = std::async(std::launch::async, [this, uu, before = std::move(spec_)]() mutable {
      if (before.valid()) before.get();  // the previous unit's launches first (and its error)
      GHT_CUDA_TRY(cudaSetDevice(device_));
      for (std::size_t r : unit_regions_[uu]) (void)opt_->speculate_region(r, step_lr_, spec_streams_[uu]);
    });
  } else {
    if (tracer_) tracer_->set_op(kOpSpeculate);
    for (std::size_t r : unit_regions_[uu]) (void)opt_->speculate_region(r, step_lr_, model_->stream());
  }
  spec_host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void CudaRun::stream_unit(int u) {
  const auto t0 = std::chrono::steady_clock::now();
  if (tracer_) tracer_->set_op(kOpGradStream);
  const auto [a, e] = unit_range_[static_cast<std::size_t>(u)];
  // The accumulator waits for everything queued on its producer stream; a side stream that
  // waits only for this unit's backward keeps it from waiting for the next unit's as well.
  GHT_CUDA_TRY(cudaStreamWaitEvent(grad_ready_stream_, unit_done_[static_cast<std::size_t>(u)].get(), 0));
  acc_->run(host_grads_.as<float>() + a, static_cast<const char*>(model_->grads()) + a * 2, optimizer::GradType::bf16,
            e - a, micro_ == 0 ? optimizer::AccumulateMode::assign : optimizer::AccumulateMode::add,
            grad_ready_stream_);
  stream_host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- data parallel over NCCL (world size > 1) ---------------------------------------------------

// This rank's GPU: GHT_DEVICE when set, else its local rank (dist::choose_gpu checks it against
// the visible devices). The topology, and with it the allocator's HBM, follows GHT_DEVICE, so a
// device that came from the local rank is set there too.
int CudaRun::select_device(int visible) {
  config::Registry& reg = config::cfg();
  std::optional<int> explicit_device;
  if (reg.source(config::Key::GHT_DEVICE) != config::Source::Default) {
    explicit_device = static_cast<int>(reg.get_int(config::Key::GHT_DEVICE));
  }
  const dist::Env env = dist::process_env();
  gpu_choice_ = dist::choose_gpu(dist::detect_launch(env), explicit_device, visible, env);
  if (gpu_choice_.device != reg.get_int(config::Key::GHT_DEVICE)) {
    reg.set_flag("GHT_DEVICE", std::to_string(gpu_choice_.device));
    (void)tier::topology(true);
  }
  return gpu_choice_.device;
}

// The NCCL communicator over the session's processes (none for one process). Its buffers take
// HBM: the topology is read again so that the allocator's budget (free HBM) leaves them out.
void CudaRun::start_data_parallel() {
  if (s_.comm->size() == 1) return;
  gpu_comm_ = dist::make_gpu_communicator(*s_.comm, gpu_choice_);
  (void)tier::topology(true);
  const ModelConfig& mc = cfg_.model;
  if (cfg_.diloco.on()) {
    say("DiLoCo over " + std::to_string(s_.comm->size()) + " processes, one GPU each (" + gpu_comm_->name() +
        " only checks the GPUs): each reads " + std::to_string(mc.grad_accum) + " of every " +
        std::to_string(s_.comm->size() * mc.grad_accum) + " micro-batches and steps its own AdamW on them; the "
        "outer all-reduce of the pseudo-gradients runs over " + s_.comm->name() + " in host memory");
    return;
  }
  say("data parallel over " + std::to_string(s_.comm->size()) + " processes (" + gpu_comm_->name() +
      ", set up over " + s_.comm->name() + "; rank 0 on GPU " + std::to_string(gpu_choice_.device) + " by " +
      gpu_choice_.chosen_by + "): each reads " + std::to_string(mc.grad_accum) + " of every " +
      std::to_string(s_.comm->size() * mc.grad_accum) + " micro-batches; " +
      (cfg_.dist.sharded()
           ? "AdamW state sharded (ZeRO-1): each unit's gradients reduce-scattered as its last backward ends, "
             "each rank updates its 1/" + std::to_string(s_.comm->size()) + " of master, m and v, the bf16 weights "
             "all-gathered unit by unit before the next forward uses them"
           : std::string("gradients averaged over the ranks on the GPU after the last backward; AdamW state "
                         "replicated on every rank (dist.optimizer_state=replicated)")));
}

// ZeRO-1 with world size > 1 (trainer/zero.hpp): buckets are the model's units, so that a unit's
// gradients can be reduced as soon as its last backward ends and its weights gathered before its
// forward; each rank's optimizer regions are its slices of them. Otherwise every tensor whole.
void CudaRun::start_sharding() {
  const auto& ts = model_->tensors();
  if (!zero1()) {  // one process, replicated state, or DiLoCo (each worker's whole state)
    slices_ = whole_tensors(ts);
    return;
  }
  if (delay_) throw ght::config_error(delay_with_shards_message(s_.comm->size()));
  std::vector<dist::Range> units;
  for (const auto& [a, e] : unit_range_) units.push_back({a, e});
  shards_ = std::make_unique<StateShards>(ts, units, s_.comm->size(), s_.comm->rank());
  slices_ = shards_->slices();
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  zev_ = std::make_unique<ZeroEvents>(unit_range_.size());
  say("ZeRO-1: this rank holds master, m and v of " + std::to_string(shards_->owned()) + " of " +
      std::to_string(model_->num_params()) + " parameters, in " + std::to_string(slices_.size()) + " slices");
}

void CudaRun::check_data_parallel(const std::string& grad_mode) const {
  if (!data_parallel() || !stream_grads_ || cfg_.diloco.on()) return;  // DiLoCo reduces no gradients
  throw ght::config_error(
      "the plan streams gradients to the host (gradient mode " + grad_mode + ") in a data-parallel run of " +
      std::to_string(s_.comm->size()) + " processes: host-accumulated gradients are not all-reduced yet; keep "
      "them in HBM (a larger GHT_HBM_BUDGET, GHT_PLACE rules with grad=hbm under GHT_POLICY=static, or a smaller "
      "model or micro-batch), or launch one process");
}

// After the last backward, before the norm: the HBM gradients (each the mean over this rank's A
// micro-batches) become the mean over all ranks, the same bits on every rank, so the replicated
// optimizer state stays identical. The wait bounds it by GHT_DIST_TIMEOUT: a rank that never
// joins fails here, naming the collective, instead of hanging in begin_step's synchronisation.
void CudaRun::reduce_gradients() {
  if (!data_parallel() || cfg_.diloco.on()) return;  // DiLoCo: each worker steps on its own gradients
  const cudaStream_t s = model_->stream();
  if (shards_) {
    // ZeRO-1: every unit's reduction was queued as its last backward ended (reduce_unit); the
    // norm and the update read the gradients after them.
    zev_->reduce_end.record(comm_stream_);
    GHT_CUDA_TRY(cudaStreamWaitEvent(s, zev_->reduce_end.get(), 0));
    gpu_comm_->wait(comm_stream_);
    // The previous step's gathers came before this step's reductions on the comm stream.
    if (gathers_queued_) {
      double ms = 0;
      for (std::size_t b = 0; b < unit_range_.size(); ++b) ms += elapsed_ms(zev_->gather_begin[b], zev_->gathered[b]);
      prev_gather_ms_ = ms;
    }
    return;
  }
  const dist::GpuType t = grad_gpu_type();
  gpu_comm_->allreduce(model_->grads(), model_->num_params(), t, dist::GpuReduce::avg, s);
  gpu_comm_->wait(s);
}

// ZeRO-1, after unit u's last backward was queued: on the comm stream, once that backward is done,
// the unit's gradients (each the mean over this rank's micro-batches) become on this rank's piece
// the mean over the ranks: an in-place reduce-scatter of the unit's even part, and an all-reduce
// of the remainder (the last rank's, fewer than ranks x kShardAlign elements). Units end in
// backward order, the same on every rank, so the collectives match.
void CudaRun::reduce_unit(int u) {
  const auto b = static_cast<std::size_t>(u);
  const dist::ShardLayout& l = shards_->layout();
  const std::size_t a = l.buckets()[b].begin, n = l.buckets()[b].size(), q = l.even(b);
  const auto ranks = static_cast<std::size_t>(l.ranks()), me = static_cast<std::size_t>(shards_->rank());
  const std::size_t gsize = optimizer::grad_type_size(model_->grad_type());
  const dist::GpuType t = grad_gpu_type();
  auto* g = static_cast<char*>(model_->grads());
  zev_->grads_final[b].record(model_->stream());
  GHT_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, zev_->grads_final[b].get(), 0));
  zev_->reduce_begin[b].record(comm_stream_);
  if (q > 0) gpu_comm_->reduce_scatter(g + a * gsize, g + (a + me * q) * gsize, q, t, dist::GpuReduce::avg, comm_stream_);
  if (n > ranks * q) gpu_comm_->allreduce(g + (a + ranks * q) * gsize, n - ranks * q, t, dist::GpuReduce::avg, comm_stream_);
  zev_->reduce_done[b].record(comm_stream_);
}

// ZeRO-1, after this rank's updates were queued: unit by unit, once the unit's regions are
// updated, every rank's bf16 weights of it land on every rank (an in-place all-gather of the even
// part, a broadcast of the last rank's remainder); the next forward waits for gathered[u] alone.
// Nothing waits on the host: the next step's reduce_gradients() bounds these by the deadline too.
void CudaRun::gather_weights() {
  if (!shards_) return;
  const dist::ShardLayout& l = shards_->layout();
  const auto ranks = static_cast<std::size_t>(l.ranks()), me = static_cast<std::size_t>(shards_->rank());
  __nv_bfloat16* w = model_->weights();
  for (std::size_t b = 0; b < l.buckets().size(); ++b) {
    for (std::size_t r : unit_regions_[b]) GHT_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, opt_->region_event(r), 0));
    zev_->gather_begin[b].record(comm_stream_);
    const std::size_t a = l.buckets()[b].begin, n = l.buckets()[b].size(), q = l.even(b);
    if (q > 0) gpu_comm_->all_gather(w + a + me * q, w + a, q, dist::GpuType::bf16, comm_stream_);
    if (n > ranks * q) {
      gpu_comm_->broadcast(w + a + ranks * q, (n - ranks * q) * sizeof(__nv_bfloat16), l.ranks() - 1, comm_stream_);
    }
    zev_->gathered[b].record(comm_stream_);
  }
  gathers_queued_ = true;
}

// ZeRO-1 timings of the step that just ran: the reductions' GPU time (the sum over units, each
// from when the comm stream started it), the part of the comm stream's work after the last
// backward (what the norm waited for), and the all-gathers' time of the step before (this step's
// are still running).
void CudaRun::measure_comm(StepProfile& p) const {
  if (!shards_) return;
  const int A = cfg_.model.grad_accum;
  double ms = 0;
  for (std::size_t b = 0; b < unit_range_.size(); ++b) ms += elapsed_ms(zev_->reduce_begin[b], zev_->reduce_done[b]);
  p.dp_reduce_ms = ms;
  p.dp_reduce_exposed_ms = std::max(0.0, elapsed_ms(cur_->bwd_end[static_cast<std::size_t>(A - 1)], zev_->reduce_end));
  p.dp_gather_ms = prev_gather_ms_;
}

// The record's losses are the means over every rank's micro-batches; with DiLoCo so is the grad
// norm (each worker's own; data parallel's is the same on every rank).
void CudaRun::mean_over_ranks(double& loss, double& aux, double& grad_norm) const {
  const int n = s_.comm->size();
  if (n == 1) return;
  double m[3] = {loss, aux, grad_norm};
  s_.comm->allreduce_sum(m, 3);
  loss = m[0] / n;
  aux = m[1] / n;
  if (cfg_.diloco.on()) grad_norm = m[2] / n;
}

// ---- kernel trace (--trace-kernels) ------------------------------------------------------------

bool CudaRun::traced_step(std::int64_t step) const {
  const auto profiled = static_cast<std::int64_t>(profile_.size());
  if (!run_.trace_kernels || profiled >= run_.profile_steps) return false;
  // The profile's last step, or the run's last when it stops before the profile is complete.
  const std::int64_t last = run_.stop_at ? std::min(*run_.stop_at, cfg_.steps) : cfg_.steps;
  return profiled + 1 == run_.profile_steps || step + 1 == last;
}

// The previous update finishes first, so the window holds this step's work alone. CUPTI
// refusing (e.g. profiling not permitted) costs the breakdown, not the run.
void CudaRun::begin_trace() {
  synchronize();
  try {
    tracer_ = std::make_unique<KernelTracer>(alloc_);
    trace_start_ns_ = KernelTracer::now_ns();
  } catch (const ght::cuda_error& e) {
    tracer_.reset();
    ght::log::warn(std::string("--trace-kernels: CUPTI is unavailable, training continues without the kernel "
                               "breakdown: ") +
                   e.what());
    return;
  }
  model_->set_op_hook([this](const char* op, int /*layer*/) {
    if (tracer_) tracer_->set_op(op);
  });
}

void CudaRun::end_trace(std::int64_t step_no) {
  model_->set_op_hook({});
  synchronize();  // the step's update ran on the optimizer's stream
  TraceWindow w;
  std::vector<GpuActivity> acts;
  try {
    const std::uint64_t end_ns = KernelTracer::now_ns();
    acts = tracer_->finish(w);
    w.start_ns = trace_start_ns_;
    w.end_ns = end_ns;
  } catch (const ght::cuda_error& e) {
    tracer_.reset();
    ght::log::warn(std::string("--trace-kernels: collecting the trace failed, no kernel breakdown: ") + e.what());
    return;
  }
  tracer_.reset();
  const ModelConfig& mc = cfg_.model;
  OpCostInputs in;
  in.grad_bytes = static_cast<int>(optimizer::grad_type_size(model_->grad_type()));
  in.optimizer_state_in_hbm = state_in_hbm_;
  int adding = 0;
  for (int m = 0; m < mc.grad_accum; ++m) adding += grad_write(m) == GradWrite::add ? 1 : 0;
  in.grad_read_share = static_cast<double>(adding) / mc.grad_accum;
  const KernelBreakdown b = make_kernel_breakdown(acts, w, op_cost_table(mc, in));
  const std::string gemm(kernels::cuda::to_string(model_->options().expert_impl));
  const std::string attention(kernels::cuda::to_string(model_->attention_used()));
  const std::string what = "step " + std::to_string(step_no) + " of " + mc.name + ": " +
                           std::to_string(mc.tokens_per_step()) + " tokens (" + std::to_string(mc.grad_accum) +
                           " micro-batches of " + std::to_string(mc.micro_batch) + " x " + std::to_string(mc.seq_len) +
                           "), expert GEMMs " + gemm + ", attention " + attention + ", optimizer state " +
                           (state_in_hbm_ ? "in HBM" : "(partly) on the host");
  nlohmann::ordered_json j = {{"step", step_no},
                              {"model", mc.name},
                              {"tokens_per_step", mc.tokens_per_step()},
                              {"micro_batch", mc.micro_batch},
                              {"seq_len", mc.seq_len},
                              {"grad_accum", mc.grad_accum},
                              {"expert_gemm", gemm},
                              {"attention", attention},
                              {"optimizer_state_in_hbm", state_in_hbm_},
                              {"grad_bytes", in.grad_bytes}};
  const nlohmann::ordered_json bj = b.json();
  for (auto it = bj.begin(); it != bj.end(); ++it) j[it.key()] = it.value();
  const std::string md = "# Kernel breakdown: " + what + "\n\n" + b.markdown();
  if (!s_.leader()) return;  // rank 0 alone writes the run directory
  const fs::path dir(cfg_.out);
  fs::create_directories(dir);
  fileio::atomic_write((dir / "kernel_breakdown.json").string(), j.dump(2) + "\n");
  fileio::atomic_write((dir / "kernel_breakdown.md").string(), md);
  say(md);
  say("kernel breakdown: " + (dir / "kernel_breakdown.md").string() + ", " + (dir / "kernel_breakdown.json").string());
}

// ---- one step ----------------------------------------------------------------------------------

StepOutcome CudaRun::step(std::int64_t step, double lr, DataLoader& data) {
  const ModelConfig& mc = cfg_.model;
  const int B = mc.micro_batch, T = mc.seq_len, A = mc.grad_accum;
  const cudaStream_t s = model_->stream();
  if (traced_step(step)) begin_trace();
  const auto t0 = std::chrono::steady_clock::now();
  step_ = step;
  if (first_step_ < 0) first_step_ = step;
  cur_ = ev_[step_ % 2].get();  // prev_ is the other set: the previous step's events
  std::fill(cur_->waited.begin(), cur_->waited.end(), false);
  cur_->rotated = false;
  switched_ = false;
  stream_host_ms_ = 0;
  spec_host_ms_ = 0;
  reserved_micro_batches_ = 0;

  // ---- forward and backward over the micro-batches ----
  training_ = true;
  step_lr_ = lr;
  // Speculate while the previous step kept it worthwhile: a clipped or skipped step would have
  // undone it (clipping persists over stretches of training, e.g. early on or in a spike).
  // Streamed gradients live on the host, where speculate_region cannot use them.
  speculate_now_ = (opt_->speculate_capacity() > 0 || opt_->speculate_host_capacity() > 0) && !stream_grads_ &&
                   !delay_ && opt_->stats().last_clip_coef == 1.0;
  const bool delayed = delayed_at(step);  // false in the exact warm-up (GHT_OPT_DELAY_WARMUP)
  // A partial delay (GHT_OPT_DELAY_MICRO = j < A): micro-batches j.. compute with update k's weights.
  const int stale = delayed ? delay_stale_micro_batches(A) : A;
  const bool partial = stale < A;
  Batch b;
  double loss = 0, aux = 0;
  // Loss slots cycle; a slot is read back before it is reused (only when grad_accum > 63). The
  // model's last slot is its own forward()'s (eval).
  constexpr int kSlots = kCudaLossSlots - 1;
  auto add_loss = [&](int m) {
    const Loss l = model_->collect_loss(m % kSlots);
    loss += l.ce / A;
    aux += l.aux / A;
  };
  // This rank's A of the step's N·A micro-batches (N = 1: all of them).
  const std::int64_t launches_before = model_->cuda_graph_launches();
  for_each_rank_batch(data, A, s_.comm->rank(), s_.comm->size(), b, [&](int m, const Batch& mb) {
    micro_ = m;
    if (micro_ >= kSlots) add_loss(micro_ - kSlots);
    if (partial && micro_ == stale && fresh_pending_) take_fresh_weights();
    // Quiet hooks let the model replay this micro-batch as a CUDA graph (which calls no hook).
    const char* busy = hooks_busy_reason({micro_, A, stream_grads_, shards_ != nullptr, speculate_now_, tracer_ != nullptr});
    quiet_now_ = busy == nullptr;
    if (graphs_on_ && busy != nullptr && micro_ > 0 && graph_notes_.insert(busy).second) {
      say("CUDA graphs: micro-batch " + std::to_string(micro_) + " of step " + std::to_string(step + 1) +
          " runs eagerly: " + busy + " (said once)");
    }
    hooks_acted_ = false;
    if (sm_budget_beside_update_ > 0) {
      const bool beside = beside_update(micro_, A, delayed, stale);
      kernels::cuda::set_stream_sm_budget(s, beside ? sm_budget_beside_update_ : 0);
      reserved_micro_batches_ += beside ? 1 : 0;
    }
    const auto mm = static_cast<std::size_t>(micro_);
    cur_->fwd_start[mm].record(s);
    pending_unit_ = -1;
    model_->forward_backward_async(mb.inputs.data(), mb.targets.data(), B, T, 1.0f / static_cast<float>(A),
                                   micro_ % kSlots, cur_->fwd_end[mm].get(), grad_write(micro_));
    // An eager run of a quiet micro-batch (a graph's first, or graphs off) called the hooks.
    GHT_EXPECTS(!(quiet_now_ && hooks_acted_),
                "train (cuda): the step's hooks acted in micro-batch " + std::to_string(micro_) +
                    ", which hooks_busy_reason called quiet: a CUDA graph replay would have skipped them");
    if (stream_grads_ && pending_unit_ >= 0) stream_unit(pending_unit_);
    pending_unit_ = -1;
    cur_->bwd_end[mm].record(s);
    ++train_micro_batches_;
  });
  quiet_now_ = false;
  micro_ = 0;
  training_ = false;
  if (sm_budget_beside_update_ > 0) kernels::cuda::set_stream_sm_budget(s, 0);  // evals use every SM
  reduce_gradients();  // data parallel: every rank's gradient becomes the mean over all N·A

  // ---- norm and update: every gradient is final ----
  speculate_now_ = false;
  // Before anything else drives the optimizer: the speculative launches of this backward (and
  // the previous update's, normally joined in the first forward already, before_unit_forward).
  join_update();
  if (delayed) rotate_delayed_buffers(partial);
  // The prediction only where the next step computes one update behind: the exact warm-up's
  // updates write plain bf16 master, which the next step computes with.
  opt_->set_weight_extrapolation(delayed ? delay_weight_extrapolation(A) : 0.0);
  if (tracer_) tracer_->set_op(kOpGradNorm);
  const optimizer::StepResult sr = opt_->begin_step(lr, s);
  const auto t_opt = std::chrono::steady_clock::now();
  const bool gpu_opt = opt_->stream() != nullptr;
  if (gpu_opt) cur_->opt_start.record(opt_->stream());
  if (tracer_) tracer_->set_op(kOpUpdate);
  if (delayed) {
    // A skipped update writes no weights: other_w_ then keeps older ones, and the model's stay
    // master's (partial delay: nothing to switch to).
    fresh_pending_ = partial && sr.taken;
    launch_update_async();
  } else if (launch_thread_ && gpu_opt && !shards_) {
    // The next forward is queued at once, unit by unit as the update's launches reach it
    // (before_unit_forward): on the dma path they block on a full driver queue meanwhile.
    launch_update_async();
  } else {
    opt_->update_all();  // cpu regions first: the optimizer's worker starts on them at once
    gather_weights();    // ZeRO-1: every rank's updated part, before the next forward's first use
    if (gpu_opt) time_update_async();
  }
  opt_launched_ = true;
  update_in_place_ = !delayed;
  const bool update_on_thread = update_.valid();
  const double opt_host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_opt).count();

  for (int m = std::max(0, A - kSlots); m < A; ++m) add_loss(m);
  double grad_norm = sr.grad_norm;
  mean_over_ranks(loss, aux, grad_norm);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- log: the loop writes the step record; the breakdown follows it (after_step) ----
  StepProfile p = measure_step(dt, sr, opt_host_ms);
  p.update_on_thread = update_on_thread;
  p.cuda_graph_launches = model_->cuda_graph_launches() - launches_before;
  if (tracer_) {
    p.traced = true;
    end_trace(p.step);
  }
  if (static_cast<std::int64_t>(profile_.size()) < run_.profile_steps) {
    profile_.push_back(p);
    if (static_cast<std::int64_t>(profile_.size()) == run_.profile_steps) write_profile();
  }
  last_profile_ = p;
  prev_ = cur_;
  extra_work_since_last_step_ = false;

  StepOutcome o;
  o.loss = loss;
  o.aux_loss = aux;
  o.grad_norm = grad_norm;
  o.seconds = dt;
  o.mfu = p.mfu;
  o.link_gb_h2d = p.h2d_gb;
  o.link_gb_d2h = p.d2h_gb;
  return o;
}

// The compute stream waits for the update in flight (the previous step's): it writes other_w_ and
// reads other_g_. Once per step; the wait is the step's stall (rotate_before to rotate_after).
// (Before the first update no event was recorded: nothing to wait for.)
void CudaRun::wait_for_update() {
  join_update();  // every region's event is recorded once its launches are
  if (cur_->rotated) return;
  const cudaStream_t s = model_->stream();
  cur_->rotate_before.record(s);
  for (std::size_t r = 0; r < opt_->num_regions(); ++r) GHT_CUDA_TRY(cudaStreamWaitEvent(s, opt_->region_event(r), 0));
  cur_->rotate_after.record(s);
  cur_->rotated = true;
}

void CudaRun::rotate_delayed_buffers(bool partial) {
  const cudaStream_t s = model_->stream();
  wait_for_update();  // a partial delay waited in the step already, unless it had nothing to switch to
  if (partial) {
    // The model keeps the weights its fresh micro-batches computed with (master before this
    // update) for the next step's stale ones; this update writes the buffer the stale ones of
    // this step computed with.
    other_g_ = model_->swap_buffers(model_->weights(), other_g_).second;
  } else {
    // The first delayed step (after the exact warm-up, or of a fresh run): the previous update
    // wrote the model's own buffer, so the other one gets those weights (the next step computes
    // with master, once). After a resume past the warm-up the other buffer holds what the
    // checkpoint kept for it.
    if (!delayed_at(step_ - 1)) {
      GHT_CUDA_TRY(cudaMemcpyAsync(other_w_, model_->weights(), model_->num_params() * sizeof(__nv_bfloat16),
                                   cudaMemcpyDeviceToDevice, s));
    }
    const auto [w, g] = model_->swap_buffers(other_w_, other_g_);
    other_w_ = w;  // the weights this step computed with: the update writes the next ones there
    other_g_ = g;  // this step's gradients: the update reads them there
  }
  const std::size_t gsize = optimizer::grad_type_size(model_->grad_type());
  const auto& ts = model_->tensors();
  for (std::size_t r = 0; r < ts.size(); ++r) {
    opt_->set_grad(r, static_cast<const char*>(other_g_) + ts[r].offset * gsize, model_->grad_type());
    opt_->set_weight(r, other_w_ + ts[r].offset);
  }
}

// Micro-batch m runs beside an update that must end before a later micro-batch: the stale
// micro-batches of a partial delay (update k-1 runs during them, and micro-batch `stale` waits for
// it). Not the whole-step delay, whose update has the whole step to hide in (q24b: its GEMMs on
// fewer SMs cost 3.7% of the step, the update had time to spare), nor exact mode: its first
// micro-batch's forward (behind the update thread) and a speculating last backward measured the
// same with 8 SMs left free as with none (q24b at 262k). bench/NOTES.md, sessions 17 and 18.
bool CudaRun::beside_update(int m, int A, bool delayed, int stale) const {
  return delayed && stale < A && m < stale;
}

void CudaRun::take_fresh_weights() {
  wait_for_update();
  // The stale micro-batches are queued before this on the same stream: their weights are free
  // for the next update once this step's backward ends (rotate_delayed_buffers).
  other_w_ = model_->swap_buffers(other_w_, model_->grads()).first;
  fresh_pending_ = false;
  switched_ = true;
}

void CudaRun::record_update_end(StepEvents& ev) {
  for (std::size_t r = 0; r < opt_->num_regions(); ++r) {
    GHT_CUDA_TRY(cudaStreamWaitEvent(timer_stream_, opt_->region_event(r), 0));
  }
  ev.opt_end.record(timer_stream_);
}

void CudaRun::launch_update_async() {
  StepEvents* ev = cur_;
  ev->opt_timed = opt_->stream() != nullptr;
  launched_.start(opt_->num_regions());
  update_ = std::async(std::launch::async, [this, ev] {
    struct End {  // also when a launch throws: a waiting forward then joins and rethrows
      LaunchProgress& p;
      ~End() { p.end(); }
    } end{launched_};
    GHT_CUDA_TRY(cudaSetDevice(device_));
    opt_->update_all([this](std::size_t r) { launched_.launched(r); });
    if (ev->opt_timed) record_update_end(*ev);
  });
}

void CudaRun::time_update_async() {
  StepEvents* ev = cur_;
  ev->opt_timed = true;
  timer_ = std::async(std::launch::async, [this, ev] {
    GHT_CUDA_TRY(cudaSetDevice(device_));
    record_update_end(*ev);
  });
}

void CudaRun::join_update() {
  if (spec_.valid()) spec_.get();
  if (update_.valid()) update_.get();
  join_timer();
}

void CudaRun::join_timer() {
  if (timer_.valid()) timer_.get();
}

// Every compute-stream event of the step has completed: begin_step waited for them.
StepProfile CudaRun::measure_step(double dt, const optimizer::StepResult& sr, double opt_host_ms) {
  const ModelConfig& mc = cfg_.model;
  const int A = mc.grad_accum;
  StepProfile p;
  p.step = step_ + 1;
  p.wall_ms = dt * 1e3;
  for (int m = 0; m < A; ++m) {
    const auto mm = static_cast<std::size_t>(m);
    p.forward_ms += elapsed_ms(cur_->fwd_start[mm], cur_->fwd_end[mm]);
    p.backward_ms += elapsed_ms(cur_->fwd_end[mm], cur_->bwd_end[mm]);
  }
  for (std::size_t u = 0; u < cur_->waited.size(); ++u) {
    if (cur_->waited[u]) p.opt_stall_ms += elapsed_ms(cur_->wait_before[u], cur_->wait_after[u]);
  }
  p.forward_ms -= p.opt_stall_ms;
  if (cur_->rotated) p.opt_stall_ms += elapsed_ms(cur_->rotate_before, cur_->rotate_after);
  if (prev_ != nullptr) {
    // An eval or a checkpoint between the steps is not optimizer time: leave that gap out.
    if (!extra_work_since_last_step_) {
      p.step_gap_ms = elapsed_ms(prev_->bwd_end[static_cast<std::size_t>(A - 1)], cur_->fwd_start[0]);
    }
    if (prev_->opt_timed) {
      // The previous update finished before this step's forward passed its last unit.
      GHT_CUDA_TRY(cudaEventSynchronize(prev_->opt_end.get()));
      p.prev_opt_update_ms = elapsed_ms(prev_->opt_start, prev_->opt_end);
    }
  }
  p.opt_exposed_ms = p.opt_stall_ms + p.step_gap_ms;
  p.opt_host_ms = opt_host_ms;
  p.grad_stream_host_ms = stream_host_ms_;
  const auto tokens = static_cast<double>(mc.tokens_per_step());
  p.tokens_per_s = tokens / dt;
  p.mfu = mc.flops_per_token() * tokens / dt / kPeakFlops;
  p.h2d_gb = sr.taken ? link_h2d_per_step_ / 1e9 : 0;
  p.d2h_gb = sr.taken ? link_d2h_per_step_ / 1e9 : 0;
  p.speculated_params = sr.speculated_params;
  p.speculation_undone = sr.speculation_undone;
  p.spec_host_ms = spec_host_ms_;
  p.sm_budget = sm_budget_beside_update_;
  p.micro_batches_reserved = reserved_micro_batches_;
  p.memory = memory_json(*alloc_);
  measure_comm(p);
  return p;
}

void CudaRun::after_step(std::int64_t step, MetricsLogger& log) {
  const StepProfile& p = last_profile_;
  if (step == first_step_ + 1) {
    log.print(std::string("attention ran: ") + std::string(kernels::cuda::to_string(model_->attention_used())));
    const tier::Prediction& pr = plan_->prediction();
    const alloc::Usage hbm = alloc_->tier_usage(TierKind::hbm), host = alloc_->tier_usage(TierKind::host);
    auto ratio = [](std::uint64_t a, std::uint64_t b) {
      return b == 0 ? std::string("none planned") : fmt("%.3fx", static_cast<double>(a) / static_cast<double>(b));
    };
    log.print("memory after the first step: HBM peak " + config::format_bytes(hbm.peak) + " (plan " +
              config::format_bytes(pr.hbm_bytes) + ", " + ratio(hbm.peak, pr.hbm_bytes) + "), host peak " +
              config::format_bytes(host.peak) + " (plan " + config::format_bytes(pr.host_bytes) + ", " +
              ratio(host.peak, pr.host_bytes) + "), " + std::to_string(alloc_->spill_count()) + " spills");
  }
  nlohmann::ordered_json pj = p.json();
  pj["type"] = "profile";
  log.log_event(pj);
  if (cfg_.log_every > 0 && (step % cfg_.log_every == 0 || step == cfg_.steps)) {
    std::string line = "  fwd " + fmt("%.1f", p.forward_ms) + " ms | bwd " + fmt("%.1f", p.backward_ms) +
                       " ms | opt exposed " + fmt("%.1f", p.opt_exposed_ms) + " ms (stall " +
                       fmt("%.1f", p.opt_stall_ms) + ", gap " + fmt("%.1f", p.step_gap_ms) + ")";
    if (p.prev_opt_update_ms) line += " | opt update " + fmt("%.1f", *p.prev_opt_update_ms) + " ms";
    if (stream_grads_) line += " | grad stream host " + fmt("%.1f", p.grad_stream_host_ms) + " ms";
    if (graphs_on_) line += " | graphs " + std::to_string(p.cuda_graph_launches) + "/" + std::to_string(cfg_.model.grad_accum);
    if (p.speculated_params > 0) {
      line += " | speculated " + fmt("%.1f", static_cast<double>(p.speculated_params) / 1e6) + "M params" +
              (p.speculation_undone ? " (undone)" : "") + ", launch " + fmt("%.1f", p.spec_host_ms) + " ms";
    }
    log.print(line);
  }
}

void CudaRun::write_profile() {
  if (profile_.size() == profile_written_ || !s_.leader()) return;  // rank 0 alone writes the run directory
  profile_written_ = profile_.size();
  nlohmann::ordered_json j;
  const ModelConfig& mc = cfg_.model;
  j["formula"] = mfu_formula_;
  j["peak_flops"] = kPeakFlops;
  j["flops_per_token"] = mc.flops_per_token();
  j["tokens_per_step"] = mc.tokens_per_step();
  j["definitions"] = {
      {"forward_ms", "compute stream, embedding through the last layer, minus opt_stall_ms (in a CUDA graph "
                     "replay too: the forward-end event is an event record node of the graph)"},
      {"backward_ms", "compute stream, final norm + fused LM head/CE (forward and backward) + every layer's backward"},
      {"opt_stall_ms", "compute stream waiting in this step's forward for the previous update's per-unit events"},
      {"step_gap_ms", "compute stream idle between the previous step's last backward and this step's first forward "
                      "(grad-norm, update launch, host work)"},
      {"opt_exposed_ms", "opt_stall_ms + step_gap_ms"},
      {"opt_host_ms", "training thread's time from the grad norm to the update launched: the launches themselves "
                      "where they run on it (GHT_OPT_LAUNCH_THREAD=off, ZeRO-1), else the hand-off to the update "
                      "thread (delayed mode, exact mode by default)"},
      {"prev_opt_update_ms", "optimizer stream duration of the previous step's update after its grad norm "
                             "(speculated regions, updated during backward, are not in it)"},
      {"update_launched_on_thread", "the update was launched from a host thread of its own (delayed mode; exact mode "
                                    "with GHT_OPT_LAUNCH_THREAD), not from the training thread"},
      {"speculated_params", "parameters updated during the last backward, before the grad norm (GHT_OPT_SPECULATE)"},
      {"spec_host_ms", "training thread's time in the speculative updates' launches (the backward's launches wait "
                       "for it): the launches themselves with GHT_OPT_LAUNCH_THREAD=off or in a traced step, else "
                       "their hand-off to threads"},
      {"speculation_undone", "the step clipped or was skipped, so those updates were recomputed or restored"},
      {"cuda_graph_launches", "micro-batches of the step replayed as one captured CUDA graph (GHT_CUDA_GRAPHS); "
                              "the others ran eagerly"},
      {"link_gb", "bytes the optimizer (and the gradient stream) move over the link per step, from each region's path"},
      {"traced", "the step whose kernels were traced (--trace-kernels, kernel_breakdown.json): it starts after the "
                 "previous update and waits for its own, and CUPTI slows it, so the medians leave it out"}};
  nlohmann::ordered_json pl;
  pl["placement"] = plan_ ? "plan (" + std::string(tier::to_string(plan_->options().policy)) + ")" : "none";
  pl["gradients"] = stream_grads_ ? "stream (bf16 -> fp32 host accumulator)" : "accumulate in HBM (fp32)";
  pl["state_hbm_bytes"] = state_bytes(TierKind::hbm);
  pl["state_host_bytes"] = state_bytes(TierKind::host);
  if (plan_) {
    pl["plan_hbm_bytes"] = plan_->prediction().hbm_bytes;
    pl["plan_host_bytes"] = plan_->prediction().host_bytes;
    pl["hbm_budget"] = plan_->options().budgets.hbm;
    pl["host_budget"] = plan_->options().budgets.host;
  }
  if (alloc_) {
    pl["memory"] = memory_json(*alloc_);
    pl["spills"] = alloc_->spill_count();
  }
  int rc = 0;
  for (bool b : recompute_) rc += b ? 1 : 0;
  pl["recomputed_layers"] = rc;
  j["placement"] = pl;
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  std::vector<double> fw, bw, ex, wall, mfu, tps, upd, spec;
  for (const auto& p : profile_) {
    steps.push_back(p.json());
    if (&p == &profile_.front() && profile_.size() > 1) continue;  // warm-up step
    if (p.traced) continue;
    fw.push_back(p.forward_ms);
    bw.push_back(p.backward_ms);
    ex.push_back(p.opt_exposed_ms);
    wall.push_back(p.wall_ms);
    mfu.push_back(p.mfu);
    tps.push_back(p.tokens_per_s);
    if (p.prev_opt_update_ms) upd.push_back(*p.prev_opt_update_ms);
    spec.push_back(static_cast<double>(p.speculated_params));
  }
  j["median_excluding_first_step"] = {{"wall_ms", median(wall)},   {"forward_ms", median(fw)},
                                      {"backward_ms", median(bw)}, {"opt_exposed_ms", median(ex)},
                                      {"opt_update_ms", median(upd)}, {"mfu", median(mfu)},
                                      {"tokens_per_s", median(tps)}, {"link_gb_h2d", link_h2d_per_step_ / 1e9},
                                      {"link_gb_d2h", link_d2h_per_step_ / 1e9},
                                      {"speculated_params", median(spec)}};
  j["steps"] = steps;
  fs::create_directories(cfg_.out);
  fileio::atomic_write((fs::path(cfg_.out) / "profile.json").string(), j.dump(2) + "\n");
}

std::string CudaRun::stats_report() const {
  std::string s;
  if (model_) s += model_->memory_report();
  if (alloc_) {
    s += "; optimizer state: HBM " + config::format_bytes(state_bytes(TierKind::hbm)) + ", host " +
         config::format_bytes(state_bytes(TierKind::host));
  }
  if (host_grads_) s += "; host gradient accumulator " + config::format_bytes(host_grads_.bytes());
  return s;
}


void CudaRun::finish(bool ok) {
  write_profile();  // a run that ended (or was stopped, or failed) before N steps
  if (graphs_on_ && model_) {
    const std::string& off = model_->cuda_graphs_off();
    say("CUDA graphs: " + std::to_string(model_->cuda_graph_launches()) + " of " + std::to_string(train_micro_batches_) +
        " training micro-batches ran as graph launches (" + std::to_string(model_->cuda_graph_captures()) +
        " captures)" + (off.empty() ? "" : "; off since a capture failed: " + off));
  }
  if (ok && !profile_.empty()) {
    say("profile (" + std::to_string(profile_.size()) + " steps): " + (fs::path(cfg_.out) / "profile.json").string());
  }
}

TrainSummary CudaRun::go() {
  try {
    setup();
    return run_training(*this, s_);
  } catch (const ght::out_of_memory& e) {
    write_profile();
    throw ght::out_of_memory(std::string("train (cuda): out of memory at step ") + std::to_string(s_.step + 1) +
                             ": " + e.what() + "; " + stats_report() + "; last good checkpoint: " +
                             (s_.summary.last_checkpoint.empty() ? "none" : s_.summary.last_checkpoint));
  } catch (const ght::cuda_error& e) {
    write_profile();
    throw ght::cuda_error(std::string("train (cuda): CUDA error at step ") + std::to_string(s_.step + 1) + ": " +
                          e.what() + "; " + stats_report() + "; last good checkpoint: " +
                          (s_.summary.last_checkpoint.empty() ? "none" : s_.summary.last_checkpoint));
  }
}

}  // namespace

TrainSummary train_cuda(const TrainConfig& cfg, const TrainRunOptions& run,
                        std::shared_ptr<dist::Communicator> comm) {
  GHT_EXPECTS(!run.trace_kernels || kernel_trace_built(),
              "--trace-kernels: this build has no kernel tracer (built without CUPTI: CUDA::cupti was not found at "
              "configure time)");
  GHT_EXPECTS(!run.trace_kernels || run.profile_steps >= 1,
              "--trace-kernels traces the last of the --profile-steps N steps: set profile_steps >= 1");
  TrainSession s(cfg, run, std::move(comm));  // before the GPU is touched: run directory, data
  CudaRun r(s);
  return r.go();
}

}  // namespace ght::trainer
