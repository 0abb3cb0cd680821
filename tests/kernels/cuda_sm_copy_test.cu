// kc::sm_copy (kernels/cuda/sm_copy.hpp) against memcpy: random bytes, aligned and unaligned
// pointers and sizes, host-to-device from mapped pinned memory, device-to-host into it, and
// device to device; the bytes just outside the destination range stay untouched.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cuda/sm_copy.hpp"
#include "tier/cuda_check.hpp"

namespace {

namespace kc = ght::kernels::cuda;

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(d(gen));
  return v;
}

TEST(CudaSmCopy, MatchesMemcpyInEveryDirectionAndAlignment) {
  GHT_REQUIRE_GPU();
  constexpr std::size_t kCap = (1 << 20) + 64;
  unsigned char* pinned = nullptr;
  GHT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kCap, cudaHostAllocMapped));
  auto* pinned_dev = static_cast<unsigned char*>(kc::mapped_device_pointer(pinned));
  ASSERT_NE(pinned_dev, nullptr);
  unsigned char *a = nullptr, *b = nullptr;
  GHT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&a), kCap));
  GHT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&b), kCap));
  cudaStream_t s = nullptr;
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::uint32_t seed = 1;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{4096},
                            std::size_t{65537}, std::size_t{1} << 20}) {
    for (std::size_t off : {std::size_t{0}, std::size_t{3}, std::size_t{16}}) {
      const std::vector<unsigned char> src = random_bytes(bytes, seed++);
      const std::vector<unsigned char> fill = random_bytes(kCap, seed++);
      // host (mapped) -> device a
      std::memcpy(pinned + off, src.data(), bytes);
      // On s: a pageable cudaMemcpy may return before its DMA lands, and s does not wait for the
      // legacy stream, so a synchronous fill raced the copy below (seen under ctest -j8).
      GHT_CUDA_TRY(cudaMemcpyAsync(a, fill.data(), kCap, cudaMemcpyHostToDevice, s));
      kc::sm_copy(a + off, pinned_dev + off, bytes, s);
      // device a -> device b
      GHT_CUDA_TRY(cudaMemcpyAsync(b, fill.data(), kCap, cudaMemcpyHostToDevice, s));
      kc::sm_copy(b + off, a + off, bytes, s);
      GHT_CUDA_TRY(cudaStreamSynchronize(s));
      std::vector<unsigned char> got(kCap);
      GHT_CUDA_TRY(cudaMemcpy(got.data(), b, kCap, cudaMemcpyDeviceToHost));
      std::vector<unsigned char> want = fill;
      std::memcpy(want.data() + off, src.data(), bytes);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kCap), 0) << bytes << " bytes at offset " << off << " (h2d, d2d)";
      // device b -> host (mapped)
      std::memcpy(pinned, fill.data(), kCap);
      kc::sm_copy(pinned_dev + off, b + off, bytes, s);
      GHT_CUDA_TRY(cudaStreamSynchronize(s));
      ASSERT_EQ(std::memcmp(pinned, want.data(), kCap), 0) << bytes << " bytes at offset " << off << " (d2h)";
    }
  }
  kc::sm_copy(a, b, 0, s);  // nothing to do, no launch
  GHT_CUDA_TRY(cudaStreamSynchronize(s));
  GHT_CUDA_TRY(cudaStreamDestroy(s));
  GHT_CUDA_TRY(cudaFree(a));
  GHT_CUDA_TRY(cudaFree(b));
  GHT_CUDA_TRY(cudaFreeHost(pinned));
}

TEST(CudaSmCopy, PageableMemoryHasNoDeviceAliasOverPcie) {
  GHT_REQUIRE_GPU();
  int pageable = 0;
  GHT_CUDA_TRY(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0));
  std::vector<char> v(4096);
  void* d = kc::mapped_device_pointer(v.data());
  if (pageable != 0) {
    EXPECT_EQ(d, v.data());  // c2c: the GPU reads plain memory at its own address
  } else {
    EXPECT_EQ(d, nullptr);
  }
  EXPECT_EQ(kc::mapped_device_pointer(nullptr), nullptr);
}

}  // namespace
