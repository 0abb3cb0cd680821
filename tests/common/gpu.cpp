#include "common/gpu.hpp"

#include <cstdlib>
#include <cstring>

#ifdef GHT_HAVE_CUDA
#include "tier/cuda_check.hpp"
#endif

namespace ght::test {

int cuda_device_count(std::string* why) {
#ifdef GHT_HAVE_CUDA
  std::string reason;
  const int n = ght::detail::cuda_device_count(&reason);
  if (n == 0 && why) *why = reason;
  return n;
#else
  if (why) *why = "built without CUDA";
  return 0;
#endif
}

bool gpu_required_by_env() {
  const char* v = std::getenv("GHT_TEST_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace ght::test
