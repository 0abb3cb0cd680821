// The CUDA run's update scheduling: the delayed update's buffers and their rotation, the partial
// delay's switch to fresh weights, the update and timing threads.
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

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
// same with 8 SMs left free as with none (q24b at 262k). bench/NOTES.md, GHT_OPT_SM_RESERVE.
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
    // A traced step's update, labelled on this thread (synchronize joins it before the trace ends).
    std::optional<KernelTracer::ThreadOp> op;
    if (tracer_) op.emplace(*tracer_, kOpUpdate);
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

}  // namespace ght::trainer::cuda_run
