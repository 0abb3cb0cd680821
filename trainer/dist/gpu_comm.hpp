#pragma once
/**
 * @file gpu_comm.hpp
 * @brief GPU collectives between the processes of a launch (NCCL), for the CUDA backend's data
 * parallel. Usable without the NCCL (or CUDA) headers: the NCCL communicator is built only with
 * GHT_HAVE_NCCL (trainer/dist/nccl/), and make_gpu_communicator says so in a build without it.
 *
 * Collectives are enqueued on a CUDA stream and return at once; every rank must enqueue the same
 * collectives in the same order. wait(stream) is the sync point: it polls the stream and the
 * communicator's asynchronous error until the stream is idle or the deadline (GHT_DIST_TIMEOUT,
 * the CPU communicator's) passes, and then aborts the communicator (ncclCommAbort, so the other
 * ranks' kernels end too) and throws ght::dist::timeout_error naming the oldest collective not
 * yet complete, its sequence number and the rank(s) it waited for. NCCL errors come back as
 * ght::dist::comm_error with NCCL's error string. The communicator is non-blocking
 * (ncclConfig_t::blocking = 0), so creating it is bounded by the same deadline.
 *
 * The NCCL unique id travels from rank 0 to the others over the CPU Communicator: MPI, or for a
 * torchrun-style launch the bootstrap TCP store (trainer/dist/store.hpp, through
 * make_store_communicator). Before that, every rank's GPU (host name, PCI bus id, UUID) is
 * gathered over it, and two ranks on one GPU are refused with an error naming the variables that
 * chose it (check_distinct_gpus).
 *
 * make_cuda_host_communicator gives the CUDA backend its host-side Communicator: MPI where the
 * launch has it, and for a torchrun-style launch one whose collectives go through NCCL, staged
 * through a small device buffer (trainer/dist/detail/comm_nccl.hpp).
 *
 * The pure pieces (the device choice, the duplicate check, the launch check) need neither CUDA
 * nor NCCL and are unit-tested on the CPU (tests/trainer/dist_gpu_check_test.cpp).
 */
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"

// The same declaration as cuda_runtime_api.h's, so this header needs no CUDA headers.
struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace ght::dist {

enum class GpuType { f32, bf16, f64 };
enum class GpuReduce { sum, avg };
[[nodiscard]] std::string_view to_string(GpuType t) noexcept;     ///< "fp32", "bf16", "fp64"
[[nodiscard]] std::string_view to_string(GpuReduce op) noexcept;  ///< "sum", "avg"
[[nodiscard]] std::size_t element_size(GpuType t) noexcept;

class GpuCommunicator {
 public:
  virtual ~GpuCommunicator() = default;
  GpuCommunicator(const GpuCommunicator&) = delete;
  GpuCommunicator& operator=(const GpuCommunicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }  ///< the CUDA ordinal it runs on
  [[nodiscard]] std::chrono::duration<double> timeout() const noexcept { return timeout_; }
  /// e.g. "nccl 2.28.9"
  [[nodiscard]] virtual std::string name() const = 0;
  /// Collectives enqueued so far (the sequence number of the last one).
  [[nodiscard]] std::uint64_t collectives() const noexcept { return calls_; }

  /// x[0..n) := the sum (or mean) over ranks, in place. @throws comm_error
  void allreduce(void* x, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s);
  /// out[0..n) := the sum (or mean) over ranks of in[rank·n, (rank+1)·n); `in` holds size()·n.
  void reduce_scatter(const void* in, void* out, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s);
  /// out[r·n, (r+1)·n) := rank r's in[0..n); `out` holds size()·n.
  void all_gather(const void* in, void* out, std::size_t n, GpuType t, cudaStream_t s);
  /// `bytes` bytes at x from rank `root` to every rank. @throws ght::logic_error for a bad root
  void broadcast(void* x, std::size_t bytes, int root, cudaStream_t s);
  /**
   * @brief Block until every operation enqueued on `s` so far has completed.
   * @throws timeout_error after the deadline (the communicator is aborted: later calls throw);
   *         comm_error on an NCCL error; ght::cuda_error on a CUDA error of the stream
   */
  void wait(cudaStream_t s);

 protected:
  GpuCommunicator(int rank, int size, int device, std::chrono::duration<double> timeout);
  /// What the failing collective waited for, for an error message (root: -1 when none).
  [[nodiscard]] std::string waited_for(int root) const;
  // `what` describes the collective for errors, e.g. "allreduce (avg) of 1024 bf16".
  virtual void do_allreduce(void* x, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s,
                            const std::string& what) = 0;
  virtual void do_reduce_scatter(const void* in, void* out, std::size_t n, GpuType t, GpuReduce op,
                                 cudaStream_t s, const std::string& what) = 0;
  virtual void do_all_gather(const void* in, void* out, std::size_t n, GpuType t, cudaStream_t s,
                             const std::string& what) = 0;
  virtual void do_broadcast(void* x, std::size_t bytes, int root, cudaStream_t s, const std::string& what) = 0;
  virtual void do_wait(cudaStream_t s) = 0;
  std::uint64_t calls_ = 0;

 private:
  int rank_, size_, device_;
  std::chrono::duration<double> timeout_;
};

/// True when this build has the NCCL communicator (GHT_HAVE_NCCL).
[[nodiscard]] bool have_nccl() noexcept;

/// How this rank's GPU was chosen, for the communicator's checks and messages.
struct GpuChoice {
  int device = 0;
  std::string chosen_by;        ///< e.g. "GHT_DEVICE=0" or "local rank 1 (OMPI_COMM_WORLD_LOCAL_RANK)"
  std::string visible_devices;  ///< CUDA_VISIBLE_DEVICES as set ("" when unset)
};

/**
 * @brief The NCCL communicator over the ranks of `cpu` (a collective over it), on `choice.device`,
 * which must be the current CUDA device. When `cpu` is the NCCL-staged host communicator
 * (make_cuda_host_communicator, torchrun-style), its NCCL communicator is shared instead (no
 * collective, no second NCCL communicator). Gathers every rank's GPU and refuses two ranks on one
 * (check_distinct_gpus) before NCCL starts. World size 1 makes a one-rank NCCL communicator.
 * @param timeout per-operation deadline; <= 0: cpu.timeout(), or GHT_DIST_TIMEOUT for size 1
 * @throws ght::config_error without NCCL in this build or for two ranks on one GPU;
 *         timeout_error / comm_error when NCCL's set-up fails or does not finish in time
 */
[[nodiscard]] std::unique_ptr<GpuCommunicator> make_gpu_communicator(Communicator& cpu, const GpuChoice& choice,
                                                                     std::chrono::duration<double> timeout = {});

/**
 * @brief The host-side Communicator of a CUDA-backend run in launch `l`: make_communicator(l) for
 * one process and for mpirun / srun launches; for a torchrun-style launch of several processes
 * (no MPI there) an NCCL one set up through the bootstrap TCP store at MASTER_ADDR:MASTER_PORT, on
 * this rank's GPU (choose_gpu: GHT_DEVICE when set, else LOCAL_RANK), whose collectives copy the
 * host buffers through a 64 MiB device buffer and a pinned twin, chunk by chunk. Its background
 * all-reduce completes inside start_allreduce_sum (no overlap).
 * @param timeout per-collective deadline; <= 0: GHT_DIST_TIMEOUT
 * @throws ght::config_error for a torchrun-style launch without NCCL in this build, and as
 *         make_communicator, TcpStore and make_gpu_communicator do
 */
[[nodiscard]] std::unique_ptr<Communicator> make_cuda_host_communicator(const Launch& l,
                                                                        std::chrono::duration<double> timeout = {});

/// GHT_DEVICE when it was set (env, file or flag), none when it has its default.
[[nodiscard]] std::optional<int> configured_device();

// ---- launch checks: pure, no CUDA or NCCL ----------------------------------------------------

/**
 * @brief The CUDA backend may run in launch `l`: world size 1, or more with NCCL and a transport
 * for its bootstrap (MPI for mpirun / srun launches; a torchrun-style launch brings its own TCP
 * store).
 * @throws ght::config_error naming the launch and what is missing
 */
void check_gpu_launch(const Launch& l, bool nccl_built, bool mpi_built);

/// The variable a launch's local rank came from ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
/// "SLURM_LOCALID"; "the rank" for a single process).
[[nodiscard]] std::string_view local_rank_variable(Launcher l) noexcept;

/**
 * @brief This rank's GPU: dist::default_device (GHT_DEVICE when set, else the local rank),
 * checked against the `visible` devices of this node.
 * @param env for CUDA_VISIBLE_DEVICES (named in the messages)
 * @throws ght::config_error naming GHT_DEVICE or the local-rank variable, the visible count and
 *         CUDA_VISIBLE_DEVICES when the ordinal is not a visible device (e.g. more ranks on a
 *         node than GPUs)
 */
[[nodiscard]] GpuChoice choose_gpu(const Launch& l, std::optional<int> explicit_device, int visible, const Env& env);

/// One rank's GPU as every rank sees it (gathered over the CPU communicator).
struct GpuIdentity {
  int rank = 0;
  std::string host;        ///< gethostname()
  std::string pci_bus_id;  ///< cudaDeviceGetPCIBusId, e.g. "0000:3B:00.0"
  std::string uuid;        ///< "GPU-xxxxxxxx-...", empty when unknown
  GpuChoice choice;
};
/// A fixed-size record for the CPU communicator's broadcast (and its inverse).
inline constexpr std::size_t kGpuIdentityBytes = 1024;
[[nodiscard]] std::string serialize(const GpuIdentity& g);
/// @throws ght::logic_error for a malformed record
[[nodiscard]] GpuIdentity parse_gpu_identity(std::string_view record);

/**
 * @brief Refuse two ranks on one GPU: the same UUID, or (UUIDs unknown) the same PCI bus id on
 * the same host.
 * @throws ght::config_error naming both ranks, the GPU, how each chose it (GHT_DEVICE / the
 *         local-rank variable) and CUDA_VISIBLE_DEVICES, and the fix
 */
void check_distinct_gpus(const std::vector<GpuIdentity>& ranks);

/// Every rank's identity, in rank order (one CPU broadcast per rank).
[[nodiscard]] std::vector<GpuIdentity> gather_gpu_identities(Communicator& cpu, const GpuIdentity& mine);

}  // namespace ght::dist
