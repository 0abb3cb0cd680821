#pragma once
/**
 * @file kernel_breakdown.hpp
 * @brief Per-op GPU time of one traced training step, from a list of GPU activities (kernels,
 * copies, memsets) that each carry the label of the op that launched them. Pure C++: the CUPTI
 * tracer (kernel_trace.hpp) produces the activities; this groups them and compares each op with
 * its cost (op_costs.hpp) and the roofline, so it is testable without a GPU.
 *
 * Definitions (nanosecond timestamps on one clock, intervals clipped to the window):
 *  - gpu time of an op: the sum of its activities' durations (streams that overlap count twice);
 *  - busy time of an op: the length of the union of its activities' intervals (wall time during
 *    which at least one of them ran); achieved TFLOP/s and GB/s use it, so an op spread over
 *    several streams is not charged twice;
 *  - share of GPU time: gpu / Σ gpu over ops (sums to 1); share of the window: busy / window;
 *  - idle: window − the union of every activity's interval, on all streams together.
 */
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "trainer/cuda/op_costs.hpp"

namespace ght::trainer {

/// One GPU activity of the traced window.
struct GpuActivity {
  enum class Kind { kernel, memcpy, memset };
  Kind kind = Kind::kernel;
  std::string op;    ///< label of the op that launched it; "" when launched outside any op
  std::string name;  ///< kernel name (demangled), or "memcpy HtoD", "memset", ...
  std::uint32_t stream = 0;
  std::uint64_t start_ns = 0, end_ns = 0;
  std::uint64_t bytes = 0;  ///< copies and memsets
};

/// What a trace gives besides the activities.
struct TraceWindow {
  std::uint64_t start_ns = 0, end_ns = 0;  ///< the step, on the activities' clock
  std::map<std::string, std::int64_t, std::less<>> op_calls;  ///< times each op label was entered
  std::uint64_t dropped_records = 0;  ///< activity records the tracer lost (buffers full)
};

/// One op label, summed over layers and micro-batches.
struct OpTime {
  std::string op;
  std::int64_t calls = 0;             ///< times the op was entered (0: not known to the trace)
  std::int64_t kernels = 0, copies = 0;  ///< copies: memcpy and memset activities
  double gpu_ms = 0, busy_ms = 0;
  double share_gpu = 0, share_window = 0;
  double flops = 0, bytes = 0;  ///< whole step (cost per call × calls); 0: no formula
  double tflops = 0, gbps = 0;  ///< achieved over busy_ms; 0 where the formula is missing
  [[nodiscard]] bool has_flops() const { return flops > 0 && busy_ms > 0; }
  [[nodiscard]] bool has_bytes() const { return bytes > 0 && busy_ms > 0; }
};

/// One kernel (or copy) name, over the whole step.
struct KernelTime {
  std::string name;
  std::string top_op;  ///< the op in which this kernel spent the most time
  std::int64_t count = 0;
  double gpu_ms = 0, share_gpu = 0;
};

struct KernelBreakdown {
  double window_ms = 0, gpu_ms = 0, busy_ms = 0, idle_ms = 0;
  std::int64_t kernels = 0, copies = 0;
  std::uint64_t dropped_records = 0;
  std::vector<OpTime> ops;              ///< by gpu_ms, largest first
  std::vector<KernelTime> top_kernels;  ///< by gpu_ms, largest first

  /// Everything, with the definitions and the roofline constants.
  [[nodiscard]] nlohmann::ordered_json json() const;
  /// A header line, the op table (sorted by time) and the top-kernel table.
  [[nodiscard]] std::string markdown() const;
};

/// Label of activities launched outside any op.
inline constexpr const char* kNoOpLabel = "(outside any op)";

/**
 * @brief Group `acts` by op and compare with `costs` (cost per call; ops missing there get no
 * formula). Activities are clipped to the window; when the window is empty it spans them.
 * @param top_kernels how many kernel names to list
 */
[[nodiscard]] KernelBreakdown make_kernel_breakdown(std::span<const GpuActivity> acts, const TraceWindow& window,
                                                    const std::map<std::string, OpCost, std::less<>>& costs,
                                                    std::size_t top_kernels = 15);

}  // namespace ght::trainer
