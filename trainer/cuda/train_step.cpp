// The CUDA run's step, as a sequence of phases: forward and backward over the micro-batches (the
// model's hooks below wait for the update unit by unit, stream gradients and launch speculative
// updates), the gradients' reduction, the norm and the update's launch, the losses, the
// breakdown.
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

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

// ---- one step ----------------------------------------------------------------------------------

StepOutcome CudaRun::step(std::int64_t step, double lr, DataLoader& data) {
  const ModelConfig& mc = cfg_.model;
  const int B = mc.micro_batch, T = mc.seq_len, A = mc.grad_accum;
  const cudaStream_t s = model_->stream();
  if (traced_step(step)) begin_trace();
  const auto t0 = std::chrono::steady_clock::now();
  start_step(step);
  model_->weights_changed();  // whatever wrote them since (an update, an outer step): FP8 copies anew

  // ---- forward and backward over the micro-batches ----
  training_ = true;
  step_lr_ = lr;
  // Speculate while the previous step kept it worthwhile: a clipped or skipped step would have
  // undone it (clipping persists over stretches of training, e.g. early on or in a spike).
  // Streamed gradients live on the host, where speculate_region cannot use them.
  speculate_now_ = speculation_possible() && opt_->stats().last_clip_coef == 1.0;
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
  launch_update(sr, delayed, partial);
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
  keep_profile(p);

  StepOutcome o;
  o.loss = loss;
  o.aux_loss = aux;
  o.grad_norm = grad_norm;
  o.seconds = dt;
  o.mfu = p.mfu;
  o.mfu_seed = p.mfu_seed;
  o.link_gb_h2d = p.h2d_gb;
  o.link_gb_d2h = p.d2h_gb;
  return o;
}

// The step's per-step state: its event set (prev_ is the other one), and nothing waited for yet.
void CudaRun::start_step(std::int64_t step) {
  step_ = step;
  if (first_step_ < 0) first_step_ = step;
  cur_ = ev_[step_ % 2].get();  // prev_ is the other set: the previous step's events
  std::fill(cur_->waited.begin(), cur_->waited.end(), false);
  cur_->rotated = false;
  switched_ = false;
  stream_host_ms_ = 0;
  spec_host_ms_ = 0;
  reserved_micro_batches_ = 0;
}

// The update after begin_step: from the update thread (delayed mode; exact mode with
// GHT_OPT_LAUNCH_THREAD), or here, with ZeRO-1's gathers after it.
void CudaRun::launch_update(const optimizer::StepResult& sr, bool delayed, bool partial) {
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
  model_->weights_changed();  // FP8 experts: the next forward quantises the new weights
}

// The step's breakdown into profile.json's steps (the first profile_steps of them), and the
// step's events become the previous step's.
void CudaRun::keep_profile(const StepProfile& p) {
  if (static_cast<std::int64_t>(profile_.size()) < run_.profile_steps) {
    profile_.push_back(p);
    if (static_cast<std::int64_t>(profile_.size()) == run_.profile_steps) write_profile();
  }
  last_profile_ = p;
  prev_ = cur_;
  extra_work_since_last_step_ = false;
}

}  // namespace ght::trainer::cuda_run
