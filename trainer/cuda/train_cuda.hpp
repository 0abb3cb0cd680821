#pragma once
/**
 * @file train_cuda.hpp
 * @brief The CUDA backend of the training loop (trainer/loop.hpp, shared with the CPU backend:
 * configuration, data order, schedule, logging, evaluation and checkpoint format), with
 *  - one alloc::tiered_allocator for the run (alloc::make_default_tiered_allocator(): the
 *    GHT_* budgets), from which every byte comes, with the plan installed in it. The plan
 *    (greedy by default; GHT_POLICY, GHT_PLACE) is made for that allocator's budgets and
 *    printed at the start;
 *  - bf16 weights, gradients and activations in HBM (trainer/cuda/model_cuda.hpp);
 *  - fp32 master/m/v per region where the plan puts it (HBM where it fits, the rest on the
 *    host, region by region); GHT_OPTIMIZER=device|gpu_link|cpu overrides it;
 *  - gradients accumulated in HBM (fp32, or bf16 with GHT_GRAD_ACCUM=bf16), or, when the plan streams any, copied as bf16 to the
 *    host after each unit's backward and added into fp32 host accumulators (optimizer/
 *    accumulate.hpp);
 *  - per-layer activation recompute where the plan chooses it;
 *  - AdamW (optimizer/adamw.hpp) with one region per tensor. The global-norm clip and the
 *    non-finite guard need every gradient, so the updates are launched right after the last
 *    backward, in forward order, on the optimizer's stream; the next step's forward waits per
 *    unit (embedding, each layer, final norm/head) only for that unit's regions, and zeroes
 *    that unit's gradients there, so the update overlaps the next forward. With
 *    GHT_OPT_SPECULATE set, each unit's update is launched during the last backward instead, as
 *    soon as its gradients are final, and begin_step keeps it or undoes it exactly.
 *
 * Several processes (data parallel, `comm` of size N > 1; needs NCCL, trainer/dist/gpu_comm.hpp):
 * each rank trains on its own GPU (GHT_DEVICE when set, else its local rank) with replicated
 * weights and optimizer state, computes A of every step's N·A micro-batches, and all-reduces
 * (averages) the HBM gradients on the model stream after its last backward, before the norm and
 * the update. Streamed (host-accumulated) gradients and speculative updates are off then.
 *
 * Per step it logs loss, grad norm, lr, tokens/s, MFU (formula printed once) and link GB each
 * way, and writes a forward / backward / exposed-optimizer breakdown (CUDA events) per step to
 * <out>/profile.json. A CUDA error or out-of-memory ends the run with a ght::cuda_error /
 * ght::out_of_memory naming the step, the op and the model's and optimizer's memory by tier;
 * checkpoints are atomic, so the last committed one stays valid.
 */
#include <memory>

#include "trainer/train.hpp"
#include "trainer/train_config.hpp"

namespace ght::dist {
class Communicator;
}

namespace ght::trainer {

/**
 * @brief Train on the GPU (defined only in CUDA builds).
 * @param comm the processes of a data-parallel run (null: this process alone)
 * @throws ght::logic_error without a usable GPU or for a bad configuration; ght::cuda_error /
 *         ght::out_of_memory as described above; ght::io_error for data or checkpoint files
 */
TrainSummary train_cuda(const TrainConfig& cfg, const TrainRunOptions& run = {},
                        std::shared_ptr<dist::Communicator> comm = nullptr);

}  // namespace ght::trainer
