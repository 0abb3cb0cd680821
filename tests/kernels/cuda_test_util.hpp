#pragma once
/**
 * @file cuda_test_util.hpp
 * @brief Shared helpers of the GPU kernel tests (tests/kernels/NAME_test.cu): random bf16-exact
 * inputs, an RAII device buffer, and the llm.c-style comparison `|got - ref| <= tol + |ref|·eps`
 * that reports the first mismatches and the worst error.
 *
 * Inputs are drawn in fp32 and rounded to bf16 once, so the CPU reference (fp32) and the kernel
 * (bf16 storage) see bit-identical inputs; only the kernel's own rounding is measured.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tier/cuda_check.hpp"

namespace ght::test {

using bf16 = __nv_bfloat16;

[[nodiscard]] inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

/// Uniform values in [lo, hi), rounded to bf16, never exactly zero (a zero would hide bugs
/// that drop a term).
[[nodiscard]] inline std::vector<float> random_bf16_values(std::size_t n, std::uint32_t seed,
                                                           float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    float r = 0.0f;
    do {
      r = round_bf16(dist(gen));
    } while (r == 0.0f);
    x = r;
  }
  return v;
}

[[nodiscard]] inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

[[nodiscard]] inline std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

/// Owning device allocation of `n` elements of T (cudaMalloc; tests only).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_ > 0) GHT_CUDA_TRY(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) (void)cudaFree(p_);
  }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), n_);
    if (n_ > 0) GHT_CUDA_TRY(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    legacy_stream_done();
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) GHT_CUDA_TRY(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Fill with a byte pattern, so unwritten outputs show up as garbage rather than zeros.
  void poison(int byte = 0x7f) {
    if (n_ > 0) GHT_CUDA_TRY(cudaMemset(p_, byte, n_ * sizeof(T)));
    legacy_stream_done();
  }
  [[nodiscard]] T* get() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }

 private:
  // cudaMemset, and cudaMemcpy from pageable memory, may return before the device has finished,
  // and they run on the legacy default stream, which TestStream's non-blocking streams do not
  // wait for: without this, a kernel could read the buffer before the upload lands, or write its
  // output before the poison does (seen on the H200 with four GPU test processes at once).
  static void legacy_stream_done() { GHT_CUDA_TRY(cudaStreamSynchronize(nullptr)); }

  T* p_ = nullptr;
  std::size_t n_ = 0;
};

[[nodiscard]] inline DeviceBuffer<bf16> upload_bf16(const std::vector<float>& v) {
  return DeviceBuffer<bf16>(to_bf16(v));
}
[[nodiscard]] inline std::vector<float> download_f32(const DeviceBuffer<bf16>& d) {
  return to_f32(d.download());
}
[[nodiscard]] inline std::vector<float> download_f32(const DeviceBuffer<float>& d) {
  return d.download();
}

/// Largest |v| (for tolerances relative to a tensor's scale after long bf16 chains).
[[nodiscard]] inline float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// Compare element-wise with |got - ref| <= tol + |ref|·eps. NaN/Inf in `got` always fails.
/// On failure the message lists the first mismatches and the worst error (index and values).
[[nodiscard]] inline ::testing::AssertionResult all_close(const std::string& what,
                                                          const std::vector<float>& got,
                                                          const std::vector<float>& ref,
                                                          float tol, float eps) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs reference "
                                         << ref.size();
  }
  std::size_t bad = 0;
  std::ostringstream first;
  double worst = -1.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double bound = tol + std::fabs(ref[i]) * eps;
    const bool ok = std::isfinite(got[i]) && err <= bound;
    if (!std::isfinite(got[i]) || err > worst) {
      worst = std::isfinite(got[i]) ? err : INFINITY;
      worst_i = i;
    }
    if (!ok) {
      if (bad < 8) {
        first << "\n  [" << i << "] got " << got[i] << " ref " << ref[i] << " |err| " << err
              << " > " << bound;
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << ref.size() << " mismatches (tol " << tol << ", eps "
         << eps << "); first:" << first.str() << "\n  worst [" << worst_i << "] got "
         << got[worst_i] << " ref " << ref[worst_i] << " |err| " << worst;
}

/// Same, for integer outputs (indices, counts): exact equality.
template <typename I>
[[nodiscard]] ::testing::AssertionResult all_equal(const std::string& what,
                                                   const std::vector<I>& got,
                                                   const std::vector<I>& ref) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs reference "
                                         << ref.size();
  }
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (got[i] != ref[i]) {
      if (bad < 8) first << "\n  [" << i << "] got " << got[i] << " ref " << ref[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size()
                                       << " differ; first:" << first.str();
}

/// A non-default stream for one test, synchronised and destroyed at scope exit.
class TestStream {
 public:
  TestStream() { GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  ~TestStream() {
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
  }
  [[nodiscard]] cudaStream_t get() const { return s_; }
  void sync() const { GHT_CUDA_TRY(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace ght::test
