// CUTLASS grouped GEMM instantiation var_k_bf16 (A ColumnMajor, B RowMajor, C bfloat16_t); see grouped_gemm.cuh.
#include "kernels/cuda/cutlass/grouped_gemm.cuh"

namespace ght::kernels::cuda::cutlass_grouped {

void var_k_bf16(const Problem& p, cudaStream_t stream) {
  GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, cutlass::bfloat16_t>::run(p, stream);
}

}  // namespace ght::kernels::cuda::cutlass_grouped
