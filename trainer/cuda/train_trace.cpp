// The CUDA run's kernel trace (--trace-kernels): the traced step, and its per-op breakdown.
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

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

}  // namespace ght::trainer::cuda_run
