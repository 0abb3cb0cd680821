#pragma once
// Test helpers for alloc/: address-derived fill patterns, checked on free, for host and device
// memory, and log-uniform random sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloc/resource.hpp"
#include "alloc/tiered.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ght::test {

/// The pattern value at absolute address `a`: mixing the address means two blocks that
/// overlap, or a block handed out twice, disagree at the overlap.
inline std::uint64_t pattern_mix(std::uintptr_t a) noexcept {
  std::uint64_t x = static_cast<std::uint64_t>(a) * 0x9E3779B97F4A7C15ULL;
  return x ^ (x >> 31) ^ 0x5bd1e995ULL;
}

/// Pattern bytes for [p, p+n) as they would sit at address `addr`: bytes until an 8-aligned
/// address, then whole words, then bytes.
inline void pattern_bytes(std::uintptr_t addr, std::byte* out, std::size_t n) {
  std::size_t i = 0;
  for (; i < n && ((addr + i) & 7) != 0; ++i) out[i] = static_cast<std::byte>(pattern_mix(addr + i));
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = pattern_mix(addr + i);
    std::memcpy(out + i, &w, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<std::byte>(pattern_mix(addr + i));
}

/// The windows of a block that get the pattern: all of it up to 128 KiB, else the first and
/// last 4 KiB and three 256-byte windows between (disjoint). Two overlapping blocks always
/// overlap at the start of one of them, which the head window covers; sampling keeps
/// multi-megabyte blocks at a few pages each (with huge pages, every touched 2 MiB is zeroed).
inline std::vector<std::pair<std::size_t, std::size_t>> pattern_windows(std::size_t n) {
  constexpr std::size_t kFull = std::size_t{128} << 10;
  if (n <= kFull) return {{0, n}};
  std::vector<std::pair<std::size_t, std::size_t>> w;
  w.emplace_back(0, 4096);
  for (std::size_t k = 1; k < 4; ++k) w.emplace_back((k * (n / 4)) & ~std::size_t{7}, 256);
  w.emplace_back(n - 4096, 4096);
  return w;
}

/// Whether `p` is device memory the CPU cannot touch (copy through cudaMemcpy then).
inline bool on_device(const alloc::memory_resource& r, const void* p) {
  if (const auto* t = dynamic_cast<const alloc::tiered_allocator*>(&r)) {
    const alloc::memory_resource* base = t->tier_resource(t->tier_of(p));
    return base != nullptr && !base->host_accessible();
  }
  return !r.host_accessible();
}

inline void fill_pattern(const alloc::memory_resource& r, void* p, std::size_t n) {
  const bool dev = on_device(r, p);
  std::vector<std::byte> buf;
  for (const auto& [off, len] : pattern_windows(n)) {
    auto* dst = static_cast<std::byte*>(p) + off;
    const auto addr = reinterpret_cast<std::uintptr_t>(dst);
    if (!dev) {
      pattern_bytes(addr, dst, len);
      continue;
    }
#ifdef GHT_HAVE_CUDA
    buf.resize(len);
    pattern_bytes(addr, buf.data(), len);
    ASSERT_EQ(cudaMemcpy(dst, buf.data(), len, cudaMemcpyHostToDevice), cudaSuccess);
#else
    FAIL() << "device memory in a build without CUDA";
#endif
  }
}

/// Empty string when the pattern is intact, else where it is broken.
inline std::string check_pattern(const alloc::memory_resource& r, const void* p, std::size_t n) {
  const bool dev = on_device(r, p);
  std::vector<std::byte> want, got;
  for (const auto& [off, len] : pattern_windows(n)) {
    const auto* src = static_cast<const std::byte*>(p) + off;
    want.resize(len);
    pattern_bytes(reinterpret_cast<std::uintptr_t>(src), want.data(), len);
    const std::byte* have = src;
    if (dev) {
#ifdef GHT_HAVE_CUDA
      got.resize(len);
      if (cudaMemcpy(got.data(), src, len, cudaMemcpyDeviceToHost) != cudaSuccess) {
        return "cudaMemcpy of the pattern failed";
      }
      have = got.data();
#else
      return "device memory in a build without CUDA";
#endif
    }
    if (std::memcmp(have, want.data(), len) != 0) {
      std::size_t i = 0;
      while (have[i] == want[i]) ++i;
      return "pattern broken at byte " + std::to_string(off + i) + " of a " + std::to_string(n) +
             "-byte block at " + std::to_string(reinterpret_cast<std::uintptr_t>(p));
    }
  }
  return {};
}

/// Sizes log-uniform in [lo, hi]: every order of magnitude equally likely, as in real use.
class log_uniform {
 public:
  log_uniform(std::size_t lo, std::size_t hi)
      : dist_(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi) + 1.0)),
        lo_(lo), hi_(hi) {}
  template <typename Rng>
  std::size_t operator()(Rng& rng) {
    const auto v = static_cast<std::size_t>(std::exp(dist_(rng)));
    return std::clamp(v, lo_, hi_);
  }

 private:
  std::uniform_real_distribution<double> dist_;
  std::size_t lo_, hi_;
};

}  // namespace ght::test
