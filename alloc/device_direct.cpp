#include "alloc/device_direct.hpp"

#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include "alloc/detail/cuda_device.hpp"
#endif

namespace ght::alloc {

#ifdef GHT_HAVE_CUDA

device_direct::device_direct(int device)
    : device_(device), name_("device_direct(dev " + std::to_string(device) + ")") {
  detail::check_device(device_, "device_direct");
}

void* device_direct::do_allocate(std::size_t bytes, std::size_t, stream_t, TensorClass) {
  detail::device_guard guard(device_);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) detail::throw_alloc_error(err, name_, "cudaMalloc", bytes);
  return p;
}

void device_direct::do_deallocate(void* p, std::size_t, std::size_t, stream_t, TensorClass) {
  detail::device_guard guard(device_);
  GHT_CUDA_TRY(cudaFree(p));
}

std::uint64_t device_direct::physical_free() const noexcept {
  return detail::device_free_bytes(device_);
}

#else  // !GHT_HAVE_CUDA

device_direct::device_direct(int device) : device_(device) {
  GHT_FAIL("device_direct: ghtier was built without CUDA (configure with a CUDA toolkit and "
           "GHT_ENABLE_CUDA=ON)");
}
void* device_direct::do_allocate(std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("device_direct: built without CUDA");
}
void device_direct::do_deallocate(void*, std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("device_direct: built without CUDA");
}
std::uint64_t device_direct::physical_free() const noexcept { return 0; }

#endif

}  // namespace ght::alloc
