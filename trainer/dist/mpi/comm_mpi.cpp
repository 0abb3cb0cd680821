// The MPI communicator: nonblocking MPI collectives, each polled against its deadline.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "optimizer/bf16.hpp"
#include "tier/error.hpp"
#include "trainer/dist/detail/comm_mpi.hpp"

namespace ght::dist::detail {

namespace {

using Type = Communicator::Type;

std::size_t elem_size(Type t) {
  switch (t) {
    case Type::f32: return sizeof(float);
    case Type::f64: return sizeof(double);
    case Type::bf16: return sizeof(optimizer::bf16);
  }
  return 1;
}
const char* what(Type t) {
  switch (t) {
    case Type::f32: return " floats";
    case Type::f64: return " doubles";
    case Type::bf16: return " bf16";
  }
  return "";
}
void* at_elem(void* x, std::size_t i, Type t) { return static_cast<char*>(x) + i * elem_size(t); }

// MPI has no bf16: a 2-byte contiguous type and a sum that widens to fp32, adds and rounds to
// nearest even (comm.hpp states the bound this gives). Commutative, so MPI may reorder freely.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const optimizer::bf16*>(in);
  auto* b = static_cast<optimizer::bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = optimizer::to_bf16(optimizer::to_float(a[i]) + optimizer::to_float(b[i]));
}

// Block offsets in rank order; the last entry is the total.
std::vector<std::size_t> displacements(std::span<const std::size_t> counts) {
  std::vector<std::size_t> d(counts.size() + 1, 0);
  for (std::size_t r = 0; r < counts.size(); ++r) d[r + 1] = d[r] + counts[r];
  return d;
}

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size, std::chrono::duration<double> timeout, std::size_t max_elems, bool owns_mpi)
      : Communicator(rank, size, timeout), max_elems_(max_elems), owns_mpi_(owns_mpi) {
    check(MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_), "MPI_Type_contiguous (bf16)");
    check(MPI_Type_commit(&bf16_type_), "MPI_Type_commit (bf16)");
    check(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_), "MPI_Op_create (bf16 sum)");
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) {
      if (bf16_sum_op_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_op_);
      if (bf16_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&bf16_type_);
    }
    // After a failed collective a request is still pending, and while an exception unwinds the
    // other ranks may be inside a collective: MPI_Finalize could block in either case. Exiting
    // without it makes mpirun end the job. Only the communicator that initialised MPI ends it.
    if (!owns_mpi_) return;
    if (!failed_ && std::uncaught_exceptions() == 0 && finalized == 0) MPI_Finalize();
  }

  [[nodiscard]] std::string name() const override { return "mpi"; }

 protected:
  void do_allreduce_sum(void* x, std::size_t n, Type t) override {
    const std::string op = "allreduce_sum of " + std::to_string(n) + what(t);
    // MPI counts are int: larger buffers go in pieces.
    for (std::size_t at = 0; at < n; at += max_elems_) {
      MPI_Request req = MPI_REQUEST_NULL;
      const std::size_t len = std::min(max_elems_, n - at);
      check(MPI_Iallreduce(MPI_IN_PLACE, at_elem(x, at, t), count(len, op), mpi_type(t), sum_op(t), MPI_COMM_WORLD,
                           &req),
            op);
      wait(req, op, -1);
    }
  }

  // One MPI_Ireduce_scatter when every count fits one call, else a reduce to each block's rank
  // in pieces (MPI-3 counts and displacements are int).
  void do_reduce_scatter_sum(void* x, std::span<const std::size_t> counts, Type t) override {
    const std::vector<std::size_t> displ = displacements(counts);
    const std::size_t total = displ.back();
    const std::string op = "reduce_scatter_sum of " + std::to_string(total) + what(t) + " in " +
                           std::to_string(counts.size()) + " blocks";
    const auto me = static_cast<std::size_t>(rank());
    if (total <= max_elems_) {
      std::vector<int> recv(counts.size());
      for (std::size_t r = 0; r < counts.size(); ++r) recv[r] = count(counts[r], op);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Ireduce_scatter(MPI_IN_PLACE, x, recv.data(), mpi_type(t), sum_op(t), MPI_COMM_WORLD, &req), op);
      wait(req, op, -1);
      // In place, MPI leaves this rank's block at the start of the buffer.
      if (displ[me] > 0 && counts[me] > 0) {
        std::memmove(at_elem(x, displ[me], t), x, counts[me] * elem_size(t));
      }
      return;
    }
    for (std::size_t r = 0; r < counts.size(); ++r) {
      for (std::size_t at = 0; at < counts[r]; at += max_elems_) {
        const std::size_t len = std::min(max_elems_, counts[r] - at);
        void* p = at_elem(x, displ[r] + at, t);
        MPI_Request req = MPI_REQUEST_NULL;
        check(MPI_Ireduce(r == me ? MPI_IN_PLACE : p, r == me ? p : nullptr, count(len, op), mpi_type(t), sum_op(t),
                          static_cast<int>(r), MPI_COMM_WORLD, &req),
              op);
        wait(req, op, static_cast<int>(r));
      }
    }
  }

  // One MPI_Iallgatherv in place when the blocks fit one call, else a broadcast from each
  // block's rank in pieces.
  void do_all_gather(void* x, std::span<const std::size_t> counts, Type t) override {
    const std::vector<std::size_t> displ = displacements(counts);
    const std::size_t total = displ.back();
    const std::string op = "all_gather of " + std::to_string(total) + what(t) + " in " +
                           std::to_string(counts.size()) + " blocks";
    if (total <= max_elems_) {
      std::vector<int> recv(counts.size()), at(counts.size());
      for (std::size_t r = 0; r < counts.size(); ++r) {
        recv[r] = count(counts[r], op);
        at[r] = count(displ[r], op);
      }
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, recv.data(), at.data(), mpi_type(t), MPI_COMM_WORLD,
                            &req),
            op);
      wait(req, op, -1);
      return;
    }
    for (std::size_t r = 0; r < counts.size(); ++r) {
      for (std::size_t a = 0; a < counts[r]; a += max_elems_) {
        const std::size_t len = std::min(max_elems_, counts[r] - a);
        MPI_Request req = MPI_REQUEST_NULL;
        check(MPI_Ibcast(at_elem(x, displ[r] + a, t), count(len, op), mpi_type(t), static_cast<int>(r), MPI_COMM_WORLD,
                         &req),
              op);
        wait(req, op, static_cast<int>(r));
      }
    }
  }

  // In pieces of max_elems_, all started at once; waited for together.
  void do_start_allreduce_sum(void* x, std::size_t n, Type t) override {
    started_op_ = "background allreduce_sum of " + std::to_string(n) + what(t);
    for (std::size_t at = 0; at < n; at += max_elems_) {
      MPI_Request& req = started_.emplace_back(MPI_REQUEST_NULL);
      const std::size_t len = std::min(max_elems_, n - at);
      check(MPI_Iallreduce(MPI_IN_PLACE, at_elem(x, at, t), count(len, started_op_), mpi_type(t), sum_op(t),
                           MPI_COMM_WORLD, &req),
            started_op_);
    }
  }

  bool do_test_allreduce() override {
    int done = 0;
    check(MPI_Testall(static_cast<int>(started_.size()), started_.data(), &done, MPI_STATUSES_IGNORE), started_op_);
    return done != 0;
  }

  void do_wait_allreduce() override {
    for (MPI_Request& req : started_) wait(req, started_op_, -1);
    started_.clear();
  }

  void do_broadcast(void* data, std::size_t bytes, int root) override {
    MPI_Request req = MPI_REQUEST_NULL;
    const std::string op = "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root);
    check(MPI_Ibcast(data, count(bytes, op), MPI_BYTE, root, MPI_COMM_WORLD, &req), op);
    wait(req, op, root);
  }

  void do_barrier() override {
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "barrier");
    wait(req, "barrier", -1);
  }

 private:
  [[nodiscard]] MPI_Datatype mpi_type(Type t) const {
    switch (t) {
      case Type::f32: return MPI_FLOAT;
      case Type::f64: return MPI_DOUBLE;
      case Type::bf16: return bf16_type_;
    }
    return MPI_DATATYPE_NULL;
  }
  [[nodiscard]] MPI_Op sum_op(Type t) const { return t == Type::bf16 ? bf16_sum_op_ : MPI_SUM; }

  [[nodiscard]] std::string where() const {
    return " (collective #" + std::to_string(calls_) + ", on rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + ")";
  }

  int count(std::size_t n, const std::string& op) const {
    // One MPI call moves at most INT_MAX elements.
    GHT_EXPECTS(n <= static_cast<std::size_t>(INT32_MAX), op + ": more than 2^31-1 elements in one call");
    return static_cast<int>(n);
  }

  void check(int rc, const std::string& op) {
    if (rc == MPI_SUCCESS) return;
    failed_ = true;
    throw comm_error(op + where() + " failed: " + mpi_error_text(rc));
  }

  // Poll until done or the deadline. Spinning first keeps small collectives fast; sleeping after
  // that leaves the cores to the other ranks (CI runs two ranks on two cores).
  void wait(MPI_Request& req, const std::string& op, int root) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(timeout());
    for (long polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), op);
      if (done != 0) return;
      if (clock::now() >= deadline) {
        failed_ = true;
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.0f", timeout().count());
        throw timeout_error(op + where() + " timed out after " + secs + " s; it " + waited_for(root) +
                            ", which never joined it (it failed, is stuck, or is in a different collective: see its "
                            "own output). GHT_DIST_TIMEOUT sets the limit in seconds");
      }
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  std::size_t max_elems_;  // elements per MPI call
  std::vector<MPI_Request> started_;  // the background all-reduce's pieces
  std::string started_op_;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;  // 2 contiguous bytes
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;            // bf16_sum
  bool owns_mpi_;          // this one initialised MPI: it finalises it
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const Launch& l, std::chrono::duration<double> timeout,
                                                    std::size_t max_elems_per_call) {
  GHT_EXPECTS(max_elems_per_call >= 1 && max_elems_per_call <= static_cast<std::size_t>(INT32_MAX),
              "make_mpi_communicator: elements per call must be in [1, 2^31-1]");
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited == 0) {
    // Only the thread that made the communicator calls MPI (OpenMP threads never do).
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) throw comm_error("MPI_Init_thread failed: " + mpi_error_text(rc));
  }
  // Errors come back as codes (and become exceptions) instead of aborting the job unexplained.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != l.rank || size != l.world_size) {
    throw comm_error("MPI says rank " + std::to_string(rank) + " of " + std::to_string(size) +
                     ", but the environment says " + l.describe() +
                     " (was the program started by something other than the launcher whose variables are set?)");
  }
  return std::make_unique<MpiCommunicator>(rank, size, timeout, max_elems_per_call, inited == 0);
}

}  // namespace ght::dist::detail
