#pragma once
/**
 * @file launch.hpp
 * @brief Which process of a multi-process launch this one is, read from the environment.
 *
 * Launchers and the variables read (the first that is present wins):
 *   Open MPI (mpirun)   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
 *   torchrun-style      RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
 *   Slurm (srun)        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 *   none of them        world size 1, rank 0
 * Slurm's variables are also inherited by whatever runs inside an allocation (mpirun, torchrun),
 * so they count only when neither of the others is present. Open MPI's and torchrun-style
 * variables both present must agree on rank and size (a wrapper may export both).
 * A missing local rank defaults to the rank (one node).
 *
 * Every value is checked: a decimal integer, world size >= 1, 0 <= rank < world size,
 * 0 <= local rank < world size, and for a torchrun-style launch of more than one process
 * MASTER_ADDR and MASTER_PORT (1..65535; below 65535 under torchrun's agent, whose store holds
 * MASTER_PORT: ours then takes the next port). Errors (ght::config_error) name the variable.
 *
 * The environment is passed in as a map, so tests need not touch the process environment.
 */
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ght::dist {

using Env = std::map<std::string, std::string, std::less<>>;

/// The process environment (environ) as a map.
[[nodiscard]] Env process_env();

enum class Launcher { none, open_mpi, torchrun, slurm };
[[nodiscard]] std::string_view to_string(Launcher l) noexcept;  ///< "none", "open-mpi", "torchrun", "slurm"

/// This process's place in the launch.
struct Launch {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       ///< rank among the processes of this node
  std::string master_addr;  ///< torchrun-style only: where rank 0 serves the bootstrap store
  int master_port = 0;
  /// The bootstrap store's port (trainer/dist/store.hpp): MASTER_PORT, or MASTER_PORT + 1 under
  /// torchrun itself, whose agent serves its own store on MASTER_PORT (it says so by
  /// TORCHELASTIC_USE_AGENT_STORE=True).
  int store_port = 0;
  /// e.g. "rank 1 of 2 (local rank 1), launched by open-mpi"
  [[nodiscard]] std::string describe() const;
};

/**
 * @brief Detect and validate the launch from `env`.
 * @throws ght::config_error naming the variable (and its value) that is missing, not an integer,
 *         out of range, or inconsistent with another
 */
[[nodiscard]] Launch detect_launch(const Env& env);

/**
 * @brief The GPU a rank uses: GHT_DEVICE when it was set explicitly (every rank then uses that
 * ordinal, e.g. under CUDA_VISIBLE_DEVICES per rank), else the local rank. No NUMA node is chosen
 * per rank yet; the topology code (tier/topology.hpp) can later pick the one nearest the device.
 */
[[nodiscard]] int default_device(const Launch& l, std::optional<int> explicit_device) noexcept;

}  // namespace ght::dist
