#pragma once
/**
 * @file kernel_trace.hpp
 * @brief A CUPTI activity tracer for one stretch of work (a training step): every kernel,
 * memcpy and memset that runs on the device while it is alive, attributed to the "op" that was
 * current on the launching thread. The GPU machine has no Nsight Systems; the CUPTI activity API
 * ships with the toolkit.
 *
 * Attribution: set_op(label) makes `label` the current op of the calling thread by swapping its
 * CUPTI external correlation id (kind CUSTOM0, one id per distinct label); CUPTI then tags each
 * CUDA API call, and through it the GPU work the call launched, with that id. Work launched with
 * no op set is labelled kNoOpLabel (kernel_breakdown.hpp). The ids are per thread: work a
 * worker thread launches (the optimizer's update thread) is labelled by a ThreadOp on it.
 *
 * One tracer at a time per process (CUPTI's buffer callbacks are process-wide). Records arrive
 * on a CUPTI thread into 8 MiB buffers; records CUPTI could not store are counted, not lost
 * silently (TraceWindow::dropped_records).
 *
 * Cost: while alive, CUPTI records every runtime/driver API call and every kernel (the kernels
 * still run concurrently). Nothing when no tracer exists.
 *
 * Builds without CUPTI (GHT_HAVE_CUPTI unset) keep the class; its constructor throws.
 */
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "alloc/tiered.hpp"
#include "trainer/cuda/kernel_breakdown.hpp"

namespace ght::trainer {

/// Whether this build can trace kernels (it was linked with CUPTI).
[[nodiscard]] bool kernel_trace_built();

class KernelTracer {
 public:
  /**
   * @brief Start recording on every device of the process. CUPTI's record buffers (32 of 8 MiB,
   * taken here, lent to CUPTI and returned as it delivers them) are host blocks of `alloc`, class
   * other, region "kernel_trace.cupti_buffers": the run's budgets and statistics see them. The
   * callbacks never allocate: CUPTI requests buffers from inside CUDA calls, the allocator's too.
   * When all 32 are lent, CUPTI drops records and counts them (TraceWindow::dropped_records).
   * @throws ght::logic_error when built without CUPTI or another tracer is alive;
   *         ght::cuda_error naming the CUPTI call and status when CUPTI refuses (e.g.
   *         CUPTI_ERROR_INSUFFICIENT_PRIVILEGES when profiling is not permitted)
   */
  explicit KernelTracer(std::shared_ptr<alloc::tiered_allocator> alloc);
  /// Stops recording and drops what was not collected (never throws).
  ~KernelTracer();
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;

  /// Attribute the calling thread's next CUDA work to `label` (counted as one call of it).
  /// For the thread that owns the tracer; worker threads use ThreadOp.
  void set_op(std::string_view label);

  /// While alive, the CUDA work its constructing thread launches is attributed to `label`
  /// (counted as one call). For a worker thread; it must end on that thread and before finish().
  class ThreadOp {
   public:
    ThreadOp(KernelTracer& tracer, std::string_view label);
    ~ThreadOp();
    ThreadOp(const ThreadOp&) = delete;
    ThreadOp& operator=(const ThreadOp&) = delete;

   private:
    bool pushed_ = false;
  };

  /// The activities' clock (CUPTI timestamp, ns), for the window's ends.
  [[nodiscard]] static std::uint64_t now_ns();

  /**
   * @brief Stop recording, flush CUPTI's buffers and return every activity with its op label,
   * plus the calls per op and the dropped-record count (window ends left 0 for the caller).
   * Synchronise the device first: work still running is not in it. Call once.
   * @throws ght::cuda_error when CUPTI fails
   */
  [[nodiscard]] std::vector<GpuActivity> finish(TraceWindow& window);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  [[nodiscard]] std::uint64_t label_id(std::string_view label);  // counts one call of it
};

}  // namespace ght::trainer
