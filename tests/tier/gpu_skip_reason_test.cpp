// Why GPU tests skip (tests/common/gpu.hpp): with no CUDA device the reason is CUDA's own, and on
// a machine without an NVIDIA driver, where the CUDA runtime reports "driver version is
// insufficient", it says first that no driver is loaded. GHT_TEST_REQUIRE_GPU=1 is untouched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "common/expect.hpp"
#include "common/gpu.hpp"

namespace {

TEST(GpuSkipReason, NamesWhyThereIsNoDevice) {
  std::string why;
  const int n = ght::test::cuda_device_count(&why);
  if (n > 0) {
    EXPECT_TRUE(why.empty()) << why;
    return;
  }
  ASSERT_FALSE(why.empty()) << "no CUDA device and no reason";
#ifdef GHT_HAVE_CUDA
  EXPECT_CONTAINS(why, "cudaGetDeviceCount");
  const bool driver = ::access("/proc/driver/nvidia/version", F_OK) == 0;
  if (driver) {
    EXPECT_EQ(why.find("no NVIDIA driver"), std::string::npos) << why;
  } else {
    EXPECT_EQ(why.rfind("no NVIDIA driver is loaded; cudaGetDeviceCount: ", 0), 0u) << why;
  }
#else
  EXPECT_EQ(why, "built without CUDA");
#endif
}

}  // namespace
