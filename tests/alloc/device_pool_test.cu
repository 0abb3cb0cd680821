// GPU tests of the CUDA resources: stream-ordered reuse with a spin kernel, pool statistics and
// trim, 10^6 pattern-checked device_pool operations across streams, device_direct, managed
// advice, and kernels reading pinned host memory through its device address.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "alloc/device_direct.hpp"
#include "alloc/device_pool.hpp"
#include "alloc/managed.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/statistics.hpp"
#include "alloc/test_pattern.hpp"
#include "alloc/tiered.hpp"
#include "common/gpu.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Spins for `spin_ns`, then fills `n` words with `value` and records when it finished.
__global__ void spin_then_fill(unsigned* p, std::size_t n, unsigned value, long long spin_ns,
                               unsigned long long* finished) {
  const unsigned long long start = global_ns();
  while (static_cast<long long>(global_ns() - start) < spin_ns) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = value;
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(finished, global_ns());
}

/// Records when it started, then fills `n` words with `value`.
__global__ void stamp_then_fill(unsigned* p, std::size_t n, unsigned value,
                                unsigned long long* started) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *started = global_ns();
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = value;
  }
}

__global__ void count_not_equal(const unsigned* p, std::size_t n, unsigned value,
                                unsigned long long* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != value) atomicAdd(bad, 1ULL);
  }
}

__device__ unsigned char pattern_byte(std::uintptr_t a) {
  unsigned long long x = static_cast<unsigned long long>(a) * 0x9E3779B97F4A7C15ULL;
  return static_cast<unsigned char>(x ^ (x >> 31) ^ 0x5bd1e995ULL);
}

__global__ void fill_bytes(unsigned char* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = pattern_byte(reinterpret_cast<std::uintptr_t>(p + i));
  }
}

__global__ void check_bytes(const unsigned char* p, std::size_t n, unsigned long long* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != pattern_byte(reinterpret_cast<std::uintptr_t>(p + i))) atomicAdd(bad, 1ULL);
  }
}

__global__ void sum_words(const unsigned* p, std::size_t n, unsigned long long* out) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    local += p[i];
  }
  atomicAdd(out, local);
}

unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 1024));
}

// ---- stream-ordered reuse ---------------------------------------------------------------------

TEST(DevicePool, FreedBlockNotReusedOnOtherStreamBeforeKernelEnds) {
  GHT_REQUIRE_GPU();
  device_pool pool;
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  unsigned long long* stamps = nullptr;  // [0] = A finished, [1] = B started, [2] = bad words
  CUDA_OK(cudaMallocManaged(&stamps, 3 * sizeof(unsigned long long)));
  stamps[0] = stamps[1] = stamps[2] = 0;

  const std::size_t bytes = 64u << 20, words = bytes / 4;
  auto* x = static_cast<unsigned*>(pool.allocate(bytes, 256, a));
  // A keeps writing 1s into x for 300 ms after the free is queued behind it.
  spin_then_fill<<<grid_for(words), 256, 0, a>>>(x, words, 1u, 300'000'000LL, &stamps[0]);
  CUDA_OK(cudaGetLastError());
  pool.deallocate(x, bytes, 256, a);
  auto* y = static_cast<unsigned*>(pool.allocate(bytes, 256, b));
  stamp_then_fill<<<grid_for(words), 256, 0, b>>>(y, words, 2u, &stamps[1]);
  CUDA_OK(cudaGetLastError());
  // The test means something only if A was still running when B got its block.
  ASSERT_EQ(cudaStreamQuery(a), cudaErrorNotReady) << "the spin kernel ended too early";
  (void)cudaGetLastError();
  CUDA_OK(cudaStreamSynchronize(b));
  count_not_equal<<<grid_for(words), 256, 0, b>>>(y, words, 2u, &stamps[2]);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(stamps[2], 0u) << "B's block was overwritten by A's late kernel";
  if (x == y) {
    EXPECT_GE(stamps[1], stamps[0]) << "same block handed to stream B before A's kernel ended";
    std::printf("device_pool reused the block across streams, after A finished (+%.1f ms)\n",
                static_cast<double>(stamps[1] - stamps[0]) * 1e-6);
  } else {
    std::printf("device_pool gave stream B a different block while A's free was pending\n");
  }
  pool.deallocate(y, bytes, 256, b);
  CUDA_OK(cudaStreamSynchronize(b));
  CUDA_OK(cudaFree(stamps));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

TEST(DevicePool, SameStreamReuseAndStats) {
  GHT_REQUIRE_GPU();
  device_pool pool;
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = pool.allocate(32u << 20, 256, s);
  pool.deallocate(p, 32u << 20, 256, s);
  void* q = pool.allocate(32u << 20, 256, s);
  EXPECT_EQ(p, q) << "a block freed on a stream is reused at once on that stream";
  std::vector<void*> more;
  for (int i = 0; i < 4; ++i) more.push_back(pool.allocate(32u << 20, 256, s));
  PoolStats st = pool.stats();
  EXPECT_GE(st.used, 5u * (32u << 20));
  EXPECT_GE(st.reserved, st.used);
  pool.deallocate(q, 32u << 20, 256, s);
  for (void* m : more) pool.deallocate(m, 32u << 20, 256, s);
  CUDA_OK(cudaStreamSynchronize(s));
  st = pool.stats();
  EXPECT_EQ(st.used, 0u);
  EXPECT_GE(st.reserved, 5u * (32u << 20)) << "the release threshold keeps memory cached";
  EXPECT_GE(st.used_high, 5u * (32u << 20));
  EXPECT_DOUBLE_EQ(pool.fragmentation(), 1.0);
  EXPECT_GT(pool.physical_free(), st.reserved);
  pool.trim(0);
  EXPECT_EQ(pool.stats().reserved, 0u);
  EXPECT_DOUBLE_EQ(pool.fragmentation(), 0.0);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(DevicePool, OutOfMemoryIsTypedAndRecoverable) {
  GHT_REQUIRE_GPU();
  device_pool pool;
  std::size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  EXPECT_THROW((void)pool.allocate(total_b * 2), ght::out_of_memory);
  void* p = pool.allocate(1 << 20);  // still usable, no sticky error
  pool.deallocate(p, 1 << 20);
  CUDA_OK(cudaDeviceSynchronize());
}

// ---- 10^6 operations over four streams --------------------------------------------------------

TEST(DevicePool, StressMillionOps) {
  GHT_REQUIRE_GPU();
  constexpr int kThreads = 4;
  constexpr long kOps = 1'000'000;
  statistics_adaptor stats(std::make_unique<device_pool>());
  struct Slot {
    std::mutex mu;
    void* p = nullptr;
    std::size_t n = 0;
    cudaEvent_t filled = nullptr;  // the fill kernel's completion, on the allocating stream
  };
  std::vector<Slot> slots(2048);
  for (Slot& s : slots) CUDA_OK(cudaEventCreateWithFlags(&s.filled, cudaEventDisableTiming));
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMalloc(&bad, sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(bad, 0, sizeof(unsigned long long)));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      cudaStream_t st = nullptr;
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      std::mt19937_64 rng(static_cast<unsigned>(t) + 1u);
      ght::test::log_uniform sizes(1, 64u << 10);
      try {
        for (long i = 0; i < kOps / kThreads; ++i) {
          Slot& s = slots[rng() % slots.size()];
          std::lock_guard lock(s.mu);
          if (s.p != nullptr) {
            // Filled on another thread's stream, perhaps: wait for that, check, free here.
            cudaStreamWaitEvent(st, s.filled, 0);
            check_bytes<<<grid_for(s.n), 256, 0, st>>>(static_cast<unsigned char*>(s.p), s.n, bad);
            stats.deallocate(s.p, s.n, 256, st);
            s.p = nullptr;
          } else {
            s.n = sizes(rng);
            s.p = stats.allocate(s.n, 256, st);
            fill_bytes<<<grid_for(s.n), 256, 0, st>>>(static_cast<unsigned char*>(s.p), s.n);
            cudaEventRecord(s.filled, st);
          }
        }
        if (cudaGetLastError() != cudaSuccess) errors[static_cast<std::size_t>(t)] = "launch failed";
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
      cudaStreamSynchronize(st);
      cudaStreamDestroy(st);
    });
  }
  for (auto& x : th) x.join();
  for (Slot& s : slots) {
    if (s.p == nullptr) continue;
    CUDA_OK(cudaStreamWaitEvent(nullptr, s.filled, 0));
    check_bytes<<<grid_for(s.n), 256>>>(static_cast<unsigned char*>(s.p), s.n, bad);
    stats.deallocate(s.p, s.n, 256, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (const auto& e : errors) EXPECT_EQ(e, "");
  unsigned long long host_bad = 1;
  CUDA_OK(cudaMemcpy(&host_bad, bad, sizeof host_bad, cudaMemcpyDeviceToHost));
  EXPECT_EQ(host_bad, 0u) << "pattern bytes broken";
  EXPECT_EQ(stats.total_usage().current, 0u);
  EXPECT_GE(stats.total_usage().count * 2, static_cast<std::uint64_t>(kOps) * 9 / 10);
  auto& pool = static_cast<device_pool&>(stats.upstream());
  EXPECT_EQ(pool.stats().used, 0u);
  for (Slot& s : slots) CUDA_OK(cudaEventDestroy(s.filled));
  CUDA_OK(cudaFree(bad));
}

// ---- device_direct, managed, pinned_host on the GPU -------------------------------------------

TEST(DeviceDirect, KernelRoundTrip) {
  GHT_REQUIRE_GPU();
  device_direct r(0);
  const std::size_t n = (8u << 20) + 3;
  auto* p = static_cast<unsigned char*>(r.allocate(n));
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  fill_bytes<<<grid_for(n), 256>>>(p, n);
  check_bytes<<<grid_for(n), 256>>>(p, n, bad);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(*bad, 0u);
  r.deallocate(p, n);
  EXPECT_THROW((void)r.allocate(std::size_t{1} << 50), ght::out_of_memory);
  CUDA_OK(cudaFree(bad));
}

TEST(Managed, AdviceIsApplied) {
  GHT_REQUIRE_GPU();
  managed host_pref(ManagedOptions{0, TierKind::host, -1});
  const std::size_t n = 16u << 20;
  auto* p = static_cast<unsigned*>(host_pref.allocate(n));
  int loc_type = -1;
  CUDA_OK(cudaMemRangeGetAttribute(&loc_type, sizeof loc_type,
                                   cudaMemRangeAttributePreferredLocationType, p, n));
  EXPECT_EQ(loc_type, cudaMemLocationTypeHost);
  for (std::size_t i = 0; i < n / 4; ++i) p[i] = 3;  // the CPU writes, the GPU reads in place
  unsigned long long* sum = nullptr;
  CUDA_OK(cudaMallocManaged(&sum, sizeof *sum));
  *sum = 0;
  sum_words<<<grid_for(n / 4), 256>>>(p, n / 4, sum);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(*sum, 3ull * (n / 4));
  host_pref.deallocate(p, n);

  managed dev_pref(ManagedOptions{0, TierKind::hbm, -1});
  void* q = dev_pref.allocate(n);
  CUDA_OK(cudaMemRangeGetAttribute(&loc_type, sizeof loc_type,
                                   cudaMemRangeAttributePreferredLocationType, q, n));
  EXPECT_EQ(loc_type, cudaMemLocationTypeDevice);
  EXPECT_EQ(dev_pref.tier(), TierKind::hbm);
  dev_pref.deallocate(q, n);
  CUDA_OK(cudaFree(sum));
}

TEST(PinnedHost, KernelReadsThroughDevicePointer) {
  GHT_REQUIRE_GPU();
  for (std::size_t chunk : {std::size_t{0}, std::size_t{2} << 20}) {
    PinnedHostOptions o;
    o.register_chunk_bytes = chunk;
    pinned_host r(o);
    const std::size_t n = 64u << 20, words = n / 4;
    auto* p = static_cast<unsigned*>(r.allocate(n));
    std::mt19937 rng(5);
    unsigned long long want = 0;
    for (std::size_t i = 0; i < words; ++i) {
      p[i] = rng() & 0xFFFF;
      want += p[i];
    }
    unsigned long long* sum = nullptr;
    CUDA_OK(cudaMalloc(&sum, sizeof *sum));
    CUDA_OK(cudaMemset(sum, 0, sizeof *sum));
    sum_words<<<grid_for(words), 256>>>(static_cast<const unsigned*>(r.device_pointer(p)), words, sum);
    unsigned long long got = 0;
    CUDA_OK(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << "chunk " << chunk;
    r.deallocate(p, n);
    CUDA_OK(cudaFree(sum));
  }
}

TEST(Tiered, HbmBlocksAreDeviceMemory) {
  GHT_REQUIRE_GPU();
  std::array<TierSetup, kNumTiers> tiers;
  tiers[0].resource = std::make_unique<device_pool>();
  tiers[0].budget = 64u << 20;
  tiers[1].resource = std::make_unique<pinned_host>();
  tiered_allocator t(std::move(tiers));
  void* w = t.allocate(48u << 20, AllocRequest{TensorClass::weight, "w", {}, true});
  void* s = t.allocate(48u << 20, AllocRequest{TensorClass::weight, "spilled", {}, true});
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, w));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  CUDA_OK(cudaPointerGetAttributes(&attr, s));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_TRUE(t.where(s)->spilled);
  t.deallocate(w);
  t.deallocate(s);
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
