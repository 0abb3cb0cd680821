// The CUDA run's per-step breakdown (from its CUDA events), the line after each step, profile.json
// and the memory report.
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

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
  p.mfu_seed = mc.seed_flops_per_token() * tokens / dt / kPeakFlops;
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
  keep_phases(step, p);
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
  // CudaRun::step speculates only after a step that did not clip: say so once, since the plan's
  // exposed update counts on it.
  if (speculation_possible() && !speculation_pause_said_ && opt_->stats().last_clip_coef < 1.0) {
    speculation_pause_said_ = true;
    log.print("optimizer: step " + std::to_string(step) + " clipped (gradient norm " +
              fmt("%.3f", opt_->stats().last_grad_norm) + "), so the next step's updates start after its backward, " +
              "not during it; speculation resumes after a step that does not clip (the plan's exposed update " +
              "assumes it; said once)");
  }
  nlohmann::ordered_json pj = p.json();
  pj["type"] = "profile";
  pj["predicted"] = {{"forward_ms", 1e3 * predicted_.forward}, {"backward_ms", 1e3 * predicted_.backward},
                     {"opt_exposed_ms", 1e3 * predicted_.exposed_update}, {"wall_ms", 1e3 * predicted_.step}};
  // The plan's prediction checked once the first steps (allocation, graph capture) are behind, on
  // an untraced step: a traced one runs without CUDA graphs and flushes the trace in its gap.
  if (step == first_step_ + 3 || (step == cfg_.steps && step < first_step_ + 3)) {
    // A traced step is always profiled: profile_ ends with it, the step before it next to last.
    const bool before = p.traced && profile_.size() >= 2 && !profile_[profile_.size() - 2].traced &&
                        profile_[profile_.size() - 2].step > first_step_ + 1;
    const StepProfile& c = before ? profile_[profile_.size() - 2] : p;
    const tier::Phases measured{c.forward_ms / 1e3, c.backward_ms / 1e3, c.opt_exposed_ms / 1e3, c.wall_ms / 1e3};
    const std::string which = before ? " (step " + std::to_string(c.step) + ", the last untraced)" : "";
    log.print(tier::compare_phases(predicted_, measured) + which);
    replan_on_measurements(log);
    write_measurements();
  }
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
  j["seed_formula"] = seed_formula_;
  j["seed_flops_per_token"] = mc.seed_flops_per_token();
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
  std::vector<double> fw, bw, ex, wall, mfu, mfu_seed, tps, upd, spec;
  for (const auto& p : profile_) {
    steps.push_back(p.json());
    if (&p == &profile_.front() && profile_.size() > 1) continue;  // warm-up step
    if (p.traced) continue;
    fw.push_back(p.forward_ms);
    bw.push_back(p.backward_ms);
    ex.push_back(p.opt_exposed_ms);
    wall.push_back(p.wall_ms);
    mfu.push_back(p.mfu);
    mfu_seed.push_back(p.mfu_seed);
    tps.push_back(p.tokens_per_s);
    if (p.prev_opt_update_ms) upd.push_back(*p.prev_opt_update_ms);
    spec.push_back(static_cast<double>(p.speculated_params));
  }
  j["median_excluding_first_step"] = {{"wall_ms", median(wall)},   {"forward_ms", median(fw)},
                                      {"backward_ms", median(bw)}, {"opt_exposed_ms", median(ex)},
                                      {"opt_update_ms", median(upd)}, {"mfu", median(mfu)},
                                      {"mfu_seed", median(mfu_seed)},
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

}  // namespace ght::trainer::cuda_run
