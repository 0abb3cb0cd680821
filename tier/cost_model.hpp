#pragma once
/**
 * @file cost_model.hpp
 * @brief What a placement costs per training step.
 *
 * For every access of a region (plan.hpp, Access), per step:
 *  - region in HBM: GPU reads and writes cost nothing (HBM bandwidth is not modelled); CPU reads
 *    cross the link device -> host and CPU writes host -> device (memcpy numbers);
 *  - region on the host: GPU reads cross the link host -> device and GPU writes device -> host,
 *    at h2d_bps / d2h_bps (GpuPath::copy) or kernel_read_bps / kernel_write_bps
 *    (GpuPath::kernel); CPU reads and writes are host-memory traffic at host_triad_bps (which
 *    counts every stream, so bytes read + bytes written over it).
 * Bytes are multiplied by times_per_step and, for routed accesses, by the chance that the expert
 * receives a token. A bandwidth of 0 makes any traffic over it take infinitely long.
 *
 * Time for a set of link transfers: max(h2d seconds, d2h seconds, (h2d + d2h bytes) / bidir_bps)
 * (each direction alone, then both sharing the link; without bidir_bps the directions add up).
 *
 * Overlap: compute takes W = (step FLOPs + recompute FLOPs) / (GHT_ASSUMED_TFLOPS * 1e12) plus
 * the LM head's seconds (its FLOPs at GHT_ASSUMED_HEAD_TFLOPS). An
 * access with window fraction f can hide behind f*W; non-overlappable accesses have f = 0. For
 * each resource (link, host memory), with S(f) the time of its work whose fraction is <= f, the
 * exposed time is E = max over f of (S(f) - f*W), at least 0 (for one window this is the
 * familiar serial + max(0, overlappable - W)). The resources run concurrently:
 *   exposed = recompute seconds + max(E_link, E_host),   step = compute + exposed.
 * On Grace the link and host memory share LPDDR5X bandwidth; the step model does not charge
 * that (predict_update_split does, for the optimizer update).
 */
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tier/link.hpp"
#include "tier/plan.hpp"

namespace ght::tier {

// Bytes per parameter that an AdamW update moves: the one place for each figure.
inline constexpr std::uint64_t kMasterBytesPerParam = 4;  ///< fp32 master (m and v alike)
inline constexpr double kAdamStateBytes = 3 * kMasterBytesPerParam;  ///< master, m, v: read once, written once
inline constexpr double kUpdateWeightBytes = 2;  ///< the bf16 weight each update writes
inline constexpr double kHostGradBytes = 4;    ///< fp32 gradient: host accumulator, or HBM's
/// Bytes one AdamW update touches per parameter in the memory it runs on (host memory for CPU
/// AdamW, HBM for the device path): it reads the gradient (`grad_bytes`: 2 for bf16, 4 for fp32)
/// and master, m, v (`state_bytes`: 12 with fp32 m and v, 8 with bf16), and writes master, m, v
/// and the bf16 weight.
[[nodiscard]] constexpr double adamw_bytes_per_param(double grad_bytes, double state_bytes = kAdamStateBytes) {
  return grad_bytes + 2 * state_bytes + kUpdateWeightBytes;
}

/// Predicted link traffic of the gpu_link AdamW step for `params` parameters whose fp32 master,
/// m and v live on the host. Per parameter the kernel reads master, m, v (12 B, host -> device)
/// and writes them back (12 B, device -> host) through kernel access; it reads the gradient
/// (grad_bytes_per_param over the link: 0 when the gradient is in HBM, 4 when it reads the fp32
/// host accumulator) and writes the bf16 weight into HBM (no link traffic).
struct OptimizerLinkPrediction {
  double read_bytes = 0;      ///< host -> device
  double write_bytes = 0;     ///< device -> host
  double read_seconds = 0;    ///< read_bytes / kernel_read_bps
  double write_seconds = 0;   ///< write_bytes / kernel_write_bps
  double seconds = 0;         ///< both directions at once: max(read, write, total / bidir_bps)
};
/// `state_bytes_per_param`: master + m + v bytes (12 fp32; 8 with bf16 m and v).
[[nodiscard]] OptimizerLinkPrediction predict_optimizer_link(std::uint64_t params,
                                                             double grad_bytes_per_param,
                                                             const LinkNumbers& link,
                                                             double state_bytes_per_param = kAdamStateBytes);
/// predict_optimizer_link(...).seconds
[[nodiscard]] double predict_optimizer_link_seconds(std::uint64_t params,
                                                    double grad_bytes_per_param,
                                                    const LinkNumbers& link);

/**
 * @brief Splitting one update of host-resident state between the link and the host cores
 * (SuperOffload-style): a fraction f of the parameters is updated by CPU AdamW on the host cores,
 * the rest by the GPU kernel over the link (gpu_link), both at once.
 *
 * Per path, for N parameters (each path's own traffic, from the constants above):
 *  - gpu_link: link bytes of predict_optimizer_link (state 12 B each way, plus the fp32 host
 *    gradient 4 B host -> device where the gradient was streamed to the host); the same bytes
 *    are host-memory traffic, since the GPU reads and writes host DRAM.
 *  - cpu: CPU AdamW at cpu_params_per_s; over the link (memcpy) the fp32 gradient 4 B
 *    device -> host where it is in HBM, and the bf16 weight 2 B host -> device; host-memory
 *    traffic adamw_bytes_per_param(4) plus those link bytes (the copies land in and leave from
 *    pinned host staging).
 * Each of the three resources then takes a time linear in f:
 *    T_link(f) = (1 - f)·L_g + f·L_c         L_g, L_c: link seconds of all N on each path
 *    T_cpu(f)  = f·N / R                     R: CPU AdamW params/s
 *    T_mem(f)  = ((1 - f)·D_g + f·D_c) / B   D: host-memory bytes of all N on each path,
 *                                            B: host DRAM bytes/s shared by the two (x86: the
 *                                            link's DMA reads/writes the same DRAM; GH200: C2C
 *                                            and Grace share LPDDR5X)
 * and the update takes T(f) = max(T_link, T_cpu, T_mem). T is convex and piecewise linear, so
 * its minimum on [0, 1] is at an end or where two of the lines cross:
 *    f_ij = (X_j - X_i) / ((X_j - X_i) - (Y_j - Y_i))   with T_i(f) = (1 - f)·X_i + f·Y_i.
 * Without the memory bound that is the familiar closed form f* = L_g / (L_g - L_c + N/R) (link
 * time equals CPU time); the memory line can only move f* towards the path that moves fewer
 * host bytes. f* is clamped to [0, 1].
 *
 * Simplifications: both paths' link seconds add (each path's link_time, then summed: an upper
 * bound, since link_time of the summed traffic is never more); each gradient class is split
 * with the same f (moving streamed-gradient parameters to the CPU first would do slightly better,
 * as they save 4 more link bytes each). GHT_OPTIMIZER=split runs it: the optimizer assigns
 * whole regions with assign_update_split (plan.hpp), so the share it reaches is f to within the
 * largest region's size.
 */
struct UpdateSplitInput {
  std::uint64_t params_grad_hbm = 0;   ///< host-state parameters whose fp32 gradient is in HBM
  std::uint64_t params_grad_host = 0;  ///< ... whose gradient is in the fp32 host accumulator
  /// CPU AdamW rate; 0: host_bps / adamw_bytes_per_param(4) (its memory bound); no rate at all
  /// makes the cpu path impossible
  double cpu_params_per_s = 0;
  double host_bps = 0;  ///< shared host-memory limit; 0: link.host_triad_bps; neither: not charged
  double state_bytes_per_param = kAdamStateBytes;  ///< master + m + v (8 with bf16 m and v)
};
struct UpdateSplit {
  double cpu_fraction = 0;      ///< best f: share of the parameters updated by CPU AdamW
  double seconds = 0;           ///< T(f*)
  double link_seconds = 0, cpu_seconds = 0, memory_seconds = 0;  ///< each resource at f*
  double all_link_seconds = 0;  ///< T(0): every parameter over the link
  double all_cpu_seconds = 0;   ///< T(1): every parameter on the host cores
  std::string limit;            ///< resources at the maximum at f*, e.g. "link = cpu"
};
/// @throws ght::logic_error on a negative rate
[[nodiscard]] UpdateSplit predict_update_split(const UpdateSplitInput& in, const LinkNumbers& link);
/// The same model at a given share f in [0, 1] (each resource's time at f, T(f), the limit):
/// the prediction for a share the split is forced to (GHT_OPT_CPU_SHARE), or a sweep's point.
/// @throws ght::logic_error on a negative rate or f outside [0, 1]
[[nodiscard]] UpdateSplit evaluate_update_split(const UpdateSplitInput& in, const LinkNumbers& link,
                                                double cpu_fraction);
/// The CPU share a split update runs with: `requested` when it is in [0, 1], predict_update_split's
/// best share when it is -1 (GHT_OPT_CPU_SHARE's "auto").
/// @throws ght::config_error naming GHT_OPT_CPU_SHARE for any other value
[[nodiscard]] double resolve_update_cpu_share(double requested, const UpdateSplitInput& in,
                                              const LinkNumbers& link);

/// Link time of a set of transfers (see the file comment); inputs are the seconds each
/// direction takes alone and the bytes each way.
[[nodiscard]] double link_time(const LinkNumbers& link, double h2d_seconds, double d2h_seconds,
                               double h2d_bytes, double d2h_bytes);

/// One way of placing a region.
struct Placement {
  TierKind tier = TierKind::hbm;
  Mode mode = Mode::none;
  bool operator==(const Placement&) const = default;
};

/// The placements a region allows, smallest HBM footprint first.
[[nodiscard]] std::vector<Placement> placements(const Region& r);
/// The mode a region gets on a tier (recompute only when asked for).
[[nodiscard]] Mode default_mode(const Region& r, TierKind t);
[[nodiscard]] std::uint64_t hbm_bytes(const Region& r, Placement p);
[[nodiscard]] std::uint64_t host_bytes(const Region& r, Placement p);
/// The access list in effect on a tier (host_access when on the host and given).
[[nodiscard]] const std::vector<Access>& accesses_on(const Region& r, TierKind t);
/// 1 - (1 - routing_frequency)^routing_tokens for routed accesses of expert regions, else 1.
[[nodiscard]] double routing_factor(const Region& r, const Access& a);

/// Seconds per step that access `a` of `r` adds to the backward: its backward_hbm_bytes, times per
/// step and routing, at backward_exposed of link.hbm_bps (0 without them).
[[nodiscard]] double backward_exposed_seconds(const Region& r, const Access& a, const LinkNumbers& link);

/// The backward's exposed HBM passes of `regions` with every region in HBM (their `access`): what
/// the cost model adds to the backward when the gradients accumulate there (the auto policy's
/// calibration).
[[nodiscard]] double hbm_accumulate_seconds(const std::vector<Region>& regions, const LinkNumbers& link);

/// Per-step work one placement of one region adds, split by overlap window (sparse: only the
/// windows it uses, by index into CostModel::windows(), ascending).
struct Load {
  struct Bucket {
    double h2d_bytes = 0, d2h_bytes = 0;  ///< link bytes each way
    double h2d_s = 0, d2h_s = 0;          ///< link seconds each way, alone
    double host_bytes = 0, host_s = 0;    ///< host-memory traffic
    double hbm_s = 0;                     ///< HBM passes besides the compute (Access::hbm_pass)
    double accumulate_s = 0;              ///< the backward's exposed HBM passes (Access::backward_exposed)
  };
  std::vector<std::pair<int, Bucket>> parts;
  double recompute_flops = 0;

  /// The bucket of window `index`, created when absent.
  Bucket& at(int index);
  /// this += sign * o
  void add(const Load& o, double sign = 1.0);
};

/// Per-step times of a total load.
struct StepTime {
  double h2d_bytes = 0, d2h_bytes = 0, h2d_seconds = 0, d2h_seconds = 0, link_seconds = 0;
  double host_bytes = 0, host_seconds = 0;
  /// The HBM passes (Access::hbm_pass), on the critical path but not in exposed_seconds or
  /// step_seconds: placement does not trade them against the link (see plan.cpp, predict_with()).
  double hbm_pass_seconds = 0;
  /// The backward's exposed HBM passes (Access::backward_exposed): part of compute_seconds.
  double accumulate_seconds = 0;
  double compute_seconds = 0, recompute_seconds = 0, window_seconds = 0;
  double exposed_link = 0, exposed_host = 0;
  double exposed_seconds = 0, step_seconds = 0;
};

/// The cost model for one set of regions, link numbers and step size.
class CostModel {
 public:
  /// @param regions used to collect the distinct window fractions
  /// @param head_seconds compute besides step_flops (the LM head at its own rate): in the window
  CostModel(LinkNumbers link, double step_flops, double assumed_tflops,
            const std::vector<Region>& regions, double head_seconds = 0);

  /// Window fractions, ascending; windows()[0] == 0 (the critical path).
  [[nodiscard]] const std::vector<double>& windows() const { return windows_; }
  [[nodiscard]] const LinkNumbers& link() const { return link_; }
  [[nodiscard]] Load zero() const;
  /// The load of `r` placed as `p`; with `only_what` set, only accesses with that purpose tag.
  [[nodiscard]] Load load(const Region& r, Placement p, std::string_view only_what = {}) const;
  [[nodiscard]] StepTime evaluate(const Load& total) const;

  // Additive scores the greedy orders by (seconds; infinite bandwidth needs give +inf).
  [[nodiscard]] double total_seconds(const Load& l) const;      ///< every second of work
  [[nodiscard]] double serial_seconds(const Load& l) const;     ///< critical path + recompute
  [[nodiscard]] double unhidable_seconds(const Load& l) const;  ///< sum of (1 - f) * seconds

 private:
  [[nodiscard]] int window_index(const Access& a) const;
  LinkNumbers link_;
  double step_flops_, flops_per_second_, head_seconds_;
  std::vector<double> windows_;
};

}  // namespace ght::tier
