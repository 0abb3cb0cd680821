// trainer/dist/nccl/comm_nccl.cpp on one GPU: the NCCL-staged host collectives (HostStaging) at
// world size 1, where NCCL runs for real with one rank, against the CPU's answer for one rank
// (a sum is the input, a broadcast the root's bytes), bit for bit, in chunks of every size
// (a tail chunk, an element split never, more chunks than one of the default 64 MiB); and the
// torchrun-style set-up itself (the TCP store, the GPU check and NCCL's id through it) for a
// world of one, and the GPU communicator that shares its NCCL communicator. Built only with NCCL (tests/CMakeLists.txt); two ranks need two GPUs
// (tests/cli/train_nccl_test.sh, not run yet). Over one rank a sum is the identity whatever the
// element type NCCL is told, so this checks the staging (chunks, offsets, copies both ways) and
// the set-up, not the reduction: the type mapping is a switch over the enum (-Wswitch -Werror).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "common/gpu.hpp"
#include "common/tcp_port.hpp"
#include "optimizer/bf16.hpp"
#include "tier/cuda_check.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/detail/comm_nccl.hpp"
#include "trainer/dist/gpu_comm.hpp"

namespace {

using namespace ght::dist;
using Type = Communicator::Type;

std::unique_ptr<GpuCommunicator> one_rank(Communicator& cpu) {
  GHT_CUDA_TRY(cudaSetDevice(0));
  GpuChoice c;
  c.device = 0;
  c.chosen_by = "the test";
  return make_gpu_communicator(cpu, c, std::chrono::duration<double>(60));
}

// Random bytes that are valid, non-zero values of every type (no NaN, which would not compare).
template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-3.0, 3.0);
  std::vector<T> v(n);
  for (T& x : v) {
    if constexpr (std::is_same_v<T, ght::optimizer::bf16>) {
      x = ght::optimizer::to_bf16(static_cast<float>(d(rng)));
    } else {
      x = static_cast<T>(d(rng));
    }
  }
  return v;
}

template <class T>
void expect_same_bytes(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ, the first at " << first;
}

template <class T>
void check_allreduce(ght::dist::detail::HostStaging& st, std::size_t n, Type t, const std::string& what) {
  const std::vector<T> in = random_values<T>(n, static_cast<unsigned>(n));
  std::vector<T> x = in;
  const std::size_t before = st.chunks();
  st.allreduce_sum(x.data(), n, t);
  const std::size_t per = st.chunk_bytes() / sizeof(T);
  EXPECT_EQ(st.chunks() - before, (n + per - 1) / per) << what << ": chunks";
  expect_same_bytes(x, in, what + ": allreduce_sum over one rank is the input");
}

TEST(StagedComm, CollectivesOfOneRankMatchTheCpuInEveryChunking) {
  GHT_REQUIRE_GPU();
  const auto cpu = make_single_communicator();
  const auto gpu = one_rank(*cpu);
  // 1000-byte chunks: 250 floats, 125 doubles, 500 bf16 per chunk, so every size below has a
  // tail chunk and several full ones.
  ght::dist::detail::HostStaging small(*gpu, 1000);
  for (std::size_t n : {std::size_t{1}, std::size_t{249}, std::size_t{251}, std::size_t{10007}}) {
    check_allreduce<float>(small, n, Type::f32, "fp32 n=" + std::to_string(n));
    check_allreduce<double>(small, n, Type::f64, "fp64 n=" + std::to_string(n));
    check_allreduce<ght::optimizer::bf16>(small, n, Type::bf16, "bf16 n=" + std::to_string(n));
    std::vector<unsigned char> b(n * 3 + 1), root(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) root[i] = b[i] = static_cast<unsigned char>(i * 31 + 7);
    small.broadcast(b.data(), b.size(), 0);
    expect_same_bytes(b, root, "broadcast of " + std::to_string(b.size()) + " bytes from the root");
  }
  // The default 64 MiB chunk with a buffer of a little more than one.
  ght::dist::detail::HostStaging big(*gpu);
  EXPECT_EQ(big.chunk_bytes(), ght::dist::detail::kStagingChunkBytes);
  check_allreduce<float>(big, (std::size_t{64} << 20) / 4 + 4099, Type::f32, "fp32 over 64 MiB");
  EXPECT_EQ(gpu->collectives(), small.chunks() + big.chunks()) << "one NCCL collective per chunk";
}

// The torchrun-style set-up for a world of one: the store on a free port, the GPU check and the
// NCCL id through it, the staged communicator; then the GPU communicator the CUDA backend makes
// over it (its set-up runs over the staged one).
TEST(StagedComm, TorchrunStyleSetUpOfOneRank) {
  GHT_REQUIRE_GPU();
  Launch l;
  l.launcher = Launcher::torchrun;
  l.master_addr = "127.0.0.1";
  l.master_port = ght::test::free_tcp_port();
  const auto host = ght::dist::detail::make_store_nccl_communicator(l, std::chrono::duration<double>(60));
  EXPECT_EQ(host->name().rfind("nccl-staged (nccl ", 0), 0u) << host->name();
  EXPECT_EQ(host->size(), 1);
  EXPECT_EQ(host->rank(), 0);
  int dev = -1;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  EXPECT_EQ(dev, 0) << "the set-up makes this rank's GPU current";
  // The CUDA backend's GPU communicator over it shares its NCCL communicator.
  const auto gpu = one_rank(*host);
  EXPECT_EQ(gpu->size(), 1);
  EXPECT_EQ(host->name(), "nccl-staged (" + gpu->name() + ")");
  const std::vector<float> in = random_values<float>(1000, 3);
  float* d = nullptr;
  GHT_CUDA_TRY(cudaMalloc(&d, in.size() * sizeof(float)));
  GHT_CUDA_TRY(cudaMemcpy(d, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));  // pageable: the DMA may land after the return
  cudaStream_t s = nullptr;
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  gpu->allreduce(d, in.size(), GpuType::f32, GpuReduce::sum, s);
  gpu->wait(s);
  std::vector<float> out(in.size());
  GHT_CUDA_TRY(cudaMemcpy(out.data(), d, in.size() * sizeof(float), cudaMemcpyDeviceToHost));
  (void)cudaStreamDestroy(s);
  (void)cudaFree(d);
  expect_same_bytes(out, in, "an all-reduce through the shared GPU communicator");
  EXPECT_EQ(gpu->collectives(), 1u);
  host->barrier();
}

}  // namespace
