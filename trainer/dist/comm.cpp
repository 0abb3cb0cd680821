#include "trainer/dist/comm.hpp"

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/dist/detail/comm_mpi.hpp"

namespace ght::dist {

Communicator::Communicator(int rank, int size, std::chrono::duration<double> timeout)
    : rank_(rank), size_(size), timeout_(timeout) {}

void Communicator::allreduce(void* x, std::size_t n, Type t) {
  ++calls_;
  if (n == 0 || size_ == 1) return;
  GHT_EXPECTS(x != nullptr, "allreduce_sum: null buffer");
  do_allreduce_sum(x, n, t);
}

void Communicator::allreduce_sum(float* x, std::size_t n) { allreduce(x, n, Type::f32); }
void Communicator::allreduce_sum(double* x, std::size_t n) { allreduce(x, n, Type::f64); }
void Communicator::allreduce_sum(optimizer::bf16* x, std::size_t n) { allreduce(x, n, Type::bf16); }

void Communicator::reduce_scatter_sum(float* x, std::span<const std::size_t> counts) {
  ++calls_;
  check_counts("reduce_scatter_sum", x, counts);
  if (size_ > 1) do_reduce_scatter_sum(x, counts, Type::f32);
}

void Communicator::all_gather(float* x, std::span<const std::size_t> counts) {
  ++calls_;
  check_counts("all_gather", x, counts);
  if (size_ > 1) do_all_gather(x, counts, Type::f32);
}

void Communicator::all_gather(double* x, std::span<const std::size_t> counts) {
  ++calls_;
  check_counts("all_gather", x, counts);
  if (size_ > 1) do_all_gather(x, counts, Type::f64);
}

void Communicator::check_counts(const char* op, const void* x, std::span<const std::size_t> counts) const {
  GHT_EXPECTS(counts.size() == static_cast<std::size_t>(size_), std::string(op) + ": " + std::to_string(counts.size()) +
                                                                    " block counts for " + std::to_string(size_) +
                                                                    " ranks");
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  GHT_EXPECTS(total == 0 || x != nullptr, std::string(op) + ": null buffer");
}

void Communicator::broadcast(void* data, std::size_t bytes, int root) {
  ++calls_;
  GHT_EXPECTS(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) + " is not a rank of " +
                                             std::to_string(size_));
  if (bytes == 0 || size_ == 1) return;
  GHT_EXPECTS(data != nullptr, "broadcast: null buffer");
  do_broadcast(data, bytes, root);
}

void Communicator::start(void* x, std::size_t n, Type t) {
  ++calls_;
  GHT_EXPECTS(!started_, "start_allreduce_sum: an all-reduce started before has not been waited for");
  started_ = true;
  transfer_ = n > 0 && size_ > 1;
  if (!transfer_) return;
  GHT_EXPECTS(x != nullptr, "start_allreduce_sum: null buffer");
  do_start_allreduce_sum(x, n, t);
}

void Communicator::start_allreduce_sum(float* x, std::size_t n) { start(x, n, Type::f32); }
void Communicator::start_allreduce_sum(optimizer::bf16* x, std::size_t n) { start(x, n, Type::bf16); }

bool Communicator::test_allreduce() {
  if (!started_ || !transfer_) return true;
  return do_test_allreduce();
}

void Communicator::wait_allreduce() {
  if (!started_) return;
  started_ = false;
  if (transfer_) do_wait_allreduce();
}

void Communicator::barrier() {
  ++calls_;
  if (size_ == 1) return;
  do_barrier();
}

std::string Communicator::waited_for(int root) const {
  if (root >= 0 && root != rank_) return "waited for root rank " + std::to_string(root);
  if (size_ == 2) return "waited for rank " + std::to_string(1 - rank_);
  return "waited for one or more of the other " + std::to_string(size_ - 1) + " ranks";
}

namespace {

class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator() : Communicator(0, 1, std::chrono::seconds(0)) {}
  [[nodiscard]] std::string name() const override { return "single"; }

 protected:
  void do_allreduce_sum(void*, std::size_t, Type) override {}
  void do_reduce_scatter_sum(void*, std::span<const std::size_t>, Type) override {}
  void do_all_gather(void*, std::span<const std::size_t>, Type) override {}
  void do_start_allreduce_sum(void*, std::size_t, Type) override {}
  bool do_test_allreduce() override { return true; }
  void do_wait_allreduce() override {}
  void do_broadcast(void*, std::size_t, int) override {}
  void do_barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

bool have_mpi() noexcept {
#ifdef GHT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_communicator(const Launch& l, std::chrono::duration<double> timeout) {
  if (l.world_size == 1) return make_single_communicator();
  if (timeout.count() <= 0) timeout = std::chrono::duration<double>(config::cfg().get_float(config::Key::GHT_DIST_TIMEOUT));
  if (l.launcher == Launcher::torchrun) {
    throw ght::config_error("a torchrun-style launch of " + std::to_string(l.world_size) +
                            " processes (RANK/WORLD_SIZE/MASTER_ADDR) with the CPU backend: its collectives go over "
                            "MPI only, which a torchrun-style launch does not start; launch with mpirun -np " +
                            std::to_string(l.world_size) + " or srun instead (train.backend=cuda can be launched "
                            "torchrun-style: NCCL, set up through a TCP store at MASTER_ADDR:MASTER_PORT)");
  }
#ifdef GHT_HAVE_MPI
  return detail::make_mpi_communicator(l, timeout);
#else
  throw ght::config_error("launched as " + l.describe() +
                          ", but this build has no MPI (CMake did not find it; install libopenmpi-dev, "
                          "scripts/install-deps.sh) and so runs one process only");
#endif
}

}  // namespace ght::dist
