// GHT_HOST_MEMORY=pinned where there is no CUDA device: making the pinned resource is a
// configuration error that names the option, CUDA's reason and the way out (directly and through
// the C ABI), not a raw CUDA error with a source location. A machine with a GPU runs this test
// with CUDA_VISIBLE_DEVICES= (no device visible).
#include <gtest/gtest.h>

#include <string>

#include "alloc/pinned_host.hpp"
#include "common/expect.hpp"
#include "common/gpu.hpp"
#include "ght/ght.h"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace {

TEST(PinnedWithoutGpu, IsAConfigErrorNamingTheWayOut) {
#ifndef GHT_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: pinned_host registers nothing and needs no device";
#else
  std::string why;
  if (ght::test::cuda_device_count(&why) > 0) {
    GTEST_SKIP() << "a CUDA device is visible (CUDA_VISIBLE_DEVICES= hides it for this test)";
  }
  const std::string expected =
      "GHT_HOST_MEMORY=pinned needs a CUDA device (none found: " + why + "); use GHT_HOST_MEMORY=system or auto";
  const std::string msg =
      ght::test::error_of<ght::config_error>([] { ght::alloc::pinned_host r(ght::alloc::PinnedHostOptions{}); });
  EXPECT_CONTAINS(msg, expected);

  ASSERT_EQ(ght_finalize(), 0);
  ght::config::cfg().set_flag("GHT_HOST_MEMORY", "pinned");
  EXPECT_EQ(ght_init(), -1);
  const std::string c_abi = ght_last_error();
  ght::config::cfg().set_flag("GHT_HOST_MEMORY", "auto");
  EXPECT_CONTAINS(c_abi, expected);
  EXPECT_EQ(c_abi.find(".cpp:"), std::string::npos) << c_abi;
  EXPECT_EQ(ght_init(), 0) << ght_last_error();  // GHT_HOST_MEMORY=auto: system memory
  EXPECT_EQ(ght_finalize(), 0);
#endif
}

}  // namespace
