#pragma once
/**
 * @file adamw.hpp
 * @brief ght::optimizer::AdamW: AdamW over tiered state, one semantics on three paths.
 *
 * Each region (a flat group of parameters, e.g. one layer's attention or one expert) has fp32
 * master, m and v buffers from the run's alloc::tiered_allocator (the plan installed there
 * decides each region's tier; requests carry the region's name and class master/adam_m/adam_v),
 * a bf16 compute weight and a gradient (bf16 or fp32, in HBM or in the host accumulator).
 * GHT_OPT_STATE=bf16 keeps m and v in bf16 instead (opt-in; rounding in adamw_kernels.hpp): every
 * path, the dma slots and the undo arena then move and hold 2 bytes per moment, not 4.
 *
 * Paths (GHT_OPTIMIZER=auto|gpu_link|cpu|device, per region):
 *   device    state in HBM; the GPU kernel (adamw_gpu) runs on the optimizer's link stream.
 *   gpu_link  state in host memory; the same kernel reads and writes it in place over the link
 *             (mapped pinned memory on PCIe, system memory on C2C) and writes bf16 weights to HBM.
 *   cpu       state in host memory; OpenMP AdamW on pinned threads. Device gradients come down
 *             through double-buffered pinned staging, bf16 weights go up from pinned staging,
 *             both asynchronously and overlapped with the host computation.
 *   auto      device when the region's state landed in HBM, gpu_link when on the host and a GPU
 *             exists, cpu without a GPU.
 *   split     auto, then the host-state regions are divided between gpu_link and cpu
 *             (tier::assign_update_split, in region order) at a CPU share (AdamWOptions::cpu_share,
 *             GHT_OPT_CPU_SHARE; default tier::predict_update_split's best), and both run at once.
 *
 * The cpu path runs on a host thread of the optimizer's own (the cpu worker) wherever a region's
 * gradients or weights are in HBM (AdamWOptions::cpu_worker): update_region of such a region
 * hands it over and returns at once, so the host cores compute while the driving thread
 * launches (and, on a full driver queue, blocks in) the GPU paths. The worker takes its
 * jobs in order; its gradient downloads and weight uploads have their own streams, and it
 * records the region's chunk events. Because those events exist only once the worker has
 * recorded them, chunk_event and region_event of a cpu region wait on the host until it has
 * (for the update most recently handed over); everything that reads or writes state
 * (begin_step's successors, synchronize, save_state, load_state, set_grad, set_weight,
 * checkpoints) waits for the worker first, so the semantics are those of a synchronous update.
 *
 * Every step: the global gradient norm over all regions and tiers (Σg² in double per tier,
 * deterministic, combined in double, reported as a float), clip coefficient
 * min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_, and a non-finite guard:
 * when the norm is NaN or Inf nothing is written (master, m, v, weights and the step count keep
 * every byte) and OptimizerStats::steps_skipped_nonfinite is incremented.
 *
 * Speculation (host state): speculate_region() updates a region as soon as its
 * gradients are final, before the global norm is known, assuming clip coefficient 1 and finite
 * gradients. It first saves the chunk's master, m, v and bf16 weight: gpu_link regions into an
 * HBM undo arena (GHT_OPT_SPECULATE bytes), cpu regions into a host undo arena
 * (GHT_OPT_SPECULATE_HOST bytes; the worker downloads the gradients, saves, updates and uploads
 * the weights); both off by default. begin_step() then validates: when the step is taken
 * unclipped at the same lr, the speculative result stands; otherwise the chunk is recomputed
 * from the saved copy with the true coefficient (or restored, when the step is skipped) and
 * written back. Either way every byte equals the non-speculative step's.
 *
 * GPU work is launched per chunk (GHT_OPT_CHUNK bytes of fp32 master per chunk; at most 4Mi
 * parameters per chunk in dma mode, so the copy pipeline fills quickly) and an event is
 * recorded after each chunk, so consumers (the next forward) can wait for just the layers they
 * need. update_all launches the chunks of in-place regions (device, gpu_link zero-copy) up to
 * GHT_OPT_BATCH at a time in one kernel (AdamWBatch) and records their events after it. Its
 * streams have the device's lowest priority, and the gpu_link kernel occupies at most
 * link_kernel_sms() SMs (GHT_OPT_KERNEL_SMS; derived from the link and HBM rates), so that a
 * link-bound update leaves the rest of the GPU to compute.
 *
 * Threads: one thread at a time drives an AdamW; the cpu worker is internal. chunk_event and
 * region_event may also be called from other threads while it is driven (a consumer waiting for
 * a region, a timing thread).
 */
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "alloc/tiered.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "tier/types.hpp"

struct CUstream_st;
struct CUevent_st;

namespace ght::optimizer {

enum class Path { gpu_link, cpu, device };
enum class PathChoice { automatic, gpu_link, cpu, device, split };
/// How the gpu_link path reaches host state (GHT_OPT_LINK_MODE; auto = zero_copy on c2c, dma on pcie).
///   zero_copy  the kernel reads and writes master, m and v in place through mapped pointers
///   dma        copy engines stream each chunk's master, m and v into one of three HBM slots
///              and back (both directions at once), the kernel updates the slot in HBM
enum class LinkMode { zero_copy, dma };

[[nodiscard]] std::string_view to_string(Path p) noexcept;
[[nodiscard]] std::string_view to_string(PathChoice p) noexcept;
[[nodiscard]] std::string_view to_string(LinkMode m) noexcept;
/// "auto|gpu_link|cpu|device|split" (case-insensitive); throws ght::config_error naming the text.
[[nodiscard]] PathChoice parse_path_choice(std::string_view text);
/// The choice from GHT_OPTIMIZER.
[[nodiscard]] PathChoice path_choice_from_config();
/// The mode from GHT_OPT_LINK_MODE.
[[nodiscard]] LinkMode link_mode_from_config();
/// HBM the dma mode reserves (three slots of master, m and v chunks) when the largest region
/// has `largest_region` parameters and m and v are of type `st`: what a plan must leave free
/// once any state is on the host.
[[nodiscard]] std::size_t dma_slot_bytes(std::size_t largest_region, StateType st);

/// One state buffer and how each side reaches it (a view of memory the optimizer owns).
struct StateBuffer {
  void* host = nullptr;    ///< CPU-dereferenceable address; null for HBM
  void* device = nullptr;  ///< GPU-dereferenceable address; null when no GPU can reach it
  TierKind tier = TierKind::host;
};

/// A flat group of parameters updated together.
struct Region {
  std::string name;
  std::size_t n = 0;          ///< parameters
  bool weight_decay = true;   ///< false for norms and biases
  void* weight = nullptr;     ///< (n) bf16 compute weights, HBM (or host memory without a GPU); may be null
  const void* grad = nullptr; ///< (n) gradients, HBM or host memory (the accumulator); may be set later
  GradType grad_type = GradType::bf16;
  /// Index of element 0 within the parameter tensor `name` names. A region that holds a slice
  /// of a tensor (ZeRO-1 splits tensors over ranks) gives its offset here, so that the bf16
  /// state's rounding stream (keyed by the name, drawn at first + i) rounds as the whole tensor's.
  std::size_t first = 0;
};

struct AdamWOptions {
  AdamWHyper hyper;
  std::optional<PathChoice> path;  ///< unset: GHT_OPTIMIZER
  std::optional<LinkMode> link_mode;  ///< unset: GHT_OPT_LINK_MODE
  std::optional<StateType> state_type;  ///< element type of m and v; unset: GHT_OPT_STATE
  std::size_t chunk_elems = 0;     ///< parameters per GPU chunk; 0: GHT_OPT_CHUNK / 4
  std::size_t staging_bytes = 0;   ///< cpu path staging bytes per slot; 0: GHT_STAGING_BYTES
  int cpu_threads = 0;             ///< 0: GHT_CPU_THREADS / cores of the host NUMA node
  /// HBM undo arena for speculative updates of gpu_link regions; unset: GHT_OPT_SPECULATE; 0: no
  /// speculation. Reserved at construction when some region is gpu_link, capped at free HBM minus
  /// GHT_HBM_HEADROOM (speculation is off when less than 1 MiB would remain).
  std::optional<std::size_t> speculate_bytes;
  /// Several processes that each hold a part of one model's regions (ZeRO-1): called in
  /// begin_step with this optimizer's Σ g² (double) and returns the Σ g² over every part, the
  /// same value on every process. The norm, clipping and the non-finite skip then follow the
  /// whole model. Unset: this optimizer's regions are the whole model.
  std::function<double(double)> combine_sumsq;
  /// Host undo arena for speculative updates of cpu regions; unset: GHT_OPT_SPECULATE_HOST; 0:
  /// none. Reserved at construction when some region is cpu, capped at the allocator's largest
  /// free host block (off below 1 MiB).
  std::optional<std::size_t> speculate_host_bytes;
  /// PathChoice::split: share of the host-state parameters on the cpu path, in [0, 1], or -1 for
  /// the cost model's best; unset: GHT_OPT_CPU_SHARE.
  std::optional<double> cpu_share;
  /// SMs the gpu_link kernel may occupy (> 0); unset or 0: GHT_OPT_KERNEL_SMS, whose 0 derives it
  /// from the link and HBM rates (link_kernel_sms in adamw_kernels.hpp).
  int kernel_sms = 0;
  /// Chunks of in-place GPU regions (device, gpu_link zero-copy) that update_all launches
  /// together, in [1, kAdamWBatchSpans]; 0: GHT_OPT_BATCH. 1: one launch per chunk.
  int batch_spans = 0;
  /// The device path's kernels on their own stream beside the gpu_link kernels, the SMs split
  /// between them (split_update_sms); unset: GHT_OPT_SIDE_BY_SIDE.
  std::optional<bool> side_by_side;
  /// Where cpu regions are updated. Unset: on the cpu worker when their gradients or weights are
  /// in HBM (there is GPU work to overlap), on the calling thread when both are in host memory
  /// (update_region then returns with the update done, as a host-only caller expects). true:
  /// every cpu region on the worker (asynchronous: leave gradients, weights and state alone
  /// until synchronize()); false: every one on the calling thread.
  std::optional<bool> cpu_worker;
};

/// What speculate_region did.
enum class Speculation {
  done,        ///< launched; begin_step validates it
  ineligible,  ///< this region cannot be speculated (device path; gpu_link without a GPU or with
               ///< gradients in host memory; already speculated in this step)
  no_room,     ///< its path's undo arena cannot hold this region (or that arena is off)
};

/// What one step did.
struct StepResult {
  bool taken = false;       ///< false: skipped by the non-finite guard
  double grad_norm = 0;     ///< global gradient norm before clipping (fp32-rounded)
  double clip_coef = 1;     ///< multiplier applied to every gradient
  std::int64_t step = 0;    ///< steps taken so far (bias-correction t)
  std::size_t speculated_params = 0;  ///< parameters updated ahead of begin_step
  bool speculation_undone = false;    ///< those were recomputed or restored (clipped, skipped, lr changed)
};

struct OptimizerStats {
  std::int64_t steps_taken = 0;
  std::int64_t steps_skipped_nonfinite = 0;  ///< the trainer logs this
  double last_grad_norm = 0;
  double last_clip_coef = 1;
  std::int64_t steps_speculated = 0;     ///< steps with at least one speculated region
  std::int64_t speculations_undone = 0;  ///< of those, steps whose speculation was undone
};

class AdamW {
 public:
  /**
   * @brief Allocate master, m and v for every region (zeroed) and pick each region's path.
   * @param alloc every byte the optimizer holds (state, dma slots, staging, the undo arena,
   *        norm scratch) comes from it; null: alloc::make_default_tiered_allocator(). State
   *        requests prefer HBM for the `device` choice (no spill), the host for `gpu_link` and
   *        `cpu`, and leave `auto` to the installed plan (or the class defaults: host).
   * @throws ght::out_of_memory (typed, naming the region and class) when no tier has room
   * @throws ght::logic_error for an empty or duplicate region, a path the machine cannot run
   *         (gpu_link/device without a GPU, cpu with state only in HBM)
   */
  explicit AdamW(std::vector<Region> regions, AdamWOptions opts = {},
                 std::shared_ptr<alloc::tiered_allocator> alloc = nullptr);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  [[nodiscard]] std::size_t num_regions() const;
  [[nodiscard]] const Region& region(std::size_t r) const;
  [[nodiscard]] Path path(std::size_t r) const;
  /// How a gpu_link region reaches its state (zero_copy for other paths).
  [[nodiscard]] LinkMode link_mode(std::size_t r) const;
  /// cls: TensorClass::master (fp32), adam_m or adam_v (elements of state_type()).
  [[nodiscard]] const StateBuffer& state(std::size_t r, TensorClass cls) const;
  /// Element type of every region's m and v.
  [[nodiscard]] StateType state_type() const;
  [[nodiscard]] const AdamWHyper& hyper() const;
  /// Point region r at a new gradient buffer (waits for pending updates first).
  void set_grad(std::size_t r, const void* grad, GradType type);
  /// Point region r's bf16 weight output at a new buffer, same place rules as Region::weight
  /// (waits for pending updates first). The trainer's delayed update alternates two.
  void set_weight(std::size_t r, void* weight);
  /// AdamWHyper::weight_extrapolation for the steps begun from now on (the delayed update turns
  /// its prediction on when its exact warm-up ends).
  void set_weight_extrapolation(double x);

  /// master = float(weight) for every region with a weight (init from a bf16 checkpoint).
  void init_master_from_weights();
  /// Copy host arrays (n floats each; null = leave that buffer) into region r's state. With
  /// bf16 state m and v are rounded to nearest even: exact for values save_state gave.
  void load_state(std::size_t r, const float* master, const float* m, const float* v);
  /// Copy region r's state into host arrays (null = skip; bf16 m and v widened exactly). Waits
  /// for pending updates.
  void save_state(std::size_t r, float* master, float* m, float* v) const;
  [[nodiscard]] std::int64_t step_count() const;
  void set_step_count(std::int64_t t);  ///< for resume

  /**
   * @brief Phase 1: global grad norm, clip coefficient and the non-finite decision.
   * @param lr learning rate of this step
   * @param producer stream whose queued work writes the gradients (null: legacy default stream)
   * Blocks until the norm is known.
   */
  StepResult begin_step(double lr, CUstream_st* producer = nullptr);
  /// Phase 2: update region r (GPU paths: enqueue chunks on stream(); cpu path: hand it to the
  /// cpu worker, which downloads the gradients, computes and uploads the weights). Its chunk
  /// events are recorded even when the step is skipped.
  void update_region(std::size_t r);
  /// update_region for every region not yet updated in this step: the cpu regions first (in
  /// order: the worker starts at once), then the GPU paths in order (their launches may block
  /// the caller on a full driver queue while the worker computes). `launched(r)`, when given, is
  /// called on the calling thread as soon as region r's events are recorded (its launches are
  /// queued, or it was handed to the worker): from then on another thread may wait for
  /// region_event(r), while this one goes on launching the rest (the trainer queues the next
  /// forward unit by unit that way).
  void update_all(const std::function<void(std::size_t)>& launched = {});
  /**
   * @brief Update region r now, before begin_step, as if the step were taken unclipped at `lr`
   * (see the file comment); its chunk events are recorded. Call it once the region's gradients
   * are final in `producer`'s queue; begin_step (which must follow, with the same producer
   * order) validates it, and update_region(r) is then a no-op. Bitwise exact either way.
   */
  Speculation speculate_region(std::size_t r, double lr, CUstream_st* producer);
  /// Undo every speculated region of the open step (bytes restored exactly); nothing if none.
  /// save_state refuses to run while a speculation waits for begin_step.
  void cancel_speculation();
  /// Bytes of the HBM undo arena of gpu_link regions (0: their speculation is off).
  [[nodiscard]] std::size_t speculate_capacity() const;
  /// Bytes of the host undo arena of cpu regions (0: their speculation is off).
  [[nodiscard]] std::size_t speculate_host_capacity() const;
  /// PathChoice::split: the CPU share it ran the assignment with (the resolved GHT_OPT_CPU_SHARE);
  /// unset for the other choices.
  [[nodiscard]] std::optional<double> split_cpu_share() const;
  /// SMs the gpu_link kernel may occupy (0 without a GPU).
  [[nodiscard]] int link_kernel_sms() const;

  /// begin_step, then update_all.
  StepResult step(double lr, CUstream_st* producer = nullptr);
  /// Wait until every launched update and weight copy has finished (the cpu worker's too); an
  /// error the worker hit is rethrown here (and by every later wait: the optimizer is unusable).
  void synchronize() const;

  /// The optimizer's link stream (null without a GPU).
  [[nodiscard]] CUstream_st* stream() const;
  [[nodiscard]] std::size_t num_chunks(std::size_t r) const;
  /// Recorded after chunk c of region r is written (weights included). Null without a GPU. For a
  /// cpu region, waits on the host until the worker has recorded the region's events of the
  /// update last handed to it (rethrowing the worker's error); callable from any thread.
  [[nodiscard]] CUevent_st* chunk_event(std::size_t r, std::size_t c) const;
  [[nodiscard]] CUevent_st* region_event(std::size_t r) const;

  [[nodiscard]] const OptimizerStats& stats() const;
  /// The allocator the optimizer's memory comes from.
  [[nodiscard]] alloc::tiered_allocator& allocator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ght::optimizer
