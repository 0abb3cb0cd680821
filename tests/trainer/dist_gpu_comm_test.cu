// trainer/dist/gpu_comm.*: the NCCL communicator on one GPU (world size 1: NCCL runs for real,
// with one rank). Every collective on device buffers against the CPU's expectation for one rank
// (sum: the input; avg: the input divided by 1; reduce_scatter and all_gather: the input;
// broadcast: the root's bytes), the wait of a completed op, and the deadline: a stream that never
// finishes makes wait() throw timeout_error and abort the communicator. Two ranks run in
// tests/cli/train_nccl_test.sh.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/gpu_comm.hpp"

namespace {

using namespace ght::dist;

#define REQUIRE_NCCL()                                                                               \
  do {                                                                                               \
    GHT_REQUIRE_GPU();                                                                               \
    if (!have_nccl()) GTEST_SKIP() << "built without NCCL (GHT_HAVE_NCCL off: CMake found no nccl.h " \
                                      "and libnccl.so.2); GPU collectives test skipped";              \
  } while (0)

struct Stream {
  Stream() { GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

template <class T>
struct DeviceBuf {
  explicit DeviceBuf(std::size_t n) : n(n) { GHT_CUDA_TRY(cudaMalloc(&p, n * sizeof(T))); }
  ~DeviceBuf() { (void)cudaFree(p); }
  // A cudaMemcpy from pageable memory may return before its DMA lands, and the collectives run
  // on non-blocking streams that do not wait for the legacy stream: wait for it here.
  void put(const std::vector<T>& h) {
    GHT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    GHT_CUDA_TRY(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* p = nullptr;
  std::size_t n;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// bf16 bit patterns of random values (no NaN, no zero-only data).
std::vector<std::uint16_t> random_bf16(std::size_t n, unsigned seed) {
  std::vector<std::uint16_t> v(n);
  const std::vector<float> f = random_floats(n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, &f[i], 4);
    v[i] = static_cast<std::uint16_t>(b >> 16);
  }
  return v;
}

// What rank-count-many copies of x reduce to: the CPU's expectation.
std::vector<float> expect_reduced(const std::vector<float>& x, int ranks, GpuReduce op) {
  std::vector<float> e(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    float sum = 0;
    for (int r = 0; r < ranks; ++r) sum += x[i];
    e[i] = op == GpuReduce::sum ? sum : sum / static_cast<float>(ranks);
  }
  return e;
}

// Prints the first mismatches and counts them.
template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && ++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << +got[i] << ", want " << +want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

std::unique_ptr<GpuCommunicator> one_rank(Communicator& cpu, double timeout_s = 0) {
  GHT_CUDA_TRY(cudaSetDevice(0));
  GpuChoice c;
  c.device = 0;
  c.chosen_by = "the test";
  return make_gpu_communicator(cpu, c, std::chrono::duration<double>(timeout_s));
}

TEST(GpuComm, OneRankCollectivesMatchTheCpu) {
  REQUIRE_NCCL();
  const auto cpu = make_single_communicator();
  const auto g = one_rank(*cpu);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->device(), 0);
  EXPECT_EQ(g->name().rfind("nccl ", 0), 0u) << g->name();
  Stream s;
  constexpr std::size_t n = 10007;  // not a multiple of anything NCCL chunks by

  for (GpuReduce op : {GpuReduce::sum, GpuReduce::avg}) {
    const std::vector<float> x = random_floats(n, op == GpuReduce::sum ? 1 : 2);
    DeviceBuf<float> d(n);
    d.put(x);
    g->allreduce(d.p, n, GpuType::f32, op, s.s);
    g->wait(s.s);
    expect_equal(d.get(), expect_reduced(x, g->size(), op), op == GpuReduce::sum ? "fp32 allreduce sum" : "fp32 avg");
  }
  {
    const std::vector<std::uint16_t> x = random_bf16(n, 3);
    DeviceBuf<std::uint16_t> d(n);
    d.put(x);
    g->allreduce(d.p, n, GpuType::bf16, GpuReduce::avg, s.s);
    g->wait(s.s);
    expect_equal(d.get(), x, "bf16 allreduce avg over one rank");  // x/1 is exact in bf16
  }
  {
    // reduce_scatter: rank r's out is the reduction of in[r·n, (r+1)·n).
    const std::vector<float> x = random_floats(n * static_cast<std::size_t>(g->size()), 4);
    DeviceBuf<float> in(x.size()), out(n);
    in.put(x);
    g->reduce_scatter(in.p, out.p, n, GpuType::f32, GpuReduce::sum, s.s);
    g->wait(s.s);
    const std::vector<float> mine(x.begin() + static_cast<std::ptrdiff_t>(n * g->rank()),
                                  x.begin() + static_cast<std::ptrdiff_t>(n * (g->rank() + 1)));
    expect_equal(out.get(), expect_reduced(mine, g->size(), GpuReduce::sum), "reduce_scatter");
  }
  {
    const std::vector<std::uint16_t> x = random_bf16(n, 5);
    DeviceBuf<std::uint16_t> in(n), out(n * static_cast<std::size_t>(g->size()));
    in.put(x);
    g->all_gather(in.p, out.p, n, GpuType::bf16, s.s);
    g->wait(s.s);
    expect_equal(out.get(), x, "all_gather");  // one rank: its own block
  }
  {
    const std::vector<float> x = random_floats(n, 6);
    DeviceBuf<float> d(n);
    d.put(x);
    g->broadcast(d.p, n * sizeof(float), 0, s.s);
    g->wait(s.s);
    expect_equal(d.get(), x, "broadcast from root 0");
    EXPECT_THROW(g->broadcast(d.p, 4, 1, s.s), ght::logic_error);  // no rank 1
  }
  EXPECT_EQ(g->collectives(), 7u);
  g->wait(s.s);  // nothing pending: returns at once
}

// ZeRO-1's calls on one unit (trainer/cuda/train_cuda.cpp, reduce_unit and gather_weights), in
// place as the trainer makes them: the even part (a multiple of 16 per rank) reduce-scattered
// with out = in + rank·q, the remainder all-reduced; the weights' even part all-gathered with
// in = out + rank·q, the remainder broadcast from the last rank. One rank: every byte stays.
TEST(GpuComm, ZeroOneInPlaceUnitCollectivesOnOneRank) {
  REQUIRE_NCCL();
  const auto cpu = make_single_communicator();
  const auto g = one_rank(*cpu);
  Stream s;
  constexpr std::size_t n = 10007, q = n / 16 * 16;  // one rank: q = 10000, remainder 7
  const auto me = static_cast<std::size_t>(g->rank());
  const std::vector<float> x = random_floats(n, 8);
  DeviceBuf<float> grads(n);
  grads.put(x);
  g->reduce_scatter(grads.p, grads.p + me * q, q, GpuType::f32, GpuReduce::avg, s.s);
  g->allreduce(grads.p + q, n - q, GpuType::f32, GpuReduce::avg, s.s);
  const std::vector<std::uint16_t> w = random_bf16(n, 9);
  DeviceBuf<std::uint16_t> weights(n);
  weights.put(w);
  g->all_gather(weights.p + me * q, weights.p, q, GpuType::bf16, s.s);
  g->broadcast(weights.p + q, (n - q) * sizeof(std::uint16_t), g->size() - 1, s.s);
  g->wait(s.s);
  expect_equal(grads.get(), x, "in-place reduce-scatter + remainder all-reduce (avg over one rank)");
  expect_equal(weights.get(), w, "in-place all-gather + remainder broadcast");
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A kernel that spins until the host sets *flag, or for at most max_ns: the stream's work does
// not finish within the communicator's deadline. The bound matters: ncclCommAbort ends NCCL's
// own kernels, not this one, and the abort's device synchronisation (it frees device memory)
// waits for it, while the host sets the flag only after wait() has returned.
__global__ void spin_until(const volatile int* flag, unsigned long long max_ns) {
  const unsigned long long t0 = global_ns();
  while (*flag == 0 && global_ns() - t0 < max_ns) __nanosleep(1000);
}

TEST(GpuComm, WaitPastTheDeadlineThrowsAndAborts) {
  REQUIRE_NCCL();
  const auto cpu = make_single_communicator();
  // The deadline bounds the communicator's own set-up too, so it leaves room for a loaded machine
  // (1 s did not: under ctest -j8 on the H200 the init alone took longer).
  const auto g = one_rank(*cpu, 4.0);  // the spinning stream never meets it
  Stream s;
  DeviceBuf<float> d(256);
  d.put(random_floats(256, 7));
  g->allreduce(d.p, 256, GpuType::f32, GpuReduce::sum, s.s);
  int* flag = nullptr;
  GHT_CUDA_TRY(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
  *flag = 0;
  int* dflag = nullptr;
  GHT_CUDA_TRY(cudaHostGetDevicePointer(&dflag, flag, 0));
  g->wait(s.s);  // the completed allreduce: returns normally
  spin_until<<<1, 1, 0, s.s>>>(dflag, 12'000'000'000ull);  // 12 s against the 4 s deadline
  GHT_CUDA_TRY(cudaGetLastError());
  std::string msg;
  bool timed_out = false;
  try {
    g->wait(s.s);
  } catch (const timeout_error& e) {
    msg = e.what();
    timed_out = true;
  } catch (const std::exception& e) {
    msg = e.what();
  }
  *reinterpret_cast<volatile int*>(flag) = 1;  // release the kernel before anything can fail
  GHT_CUDA_TRY(cudaStreamSynchronize(s.s));
  GHT_CUDA_TRY(cudaFreeHost(flag));
  ASSERT_FALSE(msg.empty()) << "wait() returned although the stream never finished";
  ASSERT_TRUE(timed_out) << "not a timeout_error: " << msg;
  EXPECT_NE(msg.find("after GPU collective #1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GHT_DIST_TIMEOUT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
  // The communicator is gone: the next collective says so instead of hanging.
  try {
    g->allreduce(d.p, 256, GpuType::f32, GpuReduce::sum, s.s);
    ADD_FAILURE() << "an aborted communicator accepted a collective";
  } catch (const comm_error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier failure"), std::string::npos) << e.what();
  }
}

}  // namespace
