#pragma once
/**
 * @file gemm.hpp
 * @brief Dense GEMMs through cuBLASLt: bf16 A/B, fp32 accumulation, bf16 or fp32 output,
 * row-major, optional transposes, alpha/beta and strided batches.
 *
 * Row-major convention (like the CPU ops in kernels/cpu):
 *   C(m,n) = alpha · op(A)(m,k) · op(B)(k,n) + beta · C
 *   A is stored (m,k) row-major, or (k,m) when trans_a; B is stored (k,n), or (n,k) when trans_b.
 * A Linear layer with PyTorch weight W(out,in) is therefore
 *   Y(T,out)  = X(T,in) · W^T        -> {m=T, n=out, k=in, trans_b=true}
 *   dX(T,in)  = dY(T,out) · W        -> {m=T, n=in, k=out}
 *   dW(out,in) += dY^T · X            -> {m=out, n=in, k=T, trans_a=true, beta=1, c fp32 or bf16}
 *
 * Library state is cached: one cuBLASLt handle per device, one workspace (32 MiB) per
 * (device, stream), and the chosen algorithm per shape. The caches are thread-safe. They are
 * released by release_blas_resources(); otherwise they live until process exit (freeing device
 * memory from static destructors races the driver's own teardown, so we deliberately do not).
 *
 * FLOPs: 2·m·n·k·batch. Bytes: 2·(m·k + k·n)·batch + sizeof(C)·m·n·batch·(beta != 0 ? 2 : 1).
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ght::kernels::cuda {

/// Storage type of a GEMM output (inputs are always bf16).
enum class DType : int { bf16 = 0, f32 = 1 };

/// Size in bytes of one element of `t`.
[[nodiscard]] constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::bf16 ? 2 : 4; }

/// One row-major GEMM (or a strided batch of them). Leading dimensions are row strides in
/// elements; 0 means packed (the number of stored columns).
struct GemmArgs {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  const __nv_bfloat16* a = nullptr;  ///< (m,k), or (k,m) when trans_a
  const __nv_bfloat16* b = nullptr;  ///< (k,n), or (n,k) when trans_b
  void* c = nullptr;                 ///< (m,n) of c_type; read when beta != 0
  bool trans_a = false;
  bool trans_b = false;
  DType c_type = DType::bf16;
  std::int64_t lda = 0;
  std::int64_t ldb = 0;
  std::int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  ///< 1 accumulates into C (weight gradients)
  int batch = 1;
  std::int64_t stride_a = 0;  ///< elements between consecutive A matrices (batch > 1)
  std::int64_t stride_b = 0;  ///< 0 with batch > 1 broadcasts B (e.g. one weight, many inputs)
  std::int64_t stride_c = 0;
  /// 0: every SM. Otherwise cuBLASLt plans for this many SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET),
  /// leaving the rest to kernels of other streams (a persistent GEMM otherwise holds them all).
  int sm_count_target = 0;
};

/**
 * @brief Run one GEMM on `stream` (asynchronous; no host synchronisation).
 * @throws ght::logic_error on inconsistent shapes/strides (the message names the field),
 *         ght::cuda_error when cuBLASLt fails or finds no algorithm for the shape.
 * An empty problem (m, n or batch == 0) returns at once; k == 0 scales C by beta.
 */
void gemm(const GemmArgs& args, cudaStream_t stream);

/**
 * @brief The SMs that the GEMMs launched on `stream` plan for: gemm() (unless its
 * GemmArgs::sm_count_target is set) and the CUTLASS grouped expert GEMMs. 0, the default, is every
 * SM. Their kernels are persistent: one that plans for every SM holds them all until it ends,
 * which keeps another stream's kernels (the optimizer's AdamW between its copies) off the GPU for
 * milliseconds whatever the stream priorities. A budget of a few SMs less leaves those free.
 * Thread-safe; the setting lives until changed or release_blas_resources().
 */
void set_stream_sm_budget(cudaStream_t stream, int sms);

/// The budget set_stream_sm_budget() gave `stream` on the current device (0: every SM).
[[nodiscard]] int stream_sm_budget(cudaStream_t stream);

/// The SMs a persistent GEMM launched on `stream` plans for on `device` (the current device): its
/// SM count (queried once per thread and device), capped by stream_sm_budget().
[[nodiscard]] int stream_sm_count(cudaStream_t stream, int device);

/// How many algorithms cuBLASLt's heuristic offers for `args`, at most `max` (>= 1; 32 at most). An empty
/// problem or k == 0, which gemm() runs without cuBLASLt, counts as 1. For benchmarks.
[[nodiscard]] int gemm_heuristic_count(const GemmArgs& args, int max);

/// gemm() with the heuristic's algorithm of rank `rank` (0 is the one gemm() runs; cached per
/// shape and rank like gemm()'s). For benchmarks that time the heuristic's other candidates.
/// @throws ght::cuda_error when the heuristic offers no algorithm of that rank.
void gemm_ranked(const GemmArgs& args, int rank, cudaStream_t stream);

/// The cached cuBLASLt handle of the current device.
[[nodiscard]] cublasLtHandle_t lt_handle();

/// The cached cuBLAS handle of the current device bound to `stream`, with its own workspace
/// (needed by the grouped-GEMM API, which only cuBLAS, not cuBLASLt, offers). Each (device,
/// stream) has its own handle, so concurrent use from different streams is safe.
[[nodiscard]] cublasHandle_t blas_handle(cudaStream_t stream);

/// The cuBLASLt workspace of (current device, stream); *bytes receives its size.
[[nodiscard]] void* blas_workspace(cudaStream_t stream, std::size_t* bytes);

/// Free every cached handle, workspace and plan. Call only while no GEMM is in flight.
void release_blas_resources();

}  // namespace ght::kernels::cuda
