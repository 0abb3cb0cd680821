// CUTLASS grouped GEMM instantiation var_k_f32 (A ColumnMajor, B RowMajor, C float); see grouped_gemm.cuh.
#include "kernels/cuda/cutlass/grouped_gemm.cuh"

namespace ght::kernels::cuda::cutlass_grouped {

void var_k_f32(const Problem& p, cudaStream_t stream) {
  GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float>::run(p, stream);
}

}  // namespace ght::kernels::cuda::cutlass_grouped
