#include "common/gpu.hpp"

#include <cstdlib>
#include <cstring>

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ght::test {

int cuda_device_count(std::string* why) {
#ifdef GHT_HAVE_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount returned 0";
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
