// The CUDA run's setup: the device, the plan and its allocator, the model, the optimizer and what
// the run reports about them before its first step.
#include "optimizer/adamw_kernels.hpp"
#include "tier/regions_json.hpp"
#include "trainer/cuda/train_run.hpp"
#include "trainer/fp8_experts.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

// ---- placement -----------------------------------------------------------------------------

namespace {

// The plan this run follows, made for the allocator's own budgets so that what it predicts is
// what the allocator enforces: the search over precision and schedule (trainer/plan_decide.hpp,
// which applies its choice to the registry before the model and optimizer read it), each
// candidate placed greedily by default (GHT_POLICY), GHT_PLACE rules when set. `scope.ranks`: the
// data-parallel ranks that shard the optimizer state (ZeRO-1; 1: none). The LM-head chunk is sized
// with the plan (from free HBM), and the model must run with it.
// GHT_PLAN_MEASUREMENTS feeds the auto policy from the start (a file an earlier run wrote).
tier::PlanOptions run_plan_options(const ModelConfig& mc, const alloc::tiered_allocator& a) {
  const config::Registry& reg = config::cfg();
  const tier::LinkNumbers link = tier::resolve_link_numbers();
  const tier::Capacities caps = tier::machine_capacities();
  tier::PlanOptions options =
      tier::plan_options_from_config(reg, link, caps, model_step_flops(mc), model_head_flops(mc));
  // The allocator's budgets, less a margin for what the plan does not model (allocation
  // rounding, the norm scratch): 1 MiB + 0.25%.
  auto planned = [](std::uint64_t b) { return b - std::min(b, (std::uint64_t{1} << 20) + b / 400); };
  options.budgets.hbm = planned(a.report(TierKind::hbm).budget);
  options.budgets.host = planned(a.report(TierKind::host).budget);
  return options;
}

}  // namespace

// The run's setup, in order: the device (and the data-parallel communicator), the plan and the
// allocator that follows it, the model, the optimizer, the link bytes per step, the step's events
// and streams, and what was set up (said once).
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

  // The data (train and val loaders) is TrainSession's, checked before this runs.
  const std::int64_t lm_head_rows = plan_placement();
  CudaGraphsMode graphs_mode = CudaGraphsMode::automatic;
  const CudaGraphChoice graphs = make_model(lm_head_rows, graphs_mode);
  const int U = model_->num_units();
  make_optimizer();
  std::size_t by_path[3] = {0, 0, 0};
  count_link_bytes(by_path);

  model_->set_hooks({[this](int u) { before_unit_forward(u); }, [this](int u) { after_unit_backward(u); }});
  model_->set_hooks_quiet([this] { return training_ && quiet_now_; });
  ev_[0] = std::make_unique<StepEvents>(mc.grad_accum, U);
  ev_[1] = std::make_unique<StepEvents>(mc.grad_accum, U);
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&timer_stream_, cudaStreamNonBlocking));
  if (stream_grads_) {
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&grad_ready_stream_, cudaStreamNonBlocking));
    unit_done_ = std::vector<Event>(static_cast<std::size_t>(U));
  }
  report_setup(prop, by_path, graphs_mode, graphs);
}

// The allocator and the plan it follows (the plan's LM-head rows, which the model must run with).
std::int64_t CudaRun::plan_placement() {
  const ModelConfig& mc = cfg_.model;
  // Data-parallel ranks step through one schedule of micro-batches: each keeps the configured one.
  if (data_parallel()) cfg_.model.micro_batch_pinned = true;
  alloc_ = alloc::make_default_tiered_allocator();
  plan_base_ = run_plan_options(mc, *alloc_);
  plan_scope_ = local_plan_scope(mc, zero1() ? s_.comm->size() : 1, !cfg_.diloco.on());
  const std::optional<tier::Measurements> measured = tier::configured_measurements();
  DecidedPlan decided = decide_plan(mc, plan_base_, plan_scope_, measured ? &*measured : nullptr);
  plan_settings_ = decided.search.best().settings;
  // TrainSession's loader and config.json, and this run's copy of the configuration (mc), train the
  // chosen micro-batch.
  s_.reshape(decided.shape.micro_batch, decided.shape.grad_accum);
  cfg_.model = decided.shape;
  ModelPlan& run_plan = decided.model;
  plan_ = std::move(run_plan.plan);
  predicted_ = tier::predicted_phases(plan_->prediction());
  const tier::Plan& plan = *plan_;
  say(decided.table(mc) + "plan (" + std::string(tier::to_string(plan.options().policy)) +
      "; GHT_* options pin the search, GHT_POLICY or GHT_PLACE the placement):\n" + plan.format_table(false));
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
  return run_plan.lm_head_rows;
}

// The model (its options from the configuration and the plan), the CUDA-graph choice, and the
// delayed update's second weight and gradient buffers.
CudaGraphChoice CudaRun::make_model(std::int64_t lm_head_rows, CudaGraphsMode& graphs_mode) {
  const ModelConfig& mc = cfg_.model;
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
  mo.fp8_experts = fp8_gemms_from_config() == Fp8Gemms::experts;
  mo.ce_chunk_rows = lm_head_rows;  // what the plan counted
  mo.allocator = alloc_;
  CudaGraphRunFacts graph_facts;
  graph_facts.expert_offsets_on_host = kernels::cuda::needs_host_offsets(mo.expert_impl);
  graph_facts.expert_impl = kernels::cuda::to_string(mo.expert_impl);
  graph_facts.grad_accum = mc.grad_accum;
  graph_facts.stream_grads = stream_grads_;
  graphs_mode = cuda_graphs_mode();
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
  return graphs;
}

// The optimizer: one region per tensor (or per ZeRO-1 slice), reading the model's gradient buffer
// (or the host accumulator when gradients stream) and writing its weights.
void CudaRun::make_optimizer() {
  const int U = model_->num_units();
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
  if (data_parallel()) {
    ao.speculate_bytes = 0;  // gradients are final only after the all-reduce
  } else if (speculation_auto()) {
    ao.speculate_bytes = plan_->options().speculation_hbm_bytes;  // what the plan counted
  }
  if (shards_) ao.combine_sumsq = sumsq_over_ranks(*s_.comm);  // the norm over every rank's shard
  opt_ = std::make_unique<optimizer::AdamW>(std::move(regions), ao, alloc_);
}

// Link bytes per step, from each region's path (the optimizer's own traffic and the stream);
// by_path: parameters per optimizer path.
void CudaRun::count_link_bytes(std::size_t (&by_path)[3]) {
  const ModelConfig& mc = cfg_.model;
  for (std::size_t r = 0; r < opt_->num_regions(); ++r) {
    const auto n = static_cast<double>(opt_->region(r).n);
    const optimizer::Path p = opt_->path(r);
    by_path[static_cast<int>(p)] += opt_->region(r).n;
    if (p == optimizer::Path::gpu_link) {
      // The state buffers on the host (master 4 B, m and v 4, 2 or 1.015 B per parameter) read
      // and written once; those the plan left in HBM stay there. A host gradient is read too.
      double host_state = 0;
      for (const TensorClass cls : {TensorClass::master, TensorClass::adam_m, TensorClass::adam_v}) {
        if (opt_->state(r, cls).tier != TierKind::host) continue;
        host_state += cls == TensorClass::master
                          ? 4 * n
                          : static_cast<double>(optimizer::state_bytes(opt_->state_type(), opt_->region(r).n));
      }
      link_h2d_per_step_ += host_state + (stream_grads_ ? 4 * n : 0);
      link_d2h_per_step_ += host_state;
    } else if (p == optimizer::Path::cpu) {
      link_d2h_per_step_ += stream_grads_ ? 0 : 4 * n;  // fp32 gradient down
      link_h2d_per_step_ += 2 * n;                       // bf16 weight up
    } else if (stream_grads_) {
      link_h2d_per_step_ += 4 * n;  // device state, host gradient
    }
    if (stream_grads_) link_d2h_per_step_ += 2.0 * n * mc.grad_accum;  // bf16 per micro-batch
  }
  state_in_hbm_ = by_path[0] == 0 && by_path[1] == 0;
}

// The update's device and gpu_link kernels run side by side on their own streams, each on its
// share of the SMs (optimizer::split_update_sms), while both have regions left: the whole update
// when nothing was speculated.
std::string CudaRun::side_by_side_note(int sms, const std::size_t (&by_path)[3]) const {
  if (!config::cfg().get_bool(config::Key::GHT_OPT_SIDE_BY_SIDE)) return "";
  const int link = optimizer::split_update_sms(sms, static_cast<double>(by_path[0]), static_cast<double>(by_path[2]),
                                               opt_->link_kernel_sms());
  if (link == 0) return "";
  return " (" + std::to_string(link) + " beside the device path's " + std::to_string(sms - link) +
         " while both have regions left to update)";
}

bool CudaRun::speculation_possible() const {
  return (opt_->speculate_capacity() > 0 || opt_->speculate_host_capacity() > 0) && !stream_grads_ && !delay_;
}

// What was set up (the model, memory, optimizer paths, the update's schedule, CUDA graphs), and
// the update's launch options that go with it.
void CudaRun::report_setup(const cudaDeviceProp& prop, const std::size_t (&by_path)[3], CudaGraphsMode graphs_mode,
                           const CudaGraphChoice& graphs) {
  const ModelConfig& mc = cfg_.model;
  const double fpt = mc.flops_per_token();
  mfu_formula_ = "MFU = flops_per_token x tokens_per_step / step_seconds / 989.4e12, flops_per_token = "
                 "6 x N_active_nonembedding + 12 x L x H x d_head x T = 6 x " +
                 std::to_string(mc.active_nonembedding_params()) + " + 12 x " + std::to_string(mc.layers) +
                 " x " + std::to_string(mc.heads) + " x " + std::to_string(mc.head_dim) + " x " +
                 std::to_string(mc.seq_len) + " = " + fmt("%.4g", fpt) + " FLOP/token";
  seed_formula_ = "MFU (seed's count) = seed_flops_per_token x tokens_per_step / step_seconds / 989.4e12, "
                  "seed_flops_per_token = 6 x N_active (embeddings included) + 12 x L x T x d_model = 6 x " +
                  std::to_string(mc.active_params()) + " + 12 x " + std::to_string(mc.layers) + " x " +
                  std::to_string(mc.seq_len) + " x " + std::to_string(mc.d_model) + " = " +
                  fmt("%.4g", mc.seed_flops_per_token()) + " FLOP/token";
  const auto mem = model_->memory();
  say("model " + mc.name + ": " + std::to_string(mc.total_params()) + " params (" +
      std::to_string(mc.active_params()) + " active), " + std::to_string(mc.tokens_per_step()) +
      " tokens/step, backend cuda on " + prop.name + "; attention requested " +
      std::string(kernels::cuda::to_string(model_->options().attention_impl)) + ", expert GEMMs " +
      std::string(kernels::cuda::to_string(model_->options().expert_impl)) + ", fused kernels " +
      (model_->options().fused_kernels ? "on" : "off") +
      (model_->options().fp8_experts ? "; the experts' forward in FP8 (GHT_FP8=experts)" : ""));
  say("memory: HBM weights " + config::format_bytes(mem.weights) + ", gradients " + config::format_bytes(mem.grads) +
      (stream_grads_ ? " (bf16, streamed to a " + config::format_bytes(host_grads_.bytes()) + " fp32 host accumulator)"
                     : std::string(model_->grad_type() == optimizer::GradType::bf16
                                       ? " (bf16, accumulated in HBM: GHT_GRAD_ACCUM=bf16)"
                                       : " (fp32, accumulated in HBM)")) +
      "; optimizer state HBM " + config::format_bytes(state_bytes(TierKind::hbm)) + ", host " +
      config::format_bytes(state_bytes(TierKind::host)));
  say("optimizer paths: gpu_link " + std::to_string(by_path[0]) + ", cpu " + std::to_string(by_path[1]) +
      ", device " + std::to_string(by_path[2]) + " params; link per step " + fmt("%.2f", link_h2d_per_step_ / 1e9) +
      " GB h2d, " + fmt("%.2f", link_d2h_per_step_ / 1e9) + " GB d2h" +
      (by_path[0] > 0 ? "; gpu_link kernels on " + std::to_string(opt_->link_kernel_sms()) + " SMs" : std::string()) +
      side_by_side_note(prop.multiProcessorCount, by_path));
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
  } else if (speculation_possible()) {
    say("optimizer: updates of layers whose gradients are final start during the last backward, within a " +
        config::format_bytes(opt_->speculate_capacity()) + " HBM undo arena (gpu_link regions, GHT_OPT_SPECULATE" +
        (speculation_auto() ? " auto: what the last backward can hide, within free HBM" : "") + ") and a " +
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
  say(seed_formula_);
}

}  // namespace ght::trainer::cuda_run
