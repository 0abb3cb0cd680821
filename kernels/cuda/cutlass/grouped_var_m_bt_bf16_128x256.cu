// CUTLASS grouped GEMM instantiation var_m_bt_bf16_128x256 (A RowMajor, B ColumnMajor, C bfloat16_t, 128x256 tiles, cooperative); see grouped_gemm.cuh.
#include "kernels/cuda/cutlass/grouped_gemm.cuh"

namespace ght::kernels::cuda::cutlass_grouped {

void var_m_bt_bf16_128x256(const Problem& p, cudaStream_t stream) {
  GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t, Tile128x256>::run(p, stream);
}

}  // namespace ght::kernels::cuda::cutlass_grouped
