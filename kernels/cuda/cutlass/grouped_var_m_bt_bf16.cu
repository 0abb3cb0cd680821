// CUTLASS grouped GEMM instantiation var_m_bt_bf16 (A RowMajor, B ColumnMajor, C bfloat16_t); see grouped_gemm.cuh.
#include "kernels/cuda/cutlass/grouped_gemm.cuh"

namespace ght::kernels::cuda::cutlass_grouped {

void var_m_bt_bf16(const Problem& p, cudaStream_t stream) {
  GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t>::run(p, stream);
}

}  // namespace ght::kernels::cuda::cutlass_grouped
