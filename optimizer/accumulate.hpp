#pragma once
/**
 * @file accumulate.hpp
 * @brief The CPU gradient accumulator: dst_fp32 (+)= src (bf16 or fp32) on pinned OpenMP
 * threads, and a pipeline streaming device gradients through double-buffered pinned staging.
 *
 * Determinism: every element is produced by one thread in one operation (no cross-thread
 * reduction, no FMA contraction), so results are bit-identical for any thread count.
 *
 * Bytes per element: read dst (4) + read src (2 or 4) + write dst (4). Non-temporal stores are
 * not used: dst is read first, so its lines are already cached when written and a streaming
 * store would save no read-for-ownership traffic.
 *
 * Steadiness: the additions run on the pinned team of the CPU AdamW (cpu_threads.hpp, one thread
 * per core of the host NUMA node, static split). place_accumulator() prepares a plain host
 * buffer for it: transparent huge pages asked for, then every page faulted in by the thread whose
 * slice of the split holds it, before the first pass. Without that, the first passes pay the page
 * faults and a 1 GiB buffer of 4 KiB pages needs 262,144 TLB entries; both vary from run to run.
 */
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "alloc/block.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16.hpp"

struct CUstream_st;
struct CUevent_st;

namespace ght::optimizer {

enum class AccumulateMode {
  add,     ///< dst += src   (later micro-batches)
  assign,  ///< dst  = src   (first micro-batch; saves zeroing dst)
};

/**
 * @brief dst[i] (+)= float(src[i]) for i < n on a pinned team (static split).
 * @param threads team size (0 = GHT_CPU_THREADS / cores of the host NUMA node)
 */
void accumulate(float* dst, const float* src, std::size_t n, int threads = 0);
void accumulate(float* dst, const bf16* src, std::size_t n, int threads = 0);
void accumulate(float* dst, const void* src, GradType type, std::size_t n,
                AccumulateMode mode = AccumulateMode::add, int threads = 0);

/// The team size accumulate() uses for n elements: resolve_cpu_threads(threads), fewer when the
/// slices would be too small to pay for waking a team.
[[nodiscard]] int accumulate_team_size(std::size_t n, int threads = 0);

/**
 * @brief Prepare dst[0..n) for accumulate(dst, ..., n, ..., threads): ask for transparent huge
 * pages on it, then zero it on the pinned team with accumulate()'s split, so each page is faulted
 * in on the host NUMA node by the thread that will add into it.
 *
 * Pinned or registered memory is resident before this runs: it is only zeroed, and whether it
 * has huge pages was decided when it was allocated. GradStreamAccumulator adds chunk by chunk,
 * each chunk split over the team; its split differs from this one within the buffer, which costs
 * nothing for placement since every thread of the team runs on the host node.
 * @return bytes of dst backed by huge pages afterwards (0 when unknown or none)
 */
std::size_t place_accumulator(float* dst, std::size_t n, int threads = 0);

namespace detail {
/// Callbacks of one double-buffered run. Chunk k uses slot k % 2; `count` is in elements.
struct StagingOps {
  std::function<void(int slot, std::size_t offset, std::size_t count)> start_copy;
  std::function<void(int slot)> wait_copy;
  std::function<void(int slot, std::size_t offset, std::size_t count)> consume;
};
/// Copy chunk k+1 while chunk k is consumed: start(0); for k: start(k+1); wait(k); consume(k).
/// A slot is refilled only after its previous chunk was consumed (consume is synchronous).
void run_double_buffered(std::size_t n, std::size_t chunk, const StagingOps& ops);
}  // namespace detail

/**
 * @brief Streams gradients into fp32 host accumulators through two pinned staging slots.
 *
 * For device sources the D2H copy of chunk k+1 (on the pipeline's own copy stream, after the
 * producer stream's pending work) overlaps with the host addition of chunk k. Host sources are
 * added directly, unless Options::stage_host_sources asks for the same staged schedule (memcpy
 * instead of the D2H copy), which is how the CPU tests exercise it.
 */
class GradStreamAccumulator {
 public:
  struct Options {
    std::size_t staging_bytes = 0;  ///< bytes per slot; 0 = GHT_STAGING_BYTES
    int threads = 0;                ///< host team size; 0 = default
    bool stage_host_sources = false;
  };

  /// @param alloc where the two staging slots come from (host tier, pinned on PCIe); null:
  ///        alloc::make_default_tiered_allocator()
  /// @throws ght::out_of_memory when the staging slots cannot be allocated
  explicit GradStreamAccumulator(Options opts, std::shared_ptr<alloc::tiered_allocator> alloc = nullptr);
  GradStreamAccumulator();
  ~GradStreamAccumulator();
  GradStreamAccumulator(const GradStreamAccumulator&) = delete;
  GradStreamAccumulator& operator=(const GradStreamAccumulator&) = delete;

  /**
   * @brief dst[0..n) (+)= src[0..n); returns when dst is final.
   * @param dst host fp32 accumulator
   * @param src gradients in device memory or host memory
   * @param producer stream whose queued work produces src (device sources only; null = legacy
   *        default stream)
   */
  void run(float* dst, const void* src, GradType type, std::size_t n, AccumulateMode mode,
           CUstream_st* producer = nullptr);

  [[nodiscard]] std::size_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] std::uint64_t bytes_staged() const { return bytes_staged_; }

 private:
  void release() noexcept;

  Options opts_;
  std::size_t slot_bytes_ = 0;
  std::shared_ptr<alloc::tiered_allocator> alloc_;
  alloc::unique_block slots_[2];  // host staging (pinned on PCIe)
  CUstream_st* copy_stream_ = nullptr;
  CUevent_st* copied_[2] = {nullptr, nullptr};
  CUevent_st* produced_ = nullptr;
  std::uint64_t bytes_staged_ = 0;
};

}  // namespace ght::optimizer
