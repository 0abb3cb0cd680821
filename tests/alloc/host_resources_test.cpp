// What is specific to system_host and pinned_host: NUMA policy, the small-block pool, huge-page
// alignment, registration and device pointers; and the CUDA resources' error without CUDA.
#include <algorithm>
#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "alloc/detail/host_memory.hpp"
#include "alloc/device_direct.hpp"
#include "alloc/device_pool.hpp"
#include "alloc/managed.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/system_host.hpp"
#include "common/gpu.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace ght;
using namespace ght::alloc;
namespace hd = ght::alloc::detail;

int test_node() { return hd::numa_node_usable(0) ? 0 : -1; }

TEST(HostMemory, MappedLength) {
  EXPECT_EQ(hd::mapped_length(1), 4096u);
  EXPECT_EQ(hd::mapped_length(4096), 4096u);
  EXPECT_EQ(hd::mapped_length(4097), 8192u);
  EXPECT_EQ(hd::mapped_length((3u << 20) + 1), (3u << 20) + 4096u);
  EXPECT_EQ(hd::mapped_length(4u << 20), 4u << 20);
  EXPECT_EQ(hd::mapped_length((4u << 20) + 1), 6u << 20);
  EXPECT_EQ(hd::touch_threads_for(1 << 20, 16), 1);
  EXPECT_EQ(hd::touch_threads_for(std::size_t{1} << 30, 16), 16);
  EXPECT_EQ(hd::touch_threads_for(std::size_t{1} << 30, 4), 4);
}

TEST(HostMemory, FreeBytesCountsReclaimablePageCache) {
  // Page cache that the kernel can drop counts as free: at least the node's free pages, at most
  // its size.
  const int node = test_node();
  const std::uint64_t avail = hd::numa_node_free_bytes(node);
  ASSERT_NE(avail, UINT64_MAX);
  if (node >= 0) {
    long long free_pages = 0;
    const long long total = numa_node_size64(node, &free_pages);
    // Allow for pages freed or taken by other processes between the two readings.
    EXPECT_GE(avail + (std::uint64_t{64} << 20), static_cast<std::uint64_t>(free_pages));
    // One node stands for the whole machine (a VM's node can list less than the machine has).
    const auto phys = static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    EXPECT_LE(avail, std::max(static_cast<std::uint64_t>(total), phys));
  } else {
    EXPECT_GT(avail, 0u);
  }
}

TEST(HostMemory, TouchPagesInParallel) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "libgomp is not TSan-instrumented: its fork/join looks like a race to TSan";
#endif
  const std::size_t len = 64u << 20;
  void* p = hd::map_host(len, -1, 4, true);
  // Pages are resident and still zero after touching.
  std::vector<unsigned char> vec(len / 4096);
  ASSERT_EQ(mincore(p, len, vec.data()), 0);
  for (unsigned char v : vec) ASSERT_TRUE(v & 1);
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < len; i += 4096 * 37) ASSERT_EQ(b[i], 0);
  hd::unmap_host(p, len);
}

TEST(SystemHost, NumaPolicyOnLargeBlocks) {
  const int node = test_node();
  if (node < 0) GTEST_SKIP() << "no usable NUMA node 0 (libnuma unavailable)";
  system_host r(node);
  EXPECT_EQ(r.numa_node(), node);
  const std::size_t n = 8u << 20;
  void* p = r.allocate(n);
  std::memset(p, 1, n);
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(get_mempolicy(&mode, mask, 8 * sizeof(mask), p, MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_PREFERRED);
  EXPECT_TRUE(mask[0] & (1UL << node));
  int where = -1;
  ASSERT_EQ(get_mempolicy(&where, nullptr, 0, static_cast<char*>(p) + n / 2,
                          MPOL_F_NODE | MPOL_F_ADDR),
            0);
  EXPECT_EQ(where, node);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % hd::kHugePageBytes, 0u)
      << "huge-page blocks are 2 MiB-aligned";
  r.deallocate(p, n);
  EXPECT_LT(r.physical_free(), UINT64_MAX);
}

TEST(SystemHost, SmallBlocksComeFromSlabs) {
  // The slab pool: what small blocks use without mimalloc (small_heap_test.cpp covers it).
  system_host r(test_node(), true, {}, /*mimalloc_small_blocks=*/false);
  EXPECT_EQ(r.pool_reserved_bytes(), 0u);
  void* a = r.allocate(100);
  EXPECT_EQ(r.pool_reserved_bytes(), hd::small_block_pool::kSlabBytes);
  void* b = r.allocate(100);
  // 100 bytes at the default 256-byte alignment: the 256 B class, carved from one run.
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 256);
  r.deallocate(b, 100);
  EXPECT_EQ(r.allocate(120), b);  // same class: the freed block is reused first
  void* big = r.allocate(1u << 20);  // above 256 KiB: a mapping of its own
  EXPECT_EQ(r.pool_reserved_bytes(), hd::small_block_pool::kSlabBytes);
  void* aligned = r.allocate(8, 4096);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(aligned) % 4096, 0u);
  r.deallocate(aligned, 8, 4096);
  r.deallocate(big, 1u << 20);
  r.deallocate(a, 100);
  r.deallocate(b, 120);
  // Many small blocks from several threads: slabs grow, never overlap.
  std::vector<std::thread> th;
  std::vector<std::vector<char*>> got(4);
  for (int t = 0; t < 4; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        char* p = static_cast<char*>(r.allocate(200));
        std::memset(p, t + 1, 200);
        got[static_cast<std::size_t>(t)].push_back(p);
      }
    });
  }
  for (auto& x : th) x.join();
  for (int t = 0; t < 4; ++t) {
    for (char* p : got[static_cast<std::size_t>(t)]) {
      ASSERT_EQ(p[0], t + 1);
      ASSERT_EQ(p[199], t + 1);
      r.deallocate(p, 200);
    }
  }
  EXPECT_GE(r.pool_reserved_bytes(), 80000u * 256);
}

TEST(SystemHost, RejectsBadNode) {
  try {
    system_host r(4000);
    FAIL() << "node 4000 accepted";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("NUMA node 4000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(system_host(-2), ght::logic_error);
}

TEST(PinnedHost, Basics) {
#ifdef GHT_HAVE_CUDA
  GHT_REQUIRE_GPU();
#endif
  PinnedHostOptions o;
  o.numa_node = test_node();
  pinned_host r(o);
  const std::size_t n = 3u << 20;
  char* p = static_cast<char*>(r.allocate(n));
  std::memset(p, 7, n);
  char* small = static_cast<char*>(r.allocate(64));
#ifdef GHT_HAVE_CUDA
  EXPECT_TRUE(r.registered());
  for (char* q : {p, p + n - 1, small}) {
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, q), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "registered (pinned) memory";
  }
  // Through the device address: a device-side memset lands in the host block.
  char* d = static_cast<char*>(r.device_pointer(p + 4096));
  ASSERT_EQ(cudaMemset(d, 9, 4096), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(p[4096], 9);
  EXPECT_EQ(p[8191], 9);
  EXPECT_EQ(p[8192], 7);
#else
  EXPECT_FALSE(r.registered());
  EXPECT_EQ(r.device_pointer(p + 10), p + 10);
#endif
  r.deallocate(small, 64);
  r.deallocate(p, n);
}

TEST(PinnedHost, ChunkedRegistration) {
  GHT_REQUIRE_GPU();
#ifdef GHT_HAVE_CUDA
  PinnedHostOptions o;
  o.register_chunk_bytes = 2u << 20;  // a 64 MiB block in 32 chunks, from 4 threads
  o.threads = 4;
  pinned_host r(o);
  if (!r.chunked_registration()) GTEST_SKIP() << "device addresses differ from host addresses";
  const std::size_t n = 64u << 20;
  char* p = static_cast<char*>(r.allocate(n));
  for (std::size_t off : {std::size_t{0}, n / 2 + 12345, n - 1}) {
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, p + off), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost) << off;
  }
  // One copy per registered chunk: the driver treats each chunk as its own allocation, so a
  // single memset across chunks fails (seen on the H200); within a chunk it must succeed.
  for (std::size_t off = 0; off < n; off += o.register_chunk_bytes) {
    ASSERT_EQ(cudaMemset(r.device_pointer(p + off), 3, std::min(o.register_chunk_bytes, n - off)),
              cudaSuccess) << off;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (std::size_t off = 0; off < n; off += 1u << 20) ASSERT_EQ(p[off], 3) << off;
  r.deallocate(p, n);
  // Unregistered after the free: the range can be registered again by the next allocation.
  void* q = r.allocate(n);
  r.deallocate(q, n);
#endif
}

TEST(PinnedHost, RejectsBadOptions) {
  PinnedHostOptions o;
  o.register_chunk_bytes = 12345;
  EXPECT_THROW(pinned_host{o}, ght::logic_error);
  o = {};
  o.threads = -1;
  EXPECT_THROW(pinned_host{o}, ght::logic_error);
}

#ifndef GHT_HAVE_CUDA
TEST(CudaResources, ClearErrorWithoutCuda) {
  const auto expect_msg = [](auto make, const char* who) {
    try {
      make();
      FAIL() << who << " constructed without CUDA";
    } catch (const ght::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(who) + ": ghtier was built without CUDA"),
                std::string::npos)
          << e.what();
    }
  };
  expect_msg([] { device_pool p; }, "device_pool");
  expect_msg([] { device_direct d(0); }, "device_direct");
  expect_msg([] { managed m; }, "managed");
}
#endif

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
namespace {
TEST(SmallBlockPool, UseAfterFreeIsReportedUnderAsan) {
  // Free small blocks are poisoned: touching one is a reported error, as with malloc.
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads from earlier tests exist
  EXPECT_DEATH(
      {
        ght::alloc::system_host r(-1, true, {}, /*mimalloc_small_blocks=*/false);
        auto* p = static_cast<volatile char*>(r.allocate(64));
        r.deallocate(const_cast<char*>(p), 64);
        p[3] = 1;
      },
      "use-after-poison");
}
}  // namespace
#endif
