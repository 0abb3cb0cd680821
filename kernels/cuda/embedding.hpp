#pragma once
/**
 * @file embedding.hpp
 * @brief Token embedding lookup and its backward on the GPU; mirrors kernels/cpu/embedding.hpp.
 *
 * The backward is deterministic and atomic-free: positions are stably sorted by token id
 * (cub::DeviceRadixSort, keys = ids, values = positions), then each run of equal ids is summed in
 * position order (the CPU op's order) in fp32 and added once into its dwte row. Bit-identical
 * from run to run, for any GPU.
 *
 * FLOPs: 0 (forward), N·C (backward). Bytes: 2·2·N·C (forward); 2·N·C + 2·sizeof(dW)·U·C
 * (backward, U = distinct ids) plus the sort's 16·N.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/**
 * @brief out[i, :] = wte[tokens[i], :].
 * @param out (N, C)   @param tokens (N) device ids   @param wte (V, C)
 * @param first_bad optional device scalar: the kernel cannot throw, so an id outside [0, V)
 *        writes a zero row and lowers *first_bad to its position (atomicMin). Initialise it to
 *        a value >= N; pass nullptr to skip the report. Use embedding_check_tokens() to throw.
 */
void embedding_forward(__nv_bfloat16* out, const std::int32_t* tokens, const __nv_bfloat16* wte,
                       std::int64_t N, int C, int V, unsigned long long* first_bad,
                       cudaStream_t stream);

/**
 * @brief Throw ght::logic_error naming the position and the id of the first token id outside
 * [0, V) (like the CPU op). Synchronises `stream` (a debugging and test aid, not for the step).
 */
void embedding_check_tokens(const std::int32_t* tokens, std::int64_t N, int V,
                            cudaStream_t stream);

/**
 * @brief dwte[tokens[i], :] += dout[i, :], deterministic (see above). Ids are not re-checked
 * (out-of-range ids are skipped).
 * @param dwte (V, C) accumulated, fp32 or bf16   @param dout (N, C)
 */
void embedding_backward(float* dwte, const __nv_bfloat16* dout, const std::int32_t* tokens,
                        std::int64_t N, int C, int V, cudaStream_t stream);
void embedding_backward(__nv_bfloat16* dwte, const __nv_bfloat16* dout,
                        const std::int32_t* tokens, std::int64_t N, int C, int V,
                        cudaStream_t stream);

}  // namespace ght::kernels::cuda
