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
 *                                                 bf16 first when bf16_pseudo_grads)
 *   Δ     = (Σ_r Δ_r) / N                         one fp32 all-reduce
 *   buf   = μ·buf + Δ                             PyTorch SGD, nesterov=True, dampening 0
 *   θ_global −= lr_outer·(Δ + μ·buf)
 *   θ_local,r = θ_global                          on every rank; the inner AdamW state stays
 *
 * θ_global and buf are identical on every rank (the same inputs, the same arithmetic) and live in
 * host memory from the run's tiered allocator (classes master and other), as does the Δ buffer.
 * bf16_pseudo_grads rounds each Δ_r to bf16 (nearest even) but still sends fp32 (the
 * Communicator has no bf16 sum): it gives the precision of a bf16 exchange, not its bytes.
 *
 * On equivalence with data parallel: with H = 1, lr_outer = 1, μ = 0 the outer step gives
 * θ_global = fl(θ_global − fl(Σ_r Δ_r / N)), i.e. the mean of the workers' θ_local up to rounding.
 * For N = 1 that is one AdamW step exactly where the fp32 difference θ_global − θ_local is exact
 * (always when the two are within a factor 2 of each other, Sterbenz) and otherwise within half
 * an ulp of Δ. For N > 1 it is the mean of N AdamW updates, each from its worker's own gradient
 * and moments, which is not the AdamW update of the mean gradient that data parallel takes:
 * AdamW is not linear in the gradient (tests/trainer/mpi/diloco_mpi_test.cpp).
 */
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "alloc/block.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/train_config.hpp"

namespace ght::trainer {

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
  /// Wall seconds of the last step()'s pseudo-gradient all-reduce (its communication).
  [[nodiscard]] double last_allreduce_seconds() const noexcept { return allreduce_seconds_; }

 private:
  DilocoConfig cfg_;
  std::size_t n_;
  dist::Communicator& comm_;
  alloc::unique_block global_, momentum_, local_;
  double allreduce_seconds_ = 0;
};

}  // namespace ght::trainer
