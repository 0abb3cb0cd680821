#pragma once
// Internal: the state of an AdamW, shared by adamw.cpp (construction, regions, the step),
// adamw_path_choice.cpp (each region's path, the split), adamw_state.cpp (state precision),
// adamw_device.cpp (in-place GPU updates), adamw_link.cpp (gpu_link dma), adamw_speculate.cpp
// (speculation) and adamw_cpu_path.cpp (the cpu worker and the cpu path's jobs).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "alloc/block.hpp"
#include "optimizer/adamw.hpp"

namespace ght::optimizer::detail {

// dma mode: parameters per chunk (16 MiB per state array per slot) and slots in flight (one
// being filled, one updated, one drained).
inline constexpr std::size_t kDmaChunk = std::size_t{1} << 22;
inline constexpr int kDmaSlots = 3;
/// Elements every chunk of a region is a multiple of: 64 (16-byte aligned vectors of fp32 and
/// bf16), and whole q8 blocks.
[[nodiscard]] constexpr std::size_t chunk_granule(StateType st) noexcept {
  return state_granule(st) > 64 ? state_granule(st) : 64;
}

/// The tensor classes of the state arrays (0 master, 1 m, 2 v).
inline constexpr TensorClass kStateClass[3] = {TensorClass::master, TensorClass::adam_m,
                                               TensorClass::adam_v};

/// Bytes of n elements of state buffer i (0 master, 1 m, 2 v).
[[nodiscard]] inline std::size_t array_bytes(int i, StateType st, std::size_t n) {
  return i == 0 ? n * sizeof(float) : state_bytes(st, n);
}

/// x rounded down to a multiple of m, at least m.
[[nodiscard]] inline std::size_t round_down(std::size_t x, std::size_t m) { return std::max(m, x / m * m); }

/// How each side reaches a state block (adamw_state.cpp).
[[nodiscard]] StateBuffer state_view(const alloc::unique_block& b, bool gpu);

/// dma mode's slots (adamw_link.cpp): parameters per slot, bytes of one slot, HBM of all slots.
[[nodiscard]] std::size_t dma_chunk_params(std::size_t largest_region, StateType st);
[[nodiscard]] std::size_t dma_slot_stride(std::size_t chunk, StateType st);
[[nodiscard]] std::size_t dma_slots_bytes(std::size_t chunk, StateType st);
/// Whether dma mode can update a region with these state arrays: at least one is on the host, and
/// each is either a host array the copy engines read (a CPU address) or an HBM array the kernel
/// updates in place.
[[nodiscard]] bool dma_reachable(const StateBuffer (&st)[3]);

#ifdef GHT_HAVE_CUDA
/// A stream at the device's lowest priority, for the optimizer's work (adamw.cpp).
[[nodiscard]] CUstream_st* make_stream();
#endif

/// A CUDA event that several jobs wait on; it lives until the last of them is done (null
/// without a GPU).
using SharedEvent = std::shared_ptr<CUevent_st>;

/// One piece of cpu-path work, done by the worker in the order handed over.
struct CpuJob {
  enum class Kind {
    update,     ///< the plain update (gradients down, AdamW, weights up)
    speculate,  ///< save the state and weights into the host undo arena, then update
    redo,       ///< put the saved state back, then update with this step's scalars
    restore,    ///< put the saved state and weights back (a skipped step, or a cancel)
    mark,       ///< a skipped step: only record the region's events
  };
  Kind kind = Kind::update;
  std::size_t region = 0;
  StepScalars k;                      ///< update, speculate, redo
  std::vector<unsigned char*> saves;  ///< per chunk: its undo copy in the host arena
  SharedEvent ready;                  ///< the producer's gradients are final (null: no wait)
  std::uint64_t ticket = 0;           ///< set by CpuWorker::push, increasing
};

/**
 * The cpu path's host thread. Jobs run one after another in the order pushed; push returns at
 * once. wait(t) returns once job t (and with it every earlier one) is done. A job that throws
 * makes the worker failed: later jobs are dropped, and waiting for it or any later job (drain
 * included) rethrows its error, as does every later push.
 */
class CpuWorker {
 public:
  /// Peek at the job after the running one (null when none is queued yet): for prefetching.
  using Peek = std::function<const CpuJob*()>;
  using Run = std::function<void(const CpuJob&, const Peek&)>;

  /// Starts the thread; it makes `device` current first (-1: no GPU).
  CpuWorker(int device, Run run);
  /// Finishes the job in progress, drops the rest and joins.
  ~CpuWorker();
  CpuWorker(const CpuWorker&) = delete;
  CpuWorker& operator=(const CpuWorker&) = delete;

  std::uint64_t push(CpuJob job);
  void wait(std::uint64_t ticket) const;
  void drain() const;

 private:
  void loop(int device);
  Run run_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<CpuJob> queue_;
  std::uint64_t pushed_ = 0, done_ = 0;
  std::exception_ptr error_;
  std::uint64_t failed_ = 0;  // the ticket whose job failed
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ght::optimizer::detail

namespace ght::optimizer {

struct AdamW::Impl {
  struct RegionState {
    Region desc;
    Path path = Path::cpu;
    StateBuffer st[3];              // master, m, v: views of `mem`
    alloc::unique_block mem[3];
    std::uint64_t key = 0;          // round_key of the name: the bf16 state's rounding stream
    std::size_t chunk = 0;          // parameters per chunk (and per event)
    std::size_t chunks = 1;
    bool grad_on_device = false;
    const void* grad_dev = nullptr;  // GPU address of the gradient (GPU paths)
    bool weight_on_device = false;
    void* weight_dev = nullptr;      // GPU address of the weight (GPU paths, cpu upload)
    bool staged = false;             // cpu path through staging
    bool dma = false;                // gpu_link path in dma mode
    bool updated = false;            // in the current step
    bool speculated = false;         // updated ahead of begin_step, not yet validated
    bool done_ahead = false;         // speculated and settled by begin_step: update_region skips it
    std::vector<unsigned char*> spec_saves;  // cpu path, speculated: each chunk's undo copy
    std::vector<CUevent_st*> events;
  };

  AdamWOptions opts;
  std::shared_ptr<alloc::tiered_allocator> alloc;
  std::vector<RegionState> regions;
  bool gpu = false;
  int device = -1;
  StateType state_type = StateType::fp32;
  std::size_t chunk_elems = 0;
  std::size_t staging_bytes = 0;
  std::optional<double> split_share;  // PathChoice::split: the resolved CPU share
  int link_sms = 0;                   // SMs the gpu_link kernel may occupy
  int device_sms = 0;                 // the GPU's SMs
  bool side_by_side = false;          // AdamWOptions::side_by_side or GHT_OPT_SIDE_BY_SIDE
  // The gpu_link kernels' SMs in this update while the device kernels take the rest, side by side
  // (split_sms_for_update); 0 outside such an update: each path on its own width.
  int split_link_sms = 0;
  int batch_spans = 1;                // chunks per AdamWBatch launch in update_all (GHT_OPT_BATCH)

  LinkMode link_mode = LinkMode::zero_copy;
  // Every stream at the device's lowest priority (make_stream).
  CUstream_st* link = nullptr;      // GPU updates of gpu_link regions (state on the host)
  // GPU updates of device regions (state in HBM): beside `link`, so that they run while the dma
  // pipeline waits on the copy engines.
  CUstream_st* hbm = nullptr;
  CUstream_st* down = nullptr;      // dma state write-back
  CUstream_st* up = nullptr;        // dma state reads
  // Gradient norm. Not `link`: there it would queue behind speculative updates (and a previous
  // update), and begin_step, which reads the norm on the host, would wait for them.
  CUstream_st* norm = nullptr;
  CUstream_st* cpu_down = nullptr;  // cpu path: gradient downloads (the worker's)
  CUstream_st* cpu_up = nullptr;    // cpu path: weight uploads and the regions' events (the worker's)
  CUevent_st* produced = nullptr;
  CUevent_st* step_barrier = nullptr;
  alloc::unique_block dma_mem;      // per slot: (dma_chunk) fp32 master, then m and v (bytes(1, dma_chunk) each); HBM
  std::size_t dma_chunk = detail::kDmaChunk;  // parameters per slot: kDmaChunk, or the largest region
  CUevent_st* dma_in[detail::kDmaSlots] = {};
  CUevent_st* dma_updated[detail::kDmaSlots] = {};
  CUevent_st* dma_free[detail::kDmaSlots] = {};
  unsigned dma_next = 0;
#ifdef GHT_HAVE_CUDA
  std::unique_ptr<DeviceSumsq> sumsq;
#endif

  // ---- the cpu path (adamw_cpu_path.cpp) ----
  std::unique_ptr<detail::CpuWorker> worker;  // while some region is on it (ensure_worker)
  // Per region: the ticket of the last job handed to the worker (read by region_event on any thread).
  std::unique_ptr<std::atomic<std::uint64_t>[]> cpu_ticket;
  detail::SharedEvent step_ready;  // begin_step's point in the producer: the cpu jobs of the step wait for it
  alloc::unique_block staging[2];  // host (pinned where the link needs it)
  CUevent_st* grad_ready[2] = {nullptr, nullptr};
  CUevent_st* weight_sent[2] = {nullptr, nullptr};
  // The worker's own bookkeeping (touched by the worker thread only): which job's chunk each
  // staging slot holds, the slot the next chunk takes, and the jobs whose ready event each of
  // its streams already waits for.
  std::uint64_t slot_ticket[2] = {0, 0};
  std::size_t slot_chunk[2] = {0, 0};
  int next_slot = 0;
  std::uint64_t down_waited = 0, up_waited = 0;

  // Speculation: per speculated gpu_link chunk, the master, m, v and bf16 weight it overwrote,
  // in HBM; cpu regions keep theirs in the host arena (RegionState::spec_saves).
  struct SpecChunk {
    std::size_t region = 0, chunk = 0, off = 0, count = 0;
    unsigned char* save = nullptr;  // master, m, v (spec_pad(count) elements each, 16-byte aligned), then count bf16
  };
  alloc::unique_block spec_arena;
  std::size_t spec_cap = 0, spec_used = 0;
  alloc::unique_block spec_host;  // the host undo arena (cpu regions)
  std::size_t spec_host_cap = 0, spec_host_used = 0;
  std::vector<SpecChunk> spec;
  bool spec_open = false;  // some region speculated in the open step
  double spec_lr = 0;
  StepScalars spec_decay, spec_plain;
  CUevent_st* spec_ready = nullptr;  // the producer's work up to the speculated region
  CUevent_st* spec_fence = nullptr;  // orders link and down around an undo

  bool step_open = false;
  bool skip = false;
  StepScalars k_decay, k_plain;
  std::int64_t t = 0;
  OptimizerStats stats;

  ~Impl() { release(); }
  void release() noexcept;

  // ---- CUDA helpers (no-ops without a GPU) ----
  CUevent_st* new_event();
  detail::SharedEvent new_shared_event();
  void record(CUevent_st* e, CUstream_st* s);
  void sync_event(CUevent_st* e);
  /// Record chunk c's event of rs on s (nothing without a GPU).
  void record_chunk(RegionState& rs, std::size_t c, CUstream_st* s);

  // ---- construction (adamw.cpp, adamw_path_choice.cpp, adamw_link.cpp) ----
  void create_streams();
  void allocate_state(RegionState& rs, PathChoice choice, std::optional<TierKind> state_tier);
  void choose_path(RegionState& rs, PathChoice choice);
  void assign_split();
  [[nodiscard]] LinkKernelLoad link_kernel_load() const;
  void size_kernels();

  // ---- regions ----
  void configure(RegionState& rs);
  void ensure_dma();
  void ensure_staging();
  unsigned char* slot_grad(int slot) { return staging[slot].as<unsigned char>(); }
  bf16* slot_weight(const RegionState& rs, int slot);
  /// Bytes of n elements of state array i (0 master, 1 m, 2 v), and the byte offset of element
  /// `first` (a multiple of granule()): every state size and address derives from these.
  std::size_t bytes(int i, std::size_t n) const;
  std::size_t offset(int i, std::size_t first) const;
  /// Elements every chunk is a multiple of (detail::chunk_granule).
  std::size_t granule() const { return detail::chunk_granule(state_type); }
  std::size_t count_of(const RegionState& rs, std::size_t c) const {
    return std::min(rs.chunk, rs.desc.n - c * rs.chunk);
  }
  AdamWSpan span(const RegionState& rs, std::size_t off, std::size_t count, bool device) const;
  void copy_in(const RegionState& rs, int i, const float* src);
  void copy_out(const RegionState& rs, int i, float* dst) const;
  void zero(const RegionState& rs, int i);
  RegionState& at(std::size_t r);

  // ---- GPU paths (adamw_device.cpp, adamw_link.cpp) ----
  /// SMs of a region's kernels (0: every SM): link_sms for gpu_link and every SM for the device
  /// path, or their shares while split_link_sms splits them.
  int kernel_sms(const RegionState& rs) const {
    if (rs.path == Path::gpu_link) return split_link_sms > 0 ? split_link_sms : link_sms;
    return split_link_sms > 0 ? device_sms - split_link_sms : 0;
  }
  /// The stream of a region's GPU updates: `hbm` for the device path side by side, else `link`.
  CUstream_st* stream_of(const RegionState& rs) const {
    return side_by_side && rs.path == Path::device ? hbm : link;
  }
  /// Splits the SMs between the gpu_link and device kernels of the regions update_all has left
  /// (split_link_sms), or leaves each its whole width where one path has none left.
  void split_sms_for_update();
  void update_gpu(RegionState& rs, const StepScalars& k, bool speculative = false);
  void update_gpu_dma(RegionState& rs, const StepScalars& k, bool speculative = false);
  /// update_all's GPU part: regions updated in place (device, gpu_link zero-copy) in region
  /// order, their chunks batch_spans per launch; each other region through update_region, in
  /// its turn (the batch queued before it is launched first).
  void update_gpu_batched(AdamW& self, const std::function<void(std::size_t)>& launched);

  // ---- speculation (adamw_speculate.cpp) ----
  static std::size_t spec_pad(std::size_t count) { return (count + 7) / 8 * 8; }
  std::size_t spec_offset(std::size_t count, int i) const;
  std::size_t spec_bytes(std::size_t count) const;
  std::size_t region_spec_bytes(const RegionState& rs) const;
  void save_for_undo(RegionState& rs, std::size_t c, const float* master, const void* m, const void* v);
  void undo_speculation(bool redo);
  void reserve_speculation();
  void reserve_host_speculation();
  void open_speculation(double lr);
  void settle_speculation(StepResult& res, bool undo);
  void end_speculation();

  // ---- the cpu path (adamw_cpu_path.cpp) ----
  /// Whether rs's jobs run on the worker (AdamWOptions::cpu_worker) or on the calling thread.
  [[nodiscard]] bool on_worker(const RegionState& rs) const {
    return rs.path == Path::cpu && (opts.cpu_worker ? *opts.cpu_worker : rs.staged);
  }
  /// Start the worker (configure does, for a region on it: on the driving thread, before any
  /// other thread may ask for that region's events).
  void ensure_worker();
  /// Hand a job to the worker; it becomes the region's latest (what region_event waits for). A
  /// region not on the worker runs it here and now.
  void enqueue_cpu(detail::CpuJob job);
  /// Wait until the worker has done region r's latest job (nothing for other paths).
  void wait_cpu_region(std::size_t r) const;
  void run_cpu_job(const detail::CpuJob& job, const detail::CpuWorker::Peek& peek);
  [[nodiscard]] bool downloads(const detail::CpuJob& job) const;
  int take_slot(const detail::CpuJob& job, std::size_t c);
  void prefetch_after(const detail::CpuJob& job, std::size_t c, const detail::CpuWorker::Peek& peek);
  void download(const detail::CpuJob& job, std::size_t c, int slot);
  /// Between region state (and host weights) and a chunk's undo copy, either way.
  void copy_undo(RegionState& rs, std::size_t off, std::size_t count, unsigned char* save, bool to_region);
};

}  // namespace ght::optimizer
