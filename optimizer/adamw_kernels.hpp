#pragma once
/**
 * @file adamw_kernels.hpp
 * @brief AdamW and gradient-norm kernels on raw pointers: the building blocks of every path.
 *
 * Semantics (identical in every path, equal to torch.optim.AdamW with decoupled weight decay):
 *   g  = grad · grad_scale                      (grad_scale = global-norm clip coefficient ≤ 1)
 *   m  = β1·m + (1−β1)·g
 *   v  = β2·v + (1−β2)·g²
 *   p  = p·(1 − lr·wd)                          (wd = 0 for regions without weight decay)
 *   p  = p − (lr / (1−β1^t)) · m / (sqrt(v)/sqrt(1−β2^t) + ε)
 *   w  = bf16_rn(p)                             (compute weight, written when a target is given)
 *   w  = bf16_rn(p + x·(p − p_before))          with weight extrapolation x ≠ 0 (the delayed
 *                                               update's weight prediction: the weights one more
 *                                               update of this size ahead; master stays p)
 * The per-step constants are folded once per step in double (make_step_scalars); the element
 * loops run in fp32.
 *
 * State type (GHT_OPT_STATE=fp32|bf16|q8): master is always fp32; m and v are fp32, or bf16 to cut
 * the state each step moves from 24 to 16 bytes per parameter. In bf16 the update above runs in
 * fp32 on the widened m and v (p uses the unrounded fp32 m and v of this step), then stores
 *   m  = bf16_rn(m)                             round to nearest even
 *   v  = bf16_sr(v, round_bits(round_stream(key, t), i))   stochastic: away from zero with
 *                                               probability = the dropped fraction of an ulp
 * where the 16 random bits are a counter-based hash of (region key, step t, element index i
 * within the region): the same on the host and the GPU, for any thread count, chunking or
 * resume. The GPU kernel then rounds every fp32 operation separately (no FMA contraction), as
 * the host loop does, so both produce the same bytes.
 *
 * q8 state (GHT_OPT_STATE=q8): m and v are one-byte codes in blocks of kQ8Block elements with one
 * fp32 scale per block (Q8Tables below). The update runs in fp32 as above on the dequantized m
 * and v (code value · scale; p uses this step's unrounded fp32 m and v), then each block stores
 *   scale = max |new values of the block|,  code_i = nearest map entry to new_i / scale
 * so a span must start at a block boundary of its region (chunks are multiples of kQ8Block).
 * Deterministic (no random bits); the GPU kernel rounds every operation on its own as for bf16.
 *
 * Bytes each parameter must move (the roofline of every path):
 *   read grad (2 bf16 / 4 fp32) + read master, m, v (12; 8 with bf16 state; 6.03 with q8)
 *   + write master, m, v (12; 8 with bf16 state; 6.03 with q8) + write w (2).
 * FLOPs per parameter: about 15 plus one sqrt and one divide; every path is memory-bound.
 */
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "optimizer/bf16.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "alloc/block.hpp"
#endif

namespace ght::optimizer {

/// Element type of a gradient buffer.
enum class GradType : int { bf16 = 0, fp32 = 1 };
[[nodiscard]] constexpr std::size_t grad_type_size(GradType t) noexcept {
  return t == GradType::bf16 ? 2 : 4;
}

/// Element type of the AdamW moments m and v (master is always fp32). q8: blockwise 8-bit codes
/// (kQ8Block elements per block, one fp32 scale per block and moment; see "q8" below).
enum class StateType : int { fp32 = 0, bf16 = 1, q8 = 2 };

/// q8 state: elements per quantization block, and the bytes of one block's record in a moment's
/// storage: kQ8Block one-byte codes, then the block's fp32 scale (4-byte aligned records, so the
/// bytes of elements [a, b) with a a multiple of kQ8Block are one contiguous range).
inline constexpr std::size_t kQ8Block = 256;
inline constexpr std::size_t kQ8Record = kQ8Block + sizeof(float);

/// Bytes of n consecutive m (or v) elements of a region: the one place every state size is
/// derived from (allocations, dma slots and copies, the undo arena, staging, the plan's regions).
/// q8 counts whole block records (the last one partial in elements, whole in bytes).
[[nodiscard]] constexpr std::size_t state_bytes(StateType t, std::size_t n) noexcept {
  if (t == StateType::q8) return (n + kQ8Block - 1) / kQ8Block * kQ8Record;
  return n * (t == StateType::bf16 ? 2 : 4);
}
/// Elements every chunk boundary inside a region must be a multiple of: q8 state is stored in
/// whole blocks, so a chunk (GHT_OPT_CHUNK, dma slots, cpu staging) covers whole blocks.
[[nodiscard]] constexpr std::size_t state_granule(StateType t) noexcept {
  return t == StateType::q8 ? kQ8Block : 1;
}
/// Byte offset of element `first` in a region's m (or v) storage; `first` must be a multiple of
/// state_granule(t) (chunks start there).
[[nodiscard]] constexpr std::size_t state_offset(StateType t, std::size_t first) noexcept {
  return state_bytes(t, first);
}
/// Bytes of master + m + v per parameter (12, 8, or 4 + 2 x 260/256 = 6.03 with q8).
[[nodiscard]] constexpr double state_bytes_per_param(StateType t) noexcept {
  return 4.0 + 2.0 * static_cast<double>(state_bytes(t, kQ8Block)) / static_cast<double>(kQ8Block);
}
[[nodiscard]] constexpr const char* to_string(StateType t) noexcept {
  return t == StateType::q8 ? "q8" : t == StateType::bf16 ? "bf16" : "fp32";
}
/// "fp32|bf16|q8" (case-insensitive); throws ght::config_error naming GHT_OPT_STATE and the text.
[[nodiscard]] StateType parse_state_type(std::string_view text);
/// The type from GHT_OPT_STATE.
[[nodiscard]] StateType state_type_from_config();

/**
 * q8 maps: what a code means, as a fraction of its block's scale (the block's absmax).
 * Both are "dynamic": a code's leading zero bits (after m's sign bit) count decades down from 1,
 * the rest is a linear fraction within the decade, so resolution is finest near 1 (0.7% steps for
 * v, 1.4% for m) and coarsest in the lowest decades.
 *   v (unsigned, code c): c >= 1: F = floor(log2 c), z = 7 - F, f = c - 2^F:
 *      (2^F + 9(f+1)) / (10 · 2^F · 10^z)    decade (10^-(z+1), 10^-z], c = 255 gives 1;
 *      c = 0 gives 10^-8. No code is 0: a v stored as 0 would make m / (sqrt(v) + eps) blow up.
 *   m (sign bit 0x80 + magnitude a = c & 0x7F): a = 0 is 0; a >= 1: F = floor(log2 a), z = 6 - F,
 *      f = a - 2^F: (2^F + 9(f+1)) / (10 · 2^F · 10^z), a = 127 gives 1, a = 1 gives 10^-6 (the
 *      decade (10^-7, 10^-6] holds that one value). Code 0x80 (-0) is never written.
 * Each value is computed in double from integers (one rounding) and then rounded to fp32.
 * Quantizing x of a block with scale s: q = x · r with r = 1/s (fp32, correctly rounded; r = 0
 * when s = 0), then the nearest map entry: the number of fp32 midpoints between neighbouring
 * entries that are < q (m: of |q|, then the sign). Same integer and fp32 code on the host and the GPU.
 */
struct Q8Tables {
  float m[256];      ///< m's value of each code (sign included)
  float v[256];      ///< v's value of each code, increasing with the code
  float m_mid[128];  ///< midpoints between m magnitudes a and a + 1; [127] = +inf
  float v_mid[256];  ///< midpoints between v codes c and c + 1; [255] = +inf
};
/// The tables, computed once (the GPU kernel gets a copy of these bytes as a kernel argument).
[[nodiscard]] const Q8Tables& q8_tables() noexcept;

/// The number of entries of the sorted `mid` (2^log2n entries, the last +inf) that are < q.
GHT_HD unsigned q8_search(const float* mid, unsigned half, float q) {
  unsigned i = 0;
  for (unsigned s = half; s > 0; s >>= 1) i += q > mid[i + s - 1] ? s : 0u;
  return i;
}
/// The m code of q = x / scale; 0 for 0 (and NaN).
GHT_HD std::uint8_t q8_code_m(const Q8Tables& t, float q) {
  const float a = q < 0 ? -q : q;
  const unsigned mag = q8_search(t.m_mid, 64, a);
  return static_cast<std::uint8_t>(mag == 0 ? 0u : mag | (q < 0 ? 0x80u : 0u));
}
/// The v code of q = x / scale (v >= 0).
GHT_HD std::uint8_t q8_code_v(const Q8Tables& t, float q) {
  return static_cast<std::uint8_t>(q8_search(t.v_mid, 128, q));
}

/// The host kernels' search (adamw_cpu.cpp, detail/adamw_simd.cpp): the code q8_code_m /
/// q8_code_v give for every fp32 q (NaN included), found from q's top 16 bits through one table
/// entry per bucket (simd::Q8Index) and one integer comparison, instead of the binary search the
/// GPU runs.
[[nodiscard]] std::uint8_t q8_code_m_host(float q) noexcept;
[[nodiscard]] std::uint8_t q8_code_v_host(float q) noexcept;

/**
 * @brief Quantize n fp32 values (one moment of a region, from element 0) into q8 block records:
 * per block the scale is the absmax, every code the nearest map entry (Q8Tables); the codes
 * after the last element of a partial block are 0. is_v: v's map (values must be >= 0), else m's.
 * For values dequantized from q8 (a checkpoint) this gives back the same bytes, as long as each
 * block's scale is a normal fp32 at least 2^-90 (products with the smallest entry stay normal).
 */
void q8_quantize(const float* x, std::size_t n, std::uint8_t* records, bool is_v);
/// The values n elements of q8 records stand for: code value x scale, one fp32 multiply each.
void q8_dequantize(const std::uint8_t* records, std::size_t n, float* x, bool is_v);

/// splitmix64's output function: a bijective 64-bit mix.
GHT_HD std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// The rounding stream of one region at one step; round_bits draws from it.
GHT_HD std::uint64_t round_stream(std::uint64_t key, std::uint64_t step) {
  return mix64(key ^ mix64(step));
}
/// 16 uniform random bits for element `index` of a stream: a 32-bit mix (Wellons' lowbias32) of
/// the stream's low word plus a Weyl step of the index. 32-bit multiplies keep the host loop
/// vectorised (the Highway loop, optimizer/detail/adamw_simd.cpp: SSE4 and NEON have no 64-bit
/// vector multiply); the bits repeat every 2^32
/// elements of one region, which leaves neighbouring values independent.
GHT_HD std::uint32_t round_bits(std::uint64_t stream, std::uint64_t index) {
  std::uint32_t x = static_cast<std::uint32_t>(stream) + static_cast<std::uint32_t>(index) * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x >> 16;
}
/// A region's key for the rounding stream: FNV-1a of its name (independent of region order).
[[nodiscard]] std::uint64_t round_key(std::string_view region_name) noexcept;

/// AdamW hyper-parameters fixed for a run (lr is supplied per step).
struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   ///< decoupled; applied only to regions flagged for decay
  double max_grad_norm = 1.0;  ///< global-norm clipping threshold; <= 0 disables clipping
  /// The compute weight written is bf16(p + x·(p − p_before)) instead of bf16(p): x = 1 predicts
  /// the weights after one more update like this one (GHT_OPT_DELAY_PREDICT, for the one-step-
  /// delayed update, trainer/README.md). Master, m and v do not depend on it. 0: bf16(p).
  double weight_extrapolation = 0;
};

/// The constants of one step for one region, as the element loops consume them.
struct StepScalars {
  float beta1 = 0, one_minus_beta1 = 0;
  float beta2 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float step_size = 0;     ///< lr / (1 − β1^t)
  float inv_sqrt_bc2 = 0;  ///< 1 / sqrt(1 − β2^t)
  float decay = 1;         ///< 1 − lr·wd, or 1 without weight decay
  float grad_scale = 1;    ///< clip coefficient
  float extrapolate = 0;   ///< AdamWHyper::weight_extrapolation
  std::uint64_t step = 0;  ///< t: the bf16-state rounding stream's step
};

/**
 * @brief Fold the per-step constants (in double, then rounded to fp32 once).
 * @param step 1-based count of steps taken (skipped steps do not count)
 * @param decay whether this region gets weight decay
 * @param grad_scale clip coefficient in (0, 1]
 * @throws ght::logic_error when step < 1, lr < 0, a β is outside [0, 1) or ε <= 0
 */
[[nodiscard]] StepScalars make_step_scalars(const AdamWHyper& h, double lr, std::int64_t step,
                                            bool decay, double grad_scale);

/// A contiguous slice of one region, updated in place.
struct AdamWSpan {
  float* master = nullptr;  ///< (n) fp32 master weights
  void* m = nullptr;        ///< (n) first moment, element type `state` (q8: state_bytes(q8, n) of block records, 4-byte aligned)
  void* v = nullptr;        ///< (n) second moment, element type `state`
  const void* grad = nullptr;  ///< (n) gradients, element type grad_type
  GradType grad_type = GradType::bf16;
  bf16* weight = nullptr;   ///< (n) bf16 compute weights to write; may be null
  std::size_t n = 0;
  StateType state = StateType::fp32;
  std::uint64_t key = 0;    ///< bf16 state: the region's round_key
  std::uint64_t first = 0;  ///< bf16 state: index of element 0 within the region
};

/**
 * @brief AdamW on the host: Highway SIMD loops (optimizer/detail/adamw_simd.hpp, the best target
 * the CPU runs) over a pinned team, static split (cpu_threads.hpp).
 * Every pointer must be host-accessible. Results per element do not depend on the thread count.
 * @param threads team size (0 = GHT_CPU_THREADS / cores of the host NUMA node)
 */
void adamw_cpu(const AdamWSpan& s, const StepScalars& k, int threads = 0);

/// Elements per block of the deterministic host sum of squares.
inline constexpr std::size_t kSumsqBlock = 1 << 16;

/**
 * @brief Σ g² over n host gradients. Squares are summed in double within fixed blocks of
 * kSumsqBlock elements and the block partials are added in index order, so the result is the
 * same bit for bit for any thread count. Non-finite inputs give a non-finite result; finite fp32
 * inputs cannot overflow a double sum.
 */
[[nodiscard]] double grad_sumsq_cpu(const void* grad, GradType t, std::size_t n, int threads = 0);

/// How much faster than the link feeds it the gpu_link kernel is sized to run (link_kernel_sms):
/// at 4x, a dma chunk's kernel takes at most a quarter of the time its copies take, so the
/// three-slot pipeline (in, update, out) stays bound by the copies.
inline constexpr double kLinkKernelMargin = 4;

/// Parameters per second of the GPU's AdamW update on the whole device where it is compute-bound:
/// the q8 update's block quantisation, GHT_ASSUMED_Q8_UPDATE; 0 for fp32 and bf16 state, whose
/// update is bandwidth-bound.
[[nodiscard]] double gpu_update_params_per_second(StateType t);

/// What the gpu_link kernels update per step, for sizing their SMs (link_kernel_sms).
struct LinkKernelLoad {
  double state_bytes = 12;      ///< master + m + v per parameter (12; 8 with bf16 m/v; 6.03 with q8)
  /// State bytes per parameter that cross the link each way: state_bytes when every array of the
  /// gpu_link regions is on the host, less where some stay in HBM (a region with any array on
  /// the host is updated whole by the gpu_link kernels). 0 = state_bytes.
  double link_bytes = 0;
  /// A compute-bound kernel's parameters per second on the whole GPU (the q8 update's,
  /// GHT_ASSUMED_Q8_UPDATE), 0 = bandwidth-bound.
  double gpu_params_per_second = 0;
};

/**
 * @brief SMs the gpu_link AdamW kernel needs: enough that it updates parameters
 * kLinkKernelMargin times as fast as the link delivers them. The link delivers link_bps / (2 ·
 * link_bytes) parameters per second (link_bps: the rate state crosses the link both ways, the
 * copy engines' bidir_bps in dma mode, kernel read + write in zero-copy mode). One SM updates
 * (hbm_bps / sms) / (2 · state_bytes + an fp32 gradient + the bf16 weight) of them (its share of
 * HBM bandwidth, a lower bound on what it can move), or gpu_params_per_second / sms where that is
 * less (a compute-bound kernel). Result: ceil(margin · delivered / per SM), at least 1 and at most
 * `sms`; either rate unknown (0): every SM.
 */
[[nodiscard]] int link_kernel_sms(double link_bps, double hbm_bps, int sms, const LinkKernelLoad& load);

/**
 * @brief SMs of the gpu_link kernels while the device path's kernels run beside them (on their own
 * stream), for one step's update: `link_params` gpu_link and `hbm_params` device parameters left
 * to update, `link_alone` the gpu_link kernels' own width (link_kernel_sms). Both kernels update a
 * parameter from HBM at the same rate (a dma slot or the state itself), so each gets its share of
 * the parameters: round(sms · link / (link + hbm)), at least 1, at most link_alone and
 * sms − 1; the device kernels take the rest. Where the link is slower than the kernels, that share
 * still keeps pace with it (it finishes its parameters in the kernels' total time). 0 (no split)
 * where either path has nothing left or the GPU has one SM.
 */
[[nodiscard]] int split_update_sms(int sms, double link_params, double hbm_params, int link_alone);

#ifdef GHT_HAVE_CUDA
/**
 * @brief AdamW on the GPU (the gpu_link and device paths). Pointers must be GPU-dereferenceable:
 * HBM, mapped pinned host memory (PCIe) or system memory (c2c). With every pointer 16-byte
 * aligned it moves 16-byte vectors (8 elements per thread per iteration, grid-stride, enough
 * blocks to fill every SM, or `max_sms` of them when > 0); otherwise it falls back to a scalar
 * loop. Each element is computed on its own, so the result does not depend on the grid.
 * Asynchronous on `stream`. One span; AdamWBatch below launches many at once.
 */
void adamw_gpu(const AdamWSpan& s, const StepScalars& k, cudaStream_t stream, int max_sms = 0);

/// Most spans one AdamWBatch launch takes (they travel in the kernel's argument, under 4 KiB).
inline constexpr int kAdamWBatchSpans = 32;

/**
 * @brief adamw_gpu over many spans in few launches. A step of many small regions (an MoE layer's
 * experts: a few million parameters each) otherwise pays one kernel's ramp-up and drain per
 * region, which held the device path at about half of HBM bandwidth on small experts
 * (bench/NOTES.md, "The all-HBM update in few launches"). Spans queued with add() run in one launch of the vector kernel
 * (at most `max_spans`, all of one gradient type, state type, weight-or-not and SM limit, with at
 * most two distinct StepScalars, e.g. with and without weight decay); add() launches the queued
 * ones first when the new span does not fit (fits()). q8 spans, spans with a pointer not 16-byte
 * aligned, and the last n % 8 elements of a span launch at once on their own. Every element is
 * computed by the same code as adamw_gpu (which is a batch of one), so the bytes do not depend on
 * the batching. Asynchronous on `stream`; call flush() before depending on the results (the
 * destructor does not launch).
 */
class AdamWBatch {
 public:
  explicit AdamWBatch(cudaStream_t stream, int max_spans = kAdamWBatchSpans);
  ~AdamWBatch();
  AdamWBatch(const AdamWBatch&) = delete;
  AdamWBatch& operator=(const AdamWBatch&) = delete;
  /// Whether add(s, k, max_sms) would join the queued spans (true when nothing is queued or s
  /// launches on its own); false: add() launches the queued spans first.
  [[nodiscard]] bool fits(const AdamWSpan& s, const StepScalars& k, int max_sms = 0) const;
  void add(const AdamWSpan& s, const StepScalars& k, int max_sms = 0);
  /// Launch the queued spans (nothing when none are queued).
  void flush();
  /// Kernel launches so far (batches and the spans that launched on their own).
  [[nodiscard]] std::size_t launches() const;

 private:
  struct Queue;
  std::unique_ptr<Queue> q_;
};

/**
 * @brief Deterministic Σ g² of device gradients, accumulated over several buffers.
 * Each of a fixed number of blocks adds its double partial of each buffer, in the order the
 * buffers were added, into its own slot (no atomics), and finish() adds the slots in order, so
 * results repeat bit for bit and do not depend on how the buffers were batched into launches.
 */
class DeviceSumsq {
 public:
  /// Scratch: the partials in HBM (allocated in `stream`'s order: use it on that stream) and
  /// the result in host memory, both from `a`.
  DeviceSumsq(alloc::tiered_allocator& a, cudaStream_t stream);
  ~DeviceSumsq();
  DeviceSumsq(const DeviceSumsq&) = delete;
  DeviceSumsq& operator=(const DeviceSumsq&) = delete;
  /// Zero the partials (asynchronous on stream).
  void reset(cudaStream_t stream);
  /// Add Σ g² of n GPU-readable gradients (asynchronous on stream). Buffers are queued and
  /// summed kAdamWBatchSpans per launch (one launch per buffer cost about as much as the sum on
  /// a model of many small experts); the pointer must stay valid until finish() or flush().
  void add(const void* grad, GradType t, std::size_t n, cudaStream_t stream);
  /// Launch the sums of the queued buffers (add and finish call it when they must).
  void flush();
  /// Reduce the partials and return the sum; synchronises with stream.
  [[nodiscard]] double finish(cudaStream_t stream);

 private:
  struct Queue;
  std::unique_ptr<Queue> q_;
  int blocks_ = 0;
  alloc::unique_block partials_;  ///< (blocks_ + 1) doubles, device
  alloc::unique_block result_;    ///< one double, host (pinned on PCIe), written by the final kernel
};
#endif

}  // namespace ght::optimizer
