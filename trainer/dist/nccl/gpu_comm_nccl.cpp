// The NCCL communicator: a non-blocking ncclComm_t whose every operation is bounded by the
// deadline (gpu_comm.hpp). Each collective's completion is marked by an event on its stream, so a
// wait that times out can name the oldest collective still running.
#include <cuda_bf16.h>  // before nccl.h: older headers declare ncclBfloat16 only with it
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "trainer/dist/detail/gpu_comm_nccl.hpp"

namespace ght::dist::detail {

namespace {

ncclDataType_t nccl_type(GpuType t) {
  switch (t) {
    case GpuType::f32: return ncclFloat32;
    case GpuType::bf16: return ncclBfloat16;
    case GpuType::f64: return ncclFloat64;
  }
  return ncclFloat32;
}
ncclRedOp_t nccl_op(GpuReduce op) { return op == GpuReduce::sum ? ncclSum : ncclAvg; }

std::string nccl_version_text() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "nccl";
  // Codes since 2.9: major·10000 + minor·100 + patch.
  return "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string uuid_text(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::string s = "GPU-";
  char h[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    std::snprintf(h, sizeof h, "%02x", b[i]);
    s += h;
  }
  return s;
}

class NcclCommunicator final : public GpuCommunicator {
 public:
  NcclCommunicator(int rank, int size, int device, std::chrono::duration<double> timeout)
      : GpuCommunicator(rank, size, device, timeout) {}

  ~NcclCommunicator() override {
    for (Pending& p : pending_) (void)cudaEventDestroy(p.done);
    for (cudaEvent_t e : spare_) (void)cudaEventDestroy(e);
    if (comm_ == nullptr) return;
    // While an exception unwinds (or after a failure) the other ranks may never reach the
    // finalize: abort, which also ends this rank's NCCL kernels.
    if (failed_ || std::uncaught_exceptions() > 0) {
      (void)ncclCommAbort(comm_);
      return;
    }
    ncclResult_t st = ncclCommFinalize(comm_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<clock::duration>(timeout());
    while (st == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
    }
    if (st == ncclSuccess) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
  }

  [[nodiscard]] std::string name() const override { return nccl_version_text(); }

  /// Collective with every other rank: join the communicator named by `id`.
  void init(const ncclUniqueId& id) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; completion is polled against the deadline
    const std::string what = "ncclCommInitRankConfig (joining the NCCL communicator)";
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      failed_ = true;
      throw comm_error(what + where(0) + " failed: " + error_text(rc));
    }
    settle(what, -1, 0);
  }

 protected:
  void do_allreduce(void* x, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s,
                    const std::string& what) override {
    enqueue(what, -1, s, [&] { return ncclAllReduce(x, x, n, nccl_type(t), nccl_op(op), comm_, s); });
  }
  void do_reduce_scatter(const void* in, void* out, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s,
                         const std::string& what) override {
    enqueue(what, -1, s, [&] { return ncclReduceScatter(in, out, n, nccl_type(t), nccl_op(op), comm_, s); });
  }
  void do_all_gather(const void* in, void* out, std::size_t n, GpuType t, cudaStream_t s,
                     const std::string& what) override {
    enqueue(what, -1, s, [&] { return ncclAllGather(in, out, n, nccl_type(t), comm_, s); });
  }
  void do_broadcast(void* x, std::size_t bytes, int root, cudaStream_t s, const std::string& what) override {
    enqueue(what, root, s, [&] { return ncclBroadcast(x, x, bytes, ncclUint8, root, comm_, s); });
  }

  void do_wait(cudaStream_t s) override {
    usable("wait");
    const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(timeout());
    for (long polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) {
        retire(s);
        return;
      }
      if (q != cudaErrorNotReady) {
        failed_ = true;
        GHT_CUDA_TRY(q);
      }
      check_async("waiting for the stream");
      if (clock::now() >= deadline) timed_out(s);
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  struct Pending {
    std::uint64_t seq;
    std::string what;
    int root;
    cudaStream_t stream;
    cudaEvent_t done;  ///< recorded on `stream` right after the collective
  };

  // seq 0: the communicator's set-up, before any collective.
  [[nodiscard]] std::string where(std::uint64_t seq) const {
    return " (" + (seq > 0 ? "GPU collective #" + std::to_string(seq) + ", " : std::string()) + "rank " +
           std::to_string(rank()) + " of " + std::to_string(size()) + ", device " + std::to_string(device()) + ")";
  }
  [[nodiscard]] std::string error_text(ncclResult_t rc) const {
    std::string s = std::string(ncclGetErrorString(rc)) + " (NCCL error " + std::to_string(static_cast<int>(rc)) + ")";
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last != '\0') s += ": " + std::string(last);
    }
    return s;
  }
  [[nodiscard]] std::string seconds() const {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", timeout().count());
    return b;
  }

  void usable(const std::string& op) const {
    if (comm_ == nullptr) {
      throw comm_error("NCCL " + op + " on rank " + std::to_string(rank()) +
                       ": the communicator was aborted after an earlier failure");
    }
  }

  void fail_abort() {
    failed_ = true;
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // An error NCCL reported asynchronously (a peer failed, a network error) ends the communicator.
  void check_async(const std::string& during) {
    ncclResult_t st = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
    if (rc != ncclSuccess) st = rc;
    if (st == ncclSuccess || st == ncclInProgress) return;
    const std::string text = error_text(st);
    const std::string op = pending_.empty() ? std::string("a GPU collective") : pending_.front().what;
    const std::uint64_t seq = pending_.empty() ? calls_ : pending_.front().seq;
    fail_abort();
    throw comm_error("NCCL " + op + where(seq) + " failed " + during + ": " + text);
  }

  // A non-blocking communicator may still be busy with a call that returned ncclInProgress;
  // no other NCCL call may be made on it until that settles.
  void settle(const std::string& what, int root, std::uint64_t seq) {
    const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(timeout());
    for (;;) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
      if (rc != ncclSuccess) st = rc;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        const std::string text = error_text(st);
        fail_abort();
        throw comm_error("NCCL " + what + where(seq) + " failed: " + text);
      }
      if (clock::now() >= deadline) {
        fail_abort();
        throw timeout_error("NCCL " + what + where(seq) + " did not finish in " + seconds() + " s; it " +
                            waited_for(root) + ", which never joined it (it failed, is stuck, or is elsewhere: see "
                            "its own output). The communicator was aborted. GHT_DIST_TIMEOUT sets the limit in seconds");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  template <class Call>
  void enqueue(const std::string& what, int root, cudaStream_t s, Call&& call) {
    usable(what);
    const ncclResult_t rc = call();
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const std::string text = error_text(rc);
      fail_abort();
      throw comm_error("NCCL " + what + where(calls_) + " failed: " + text);
    }
    if (rc == ncclInProgress) settle(what, root, calls_);
    retire(nullptr);
    cudaEvent_t e = nullptr;
    if (!spare_.empty()) {
      e = spare_.back();
      spare_.pop_back();
    } else {
      GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    pending_.push_back({calls_, what, root, s, e});
    GHT_CUDA_TRY(cudaEventRecord(e, s));
  }

  // Drop the collectives known to be complete: those whose event has fired, and every one on
  // `idle` (a stream seen idle; nullptr: none).
  void retire(cudaStream_t idle) {
    std::deque<Pending> left;
    for (Pending& p : pending_) {
      bool done = idle != nullptr && p.stream == idle;
      if (!done) {
        const cudaError_t q = cudaEventQuery(p.done);
        if (q != cudaSuccess && q != cudaErrorNotReady) {
          failed_ = true;
          GHT_CUDA_TRY(q);
        }
        done = q == cudaSuccess;
      }
      if (done) {
        spare_.push_back(p.done);
      } else {
        left.push_back(std::move(p));
      }
    }
    pending_.swap(left);
  }

  [[noreturn]] void timed_out(cudaStream_t s) {
    // The oldest collective on this stream that has not completed is the one that hangs; when
    // all of them completed, other work on the stream did not finish.
    std::string msg;
    for (const Pending& p : pending_) {
      if (p.stream != s || cudaEventQuery(p.done) == cudaSuccess) continue;
      msg = "NCCL " + p.what + where(p.seq) + " did not complete in " + seconds() + " s; it " + waited_for(p.root) +
            ", which never joined it (it failed, is stuck, or is in a different collective: see its own output)";
      break;
    }
    if (msg.empty()) {
      msg = "work on the stream after GPU collective #" + std::to_string(calls_) + " (rank " + std::to_string(rank()) +
            " of " + std::to_string(size()) + ") did not complete in " + seconds() + " s";
    }
    fail_abort();
    throw timeout_error(msg + ". The communicator was aborted. GHT_DIST_TIMEOUT sets the limit in seconds");
  }

  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
};

}  // namespace

std::unique_ptr<GpuCommunicator> make_nccl_communicator(Communicator& cpu, const GpuChoice& choice,
                                                        std::chrono::duration<double> timeout) {
  int current = -1;
  GHT_CUDA_TRY(cudaGetDevice(&current));
  GHT_EXPECTS(current == choice.device, "make_gpu_communicator: device " + std::to_string(choice.device) +
                                            " is not the current CUDA device (" + std::to_string(current) + ")");
  // Two ranks on one GPU would make NCCL fail (or hang) with a less helpful message: check first.
  GpuIdentity me;
  me.rank = cpu.rank();
  me.host = host_name();
  char bus[64] = {};
  GHT_CUDA_TRY(cudaDeviceGetPCIBusId(bus, sizeof bus, choice.device));
  me.pci_bus_id = bus;
  cudaDeviceProp prop{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&prop, choice.device));
  me.uuid = uuid_text(prop.uuid);
  me.choice = choice;
  check_distinct_gpus(gather_gpu_identities(cpu, me));

  ncclUniqueId id{};
  if (cpu.rank() == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
      throw comm_error("ncclGetUniqueId on rank 0 failed: " + std::string(ncclGetErrorString(rc)));
    }
  }
  cpu.broadcast(&id, sizeof id, 0);
  auto c = std::make_unique<NcclCommunicator>(cpu.rank(), cpu.size(), choice.device, timeout);
  c->init(id);
  return c;
}

}  // namespace ght::dist::detail
