#pragma once
/**
 * @file comm.hpp
 * @brief CPU collectives between the processes of a launch.
 *
 * A Communicator has a rank and a size and six collectives, and one all-reduce that can run in
 * the background (start_allreduce_sum, wait_allreduce). Every rank must call the same
 * collectives in the same order. Each collective has a deadline (GHT_DIST_TIMEOUT, 300 s by
 * default): a rank that waits past it throws ght::dist::timeout_error naming the operation, its
 * size, its sequence number and the rank(s) it waited for where that is knowable (the root of a
 * broadcast; the other rank of two).
 *
 * Implementations: one process (world size 1; every collective returns at once), MPI (built
 * when CMake finds MPI: GHT_HAVE_MPI), and for the CUDA backend of a torchrun-style launch NCCL
 * staged through device memory (detail/comm_nccl.hpp, make_cuda_host_communicator). After any rank fails, the launcher (mpirun, srun) ends the
 * others: a rank that leaves by an exception skips MPI_Finalize, so it exits "improperly" and
 * mpirun stops the job instead of leaving the others to wait for their timeout.
 */
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "optimizer/bf16.hpp"
#include "trainer/dist/launch.hpp"

namespace ght::dist {

/// A collective did not complete before its deadline, or the transport reported an error.
struct comm_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct timeout_error : comm_error {
  using comm_error::comm_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::duration<double> timeout() const noexcept { return timeout_; }
  /// A short name: "single", "mpi", "tcp-store" (bootstrap only), "nccl-staged (nccl x.y.z)".
  [[nodiscard]] virtual std::string name() const = 0;
  /// Element type of a collective's buffer.
  enum class Type { f32, f64, bf16 };

  /// x[0..n) := the elementwise sum over ranks (the same result on every rank).
  /// @throws timeout_error, comm_error
  void allreduce_sum(float* x, std::size_t n);
  void allreduce_sum(double* x, std::size_t n);
  /**
   * @brief The same over bf16 values, sent as 2 bytes each (DiLoCo's bf16 pseudo-gradients).
   * Each addition widens both operands to fp32, adds, and rounds the partial sum to bf16 (nearest
   * even), so the result depends on the transport's reduction order; for N ranks it is within
   * γ_{N-1}·Σ_r |x_r| of the exact sum, γ_k = k·u/(1 − k·u), u = 2^-8 (at most N−1 roundings of
   * partial sums whose magnitudes are at most Σ_r |x_r|; ±Inf/NaN propagate; results below
   * bf16's smallest normal add at most 2^-134 each). For two ranks it is exact order-free:
   * bf16(x_0 + x_1).
   */
  void allreduce_sum(optimizer::bf16* x, std::size_t n);
  /**
   * @brief In place over blocks in rank order: x holds Σ counts[r] elements, rank r's block
   * (counts[r] of them) at offset counts[0] + ... + counts[r-1]. Afterwards this rank's block
   * holds the elementwise sum over ranks of that block; the other blocks are left unspecified.
   * Blocks may be empty. (ZeRO-1's gradient reduction; NCCL's in-place ncclReduceScatter with
   * blocks of any size.)
   * @throws ght::logic_error when counts.size() != size(); timeout_error, comm_error
   */
  void reduce_scatter_sum(float* x, std::span<const std::size_t> counts);
  /// In place over the same blocks: every rank's block, as that rank holds it, lands in its
  /// place on every rank (ZeRO-1's weight gather; MPI_Allgatherv in place).
  void all_gather(float* x, std::span<const std::size_t> counts);
  void all_gather(double* x, std::span<const std::size_t> counts);
  /// `bytes` bytes at `data` from rank `root` to every rank. @throws ght::logic_error for a bad root
  void broadcast(void* data, std::size_t bytes, int root);
  /**
   * @brief Start x[0..n) := the elementwise sum over ranks and return without waiting (streaming
   * DiLoCo overlaps it with the next inner steps). x must stay untouched until wait_allreduce();
   * other collectives may run meanwhile, in the same order on every rank. One at a time.
   * @throws ght::logic_error when one is already started; comm_error
   */
  void start_allreduce_sum(float* x, std::size_t n);
  /// The same over bf16 values (the arithmetic of allreduce_sum(bf16*)).
  void start_allreduce_sum(optimizer::bf16* x, std::size_t n);
  /// Let the started all-reduce progress (MPI moves non-blocking collectives inside its own
  /// calls); true when it has completed (or none is started).
  bool test_allreduce();
  /// Wait for the started all-reduce (nothing when none is); its deadline counts from this call.
  /// @throws timeout_error, comm_error
  void wait_allreduce();
  [[nodiscard]] bool allreduce_started() const noexcept { return started_; }
  void barrier();

 protected:
  Communicator(int rank, int size, std::chrono::duration<double> timeout);
  virtual void do_allreduce_sum(void* x, std::size_t n, Type t) = 0;
  virtual void do_reduce_scatter_sum(void* x, std::span<const std::size_t> counts, Type t) = 0;
  virtual void do_all_gather(void* x, std::span<const std::size_t> counts, Type t) = 0;
  virtual void do_broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_start_allreduce_sum(void* x, std::size_t n, Type t) = 0;
  virtual bool do_test_allreduce() = 0;
  virtual void do_wait_allreduce() = 0;
  /// Which rank(s) a collective with `root` (-1: none) waits for, for an error message.
  [[nodiscard]] std::string waited_for(int root) const;
  /// One block count per rank, and a buffer when any block is non-empty.
  void check_counts(const char* op, const void* x, std::span<const std::size_t> counts) const;
  std::uint64_t calls_ = 0;  ///< collectives started so far (the failing one's number in errors)

 private:
  int rank_, size_;
  std::chrono::duration<double> timeout_;
  void start(void* x, std::size_t n, Type t);
  void allreduce(void* x, std::size_t n, Type t);
  bool started_ = false;   // start_allreduce_sum without its wait_allreduce yet
  bool transfer_ = false;  // ...and it moves data (n > 0, several ranks)
};

/// The world-size-1 communicator.
[[nodiscard]] std::unique_ptr<Communicator> make_single_communicator();

/**
 * @brief The communicator for `l`: single for world size 1, else MPI (Open MPI or Slurm launches;
 * initialises MPI and checks its rank and size against `l`).
 * @param timeout per-collective deadline; <= 0: GHT_DIST_TIMEOUT
 * @throws ght::config_error when world size > 1 and this build has no MPI, or the launch is
 *         torchrun-style (CPU collectives go over MPI only; the CUDA backend's host collectives
 *         for such a launch: make_cuda_host_communicator, gpu_comm.hpp); comm_error when MPI
 *         disagrees with `l`
 */
[[nodiscard]] std::unique_ptr<Communicator> make_communicator(const Launch& l,
                                                              std::chrono::duration<double> timeout = {});

/// True when this build has the MPI communicator.
[[nodiscard]] bool have_mpi() noexcept;

}  // namespace ght::dist
