// The CUDA backend of the training loop (see train_cuda.hpp). The loop itself (resume, eval,
// checkpoints, signals, the step record) is trainer/loop.cpp; this file is the backend's entry,
// its weights and state, and its end. The run (train_run.hpp) is set up in train_setup.cpp, steps
// in train_step.cpp, schedules its update in train_update.cpp, goes data parallel in
// train_data_parallel.cpp, traces kernels in train_trace.cpp and profiles in train_profile.cpp.
#include "trainer/cuda/train_cuda.hpp"

#include "trainer/cuda/train_run.hpp"

namespace ght::trainer {

namespace cuda_run {

namespace fs = std::filesystem;

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
  log.log_event({{"type", "mfu_formula"}, {"formula", mfu_formula_}, {"seed_formula", seed_formula_}});
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
  return model_->forward(b.inputs.data(), b.targets.data(), b.batch, b.seq_len).ce;
}


void CudaRun::finish(bool ok) {
  write_profile();  // a run that ended (or was stopped, or failed) before N steps
  if (ok) write_measurements();  // the medians of every step after the warm-up
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

}  // namespace cuda_run

TrainSummary train_cuda(const TrainConfig& cfg, const TrainRunOptions& run,
                        std::shared_ptr<dist::Communicator> comm) {
  GHT_EXPECTS(!run.trace_kernels || kernel_trace_built(),
              "--trace-kernels: this build has no kernel tracer (built without CUPTI: CUDA::cupti was not found at "
              "configure time)");
  GHT_EXPECTS(!run.trace_kernels || run.profile_steps >= 1,
              "--trace-kernels traces the last of the --profile-steps N steps: set profile_steps >= 1");
  TrainSession s(cfg, run, std::move(comm));  // before the GPU is touched: run directory, data
  cuda_run::CudaRun r(s);
  return r.go();
}

}  // namespace ght::trainer
