#pragma once
/**
 * @file diloco.hpp
 * @brief DiLoCo's outer optimizer (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication
 * Training of Language Models") over the ranks of a run.
 *
 * Every rank is a worker: it takes H inner AdamW steps on its own micro-batches (no gradient
 * all-reduce), keeping its own AdamW state. After every H inner steps (and after the run's last
 * step, so that the final model holds every worker's work) the outer step runs:
 *
 *   Δ_r   = θ_global − θ_local,r                  this rank's pseudo-gradient (fp32; rounded to
 *                                                 bf16 when bf16_pseudo_grads)
 *   Δ     = (Σ_r Δ_r) / N                         one all-reduce (fp32, or bf16), the division fp32
 *   buf   = μ·buf + Δ                             PyTorch SGD, nesterov=True, dampening 0
 *   θ_global −= lr_outer·(Δ + μ·buf)
 *   θ_local,r = θ_global                          on every rank; the inner AdamW state stays
 *
 * θ_global and buf are identical on every rank (the same inputs, the same arithmetic) and live in
 * host memory from the run's tiered allocator (classes master and other), as does the Δ buffer.
 * bf16_pseudo_grads rounds each Δ_r to bf16 (nearest even) and all-reduces the bf16 values
 * (Communicator::allreduce_sum(bf16*): 2 bytes per value on the wire, half of fp32's), each
 * partial sum rounded to bf16, so Σ_r Δ_r is within γ_{N-1}·Σ_r |Δ_r| of the exact sum
 * (γ_k = k·2^-8/(1 − k·2^-8); exact for N = 2) and may depend on the transport's reduction
 * order; the sum is widened to fp32 (exactly) for the rest of the step. A checkpoint taken with a
 * fragment in flight holds its widened sum, so resume stays exact.
 *
 * On equivalence with data parallel: with H = 1, lr_outer = 1, μ = 0 the outer step gives
 * θ_global = fl(θ_global − fl(Σ_r Δ_r / N)), i.e. the mean of the workers' θ_local up to rounding.
 * For N = 1 that is one AdamW step exactly where the fp32 difference θ_global − θ_local is exact
 * (always when the two are within a factor 2 of each other, Sterbenz) and otherwise within half
 * an ulp of Δ. For N > 1 it is the mean of N AdamW updates, each from its worker's own gradient
 * and moments, which is not the AdamW update of the mean gradient that data parallel takes:
 * AdamW is not linear in the gradient (tests/trainer/mpi/diloco_mpi_test.cpp).
 *
 * Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication";
 * diloco.fragments = P, overlap_steps = τ, mix = α): the model's units (the embedding, each layer,
 * the final norm with an untied LM head) are dealt to P fragments by stride (unit u to fragment
 * u mod P, diloco_fragment_tensors), and fragment p runs the outer step above on its parameters
 * alone, once every H steps, at its own offset: its pseudo-gradient is taken and its all-reduce
 * started after inner step (p+1)·H/P + k·H (send), the all-reduce runs in the background over the
 * next τ inner steps, and after inner step (p+1)·H/P + k·H + τ (apply) the outer step updates the
 * fragment's θ_global and momentum, and each worker merges:
 *
 *   θ_local,r = α·θ_local,r + (1 − α)·θ_global       on the fragment (α = 0: replaced)
 *
 * where θ_local,r is the worker's weights after those τ further steps. τ < H/P, so one fragment's
 * all-reduce is in flight at a time. The run's last step ends with the plain outer step over the
 * whole model (after the fragment in flight, if any, is applied), so the final model holds every
 * worker's work. With P = 1, τ = 0, α = 0 this is the plain schedule above.
 */
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include <optional>
#include <vector>

#include "alloc/block.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/shard.hpp"
#include "trainer/model.hpp"
#include "trainer/train_config.hpp"

namespace ght::trainer {

/// Streaming DiLoCo's fragments: tensor indices per fragment. A tensor's unit is 0 for the
/// embedding, 1 + l for layer l's tensors, and the last for everything else (the final norm, an
/// untied LM head); unit u goes to fragment u mod `fragments`. @throws ght::logic_error for
/// fragments < 1 or more fragments than units
[[nodiscard]] std::vector<std::vector<std::size_t>> diloco_fragment_tensors(const std::vector<NamedTensor>& tensors,
                                                                           int fragments);

/// What the outer optimizer does after an inner step (DilocoOuter::due_streaming).
struct OuterDue {
  std::optional<std::size_t> send;   ///< take this fragment's pseudo-gradient, start its all-reduce
  std::optional<std::size_t> apply;  ///< finish this fragment's outer step and merge
  bool full = false;                 ///< the whole-model outer step (the last step)
};

class DilocoOuter {
 public:
  /**
   * @brief The outer state for `n` parameters (flat, in the backend's tensor order), zeroed.
   * @throws ght::out_of_memory when the host tier cannot hold 3·n floats
   */
  DilocoOuter(const DilocoConfig& cfg, std::size_t n, dist::Communicator& comm, alloc::tiered_allocator& a);

  /// After `step` completed inner steps of a run of `last_step`: is an outer step due?
  [[nodiscard]] bool due(std::int64_t step, std::int64_t last_step) const noexcept {
    return step % cfg_.inner_steps == 0 || step == last_step;
  }

  /// This worker's θ_local goes here (flat) before step(); step() leaves θ_global in it.
  [[nodiscard]] std::span<float> local() noexcept { return {local_.as<float>(), n_}; }
  [[nodiscard]] std::span<float> global() noexcept { return {global_.as<float>(), n_}; }
  [[nodiscard]] std::span<float> momentum() noexcept { return {momentum_.as<float>(), n_}; }

  /**
   * @brief The outer step (a collective: every rank calls it after the same inner step).
   * local() must hold θ_local; afterwards global() and local() hold the new θ_global.
   * @return the norm of the averaged pseudo-gradient Δ
   */
  double step();
  /// Wall seconds the last step() or apply() waited for its pseudo-gradient all-reduce (for
  /// apply(): the part not hidden behind the inner steps).
  [[nodiscard]] double last_allreduce_seconds() const noexcept { return allreduce_seconds_; }
  /// Bytes of the buffer that the last step() or apply() all-reduced, per rank (4 per value in
  /// fp32, 2 with bf16_pseudo_grads): what each rank hands the transport, not its traffic.
  [[nodiscard]] std::size_t last_allreduce_bytes() const noexcept { return allreduce_bytes_; }

  // ---- streaming (DilocoConfig::streaming()) ----
  /// The flat element ranges of each fragment, in fragment order (disjoint).
  void set_fragments(std::vector<std::vector<dist::Range>> fragments);
  [[nodiscard]] std::size_t fragments() const noexcept { return fragments_.size(); }
  /// After `step` completed inner steps of a run of `last_step`: what is due, in the order send,
  /// apply, full (with τ = 0 one fragment is sent and applied after the same step).
  [[nodiscard]] OuterDue due_streaming(std::int64_t step, std::int64_t last_step) const;
  /// local() holds θ_local on fragment p's ranges: its pseudo-gradient starts its all-reduce (a
  /// collective) after inner step `step`.
  void send(std::size_t p, std::int64_t step);
  /**
   * @brief Fragment p's outer step, once its all-reduce is done (waits for it): local() holds
   * θ_local on p's ranges on entry and the merged weights on return; global() and momentum() hold
   * p's new θ_global and buffer. @return the norm of the fragment's averaged pseudo-gradient
   */
  double apply(std::size_t p);
  /// Let the background all-reduce progress (call between inner steps).
  void progress() { (void)comm_.test_allreduce(); }
  /// The fragment whose all-reduce is started and not yet applied, and the step it was sent after.
  [[nodiscard]] std::optional<std::size_t> pending() const noexcept { return pending_; }
  [[nodiscard]] std::int64_t pending_sent_at() const noexcept { return sent_at_; }
  /// For a checkpoint: wait for the pending all-reduce; returns the pending fragment's summed
  /// pseudo-gradients, packed in its range order (empty when none is pending).
  [[nodiscard]] std::span<const float> settle();
  /// Resume: fragment p was sent after inner step `sent_at` and its all-reduce's sum is `sum`.
  void restore_pending(std::size_t p, std::int64_t sent_at, std::span<const float> sum);

 private:
  [[nodiscard]] std::size_t fragment_size(std::size_t p) const;
  [[nodiscard]] std::size_t wire_bytes(std::size_t n) const noexcept;
  DilocoConfig cfg_;
  std::size_t n_;
  dist::Communicator& comm_;
  alloc::tiered_allocator& alloc_;
  alloc::unique_block global_, momentum_, local_;
  alloc::unique_block wire_;  // bf16_pseudo_grads: the pseudo-gradients as sent (n bf16)
  double allreduce_seconds_ = 0;
  std::size_t allreduce_bytes_ = 0;
  std::vector<std::vector<dist::Range>> fragments_;
  alloc::unique_block send_;  // the pending fragment's pseudo-gradients, packed (streaming)
  std::optional<std::size_t> pending_;
  std::int64_t sent_at_ = 0;
  bool summed_ = false;  // send_ holds the all-reduce's result (waited for, or restored)
};

}  // namespace ght::trainer
