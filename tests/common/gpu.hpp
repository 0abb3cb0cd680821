#pragma once
/**
 * @file gpu.hpp
 * @brief GPU test gating. GHT_REQUIRE_GPU() skips a test with a message when no CUDA device
 * exists. With GHT_TEST_REQUIRE_GPU=1 in the environment (set by bench/run_gpu.sh on the GPU
 * machine) a missing device is a failure instead, so GPU tests can never pass vacuously there.
 */
#include <gtest/gtest.h>

#include <string>

namespace ght::test {
/// Number of usable CUDA devices (0 in a CPU-only build); `why` explains a zero.
int cuda_device_count(std::string* why = nullptr);
bool gpu_required_by_env();
}  // namespace ght::test

#define GHT_REQUIRE_GPU()                                                                  \
  do {                                                                                     \
    std::string ght_why_;                                                                  \
    if (::ght::test::cuda_device_count(&ght_why_) == 0) {                                  \
      if (::ght::test::gpu_required_by_env()) {                                            \
        FAIL() << "GHT_TEST_REQUIRE_GPU=1 but no CUDA device: " << ght_why_;               \
      }                                                                                    \
      GTEST_SKIP() << "no CUDA device (" << ght_why_ << "); GPU test skipped";             \
    }                                                                                      \
  } while (0)
