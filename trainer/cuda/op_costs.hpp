#pragma once
/**
 * @file op_costs.hpp
 * @brief The FLOPs and minimum bytes of every op of one CUDA training step, per call, from the
 * model shape; and the H200 roofline they are compared with. Pure C++ (no CUDA): the kernel-time
 * breakdown (kernel_breakdown.hpp) turns them into achieved TFLOP/s and GB/s per op.
 *
 * The keys are the op labels of CudaMoEModel (the `op()` calls in model_cuda.cpp) and of the
 * training step (the kOp* labels below, set by train_cuda.cpp). A call is one op of one layer of
 * one micro-batch (ops outside the layers: one per micro-batch). The formulas are those of the
 * kernels/cuda/README.md table (N tokens of the micro-batch, C = d_model, V vocab, E experts,
 * K top-k, F expert FFN, R = N·K permuted rows, B/T/H/KV/D batch/sequence/heads/kv heads/head
 * dim); where an op runs several kernels (a forward and a weight-gradient GEMM) the costs add.
 */
#include <cstdint>
#include <map>
#include <string>

#include "trainer/model_config.hpp"

namespace ght::trainer {

/**
 * @brief The ceilings a measured op is compared with, in one place. Source: /work/shared/
 * HARDWARE.md ("NVIDIA H200 SXM on x86", measured 2026-11-29): datasheet dense bf16 peak, the
 * best cuBLAS bf16 GEMM measured on that machine (8192³), and a GPU kernel reading HBM.
 */
struct Roofline {
  static constexpr double bf16_dense_datasheet_flops = 989.4e12;  ///< FLOP/s, H100/H200 SXM datasheet
  static constexpr double cublas_measured_flops = 788e12;         ///< FLOP/s, cuBLAS bf16 GEMM 8192³
  static constexpr double hbm_read_measured_bytes = 4.43e12;      ///< B/s, a kernel reading HBM
  static constexpr const char* source =
      "HARDWARE.md (H200 SXM, 2026-11-29): dense bf16 datasheet 989.4 TFLOP/s; measured cuBLAS bf16 GEMM "
      "8192^3 788 TFLOP/s; measured HBM read 4.43 TB/s";
};

/// Labels of the step's work outside the model's ops (train_cuda.cpp sets them while tracing).
inline constexpr const char* kOpGradStream = "gradient stream to the host accumulator";
inline constexpr const char* kOpSpeculate = "optimizer: update during backward (speculative)";
inline constexpr const char* kOpGradNorm = "optimizer: grad norm + clip (begin_step)";
inline constexpr const char* kOpUpdate = "optimizer: AdamW update";

/// Cost of one call of an op. 0 means "no formula" (shown as "–"): FLOPs of a data-movement op,
/// bytes of a host-bound op (a download, an allocation).
struct OpCost {
  double flops = 0;
  double bytes = 0;  ///< minimum HBM traffic
};

/// What the costs depend on besides the model shape.
struct OpCostInputs {
  int grad_bytes = 4;  ///< gradient element size (fp32 accumulated in HBM; 2 when streamed as bf16)
  /// Every optimizer region's master/m/v is in HBM (device path): the update's bytes are HBM
  /// traffic. Otherwise its bytes cross the link and get no formula.
  bool optimizer_state_in_hbm = false;
  /// Of the weight-gradient GEMM calls, the share that adds to the gradients (reads them before
  /// writing): (A − 1)/A for A micro-batches per step, whose first assigns them (GradWrite); 0
  /// when every micro-batch assigns (gradients streamed to the host); 1 for backward() alone.
  double grad_read_share = 1.0;
};

/**
 * @brief Every op label of a training step (model ops and kOp* labels) with its cost per call,
 * for micro-batches of mc.micro_batch × mc.seq_len tokens. Ops without a formula are present
 * with zeros, so a label missing from the table is one the table does not know.
 */
[[nodiscard]] std::map<std::string, OpCost, std::less<>> op_cost_table(const ModelConfig& mc,
                                                                      const OpCostInputs& in = {});

}  // namespace ght::trainer
