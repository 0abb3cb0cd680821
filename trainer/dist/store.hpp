#pragma once
/**
 * @file store.hpp
 * @brief A small TCP key-value store for a torchrun-style launch's bootstrap (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), where no MPI is there to do it: it moves NCCL's unique id, the GPU
 * identities and a few barriers, nothing else. It is not a data transport (a value is at most
 * kStoreMaxValueBytes).
 *
 * Rank 0 listens on MASTER_PORT (every interface; MASTER_PORT+1 under torchrun itself, whose agent
 * serves its own store on MASTER_PORT: Launch::store_port) and serves the store from a thread of its own;
 * every rank, rank 0 included (over loopback), connects to MASTER_ADDR:MASTER_PORT, retrying
 * until the deadline while rank 0 is not listening yet, and announces its rank and world size.
 * The store refuses a world size that differs from rank 0's and a rank that has already joined:
 * every rank then fails with the same ght::config_error, naming WORLD_SIZE or RANK. Then every
 * rank waits for all the others to join (a barrier).
 *
 * Every wait has the deadline (GHT_DIST_TIMEOUT unless given): a barrier that times out throws
 * ght::dist::timeout_error naming the ranks that never arrived and the store's address; a get
 * names its key; a lost connection to rank 0 is a comm_error naming the address.
 *
 * Protocol (private to this file's implementation): each message is an op byte and a list of
 * length-prefixed strings; the server answers each request with a status byte and a list.
 */
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"

namespace ght::dist {

/// The largest value the store takes (NCCL's id is 128 bytes, a GPU identity 1 KiB).
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t{1} << 20;

class TcpStore {
 public:
  /**
   * @brief Join the store of the launch: rank 0 serves it on `port`; every rank connects to
   * `addr:port`, announces itself and waits until all `world_size` ranks have (a collective).
   * @param timeout the deadline of every wait (<= 0: GHT_DIST_TIMEOUT)
   * @throws ght::config_error naming MASTER_ADDR (not resolvable, nothing listening there before
   *         the deadline), MASTER_PORT (rank 0 cannot listen on it), WORLD_SIZE (ranks disagree)
   *         or RANK (two processes with one rank); timeout_error naming the ranks that never
   *         joined; comm_error when the connection to rank 0 breaks
   */
  /// @param port_name how messages name `port` (the variable it came from)
  TcpStore(std::string addr, int port, int rank, int world_size, std::chrono::duration<double> timeout = {},
           std::string port_name = "MASTER_PORT");
  /// The store of a torchrun-style launch `l`: MASTER_ADDR, its store_port (MASTER_PORT, or
  /// MASTER_PORT+1 under torchrun's agent), RANK, WORLD_SIZE.
  explicit TcpStore(const Launch& l, std::chrono::duration<double> timeout = {});
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return world_; }
  [[nodiscard]] std::chrono::duration<double> timeout() const noexcept { return timeout_; }
  /// The store's address as MASTER_ADDR:port, e.g. "127.0.0.1:29500".
  [[nodiscard]] std::string address() const;

  /// key := value (overwrites). @throws ght::logic_error for a value over kStoreMaxValueBytes
  void set(std::string_view key, std::string_view value);
  /// The value of `key`, waiting until some rank sets it or the deadline passes.
  /// @param from the rank expected to set it, for the error message (-1: unknown)
  /// @throws timeout_error naming the key (and `from`) and the address
  [[nodiscard]] std::string get(std::string_view key, int from = -1);
  /// Every rank calls it with the same `name`; returns when all have.
  /// @throws timeout_error naming the ranks that never arrived
  void barrier(std::string_view name);

 private:
  class Server;
  struct Reply;
  Reply request(char op, const std::vector<std::string>& fields, std::chrono::duration<double> wait);
  void connect_to_server();
  [[nodiscard]] std::string where() const;  // " (rank r of N, the store at addr:port)"

  std::string addr_;
  int port_;
  std::string port_name_;  // "MASTER_PORT", or "MASTER_PORT+1" under torchrun's agent
  int rank_, world_;
  std::chrono::duration<double> timeout_;
  std::unique_ptr<Server> server_;  // rank 0
  int fd_ = -1;                     // this rank's connection (closed by the destructor)
  std::uint64_t barriers_ = 0;      // barriers so far: each one's keys are its own
};

/**
 * @brief A Communicator for bootstrap over `store` (which must outlive it): broadcast (at most
 * kStoreMaxValueBytes) and barrier go through the store; the data collectives (all-reduce,
 * reduce-scatter, all-gather) throw ght::logic_error, the store being no data transport. It lets
 * make_gpu_communicator set NCCL up without MPI.
 */
[[nodiscard]] std::unique_ptr<Communicator> make_store_communicator(TcpStore& store);

}  // namespace ght::dist
