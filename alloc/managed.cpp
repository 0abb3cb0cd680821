#include "alloc/managed.hpp"

#include "alloc/detail/host_memory.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include "alloc/detail/cuda_device.hpp"
#endif

namespace ght::alloc {

namespace {
std::string managed_name(const ManagedOptions& o) {
  return "managed(" + std::string(to_string(o.preferred)) + ", dev " + std::to_string(o.device) +
         ")";
}
}  // namespace

#ifdef GHT_HAVE_CUDA

managed::managed(ManagedOptions options) : opts_(options), name_(managed_name(options)) {
  detail::check_device(opts_.device, "managed");
  GHT_EXPECTS(opts_.numa_node >= -1,
              "managed: NUMA node " + std::to_string(opts_.numa_node) + " is invalid");
}

void* managed::do_allocate(std::size_t bytes, std::size_t, stream_t, TensorClass) {
  detail::device_guard guard(opts_.device);
  void* p = nullptr;
  cudaError_t err = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
  if (err != cudaSuccess) detail::throw_alloc_error(err, name_, "cudaMallocManaged", bytes);
  cudaMemLocation preferred{};
  if (opts_.preferred == TierKind::host) {
    preferred.type = opts_.numa_node >= 0 ? cudaMemLocationTypeHostNuma : cudaMemLocationTypeHost;
    preferred.id = opts_.numa_node >= 0 ? opts_.numa_node : 0;
  } else {
    preferred.type = cudaMemLocationTypeDevice;
    preferred.id = opts_.device;
  }
  err = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, preferred);
  if (err == cudaSuccess) {
    // The GPU as accessor keeps its mappings of host-resident pages, so kernels read them over
    // the link instead of faulting them over to HBM (and back when the CPU touches them).
    cudaMemLocation accessor{};
    accessor.type = cudaMemLocationTypeDevice;
    accessor.id = opts_.device;
    err = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, accessor);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaFree(p);
    detail::throw_alloc_error(err, name_, "cudaMemAdvise", bytes);
  }
  return p;
}

void managed::do_deallocate(void* p, std::size_t, std::size_t, stream_t, TensorClass) {
  detail::device_guard guard(opts_.device);
  GHT_CUDA_TRY(cudaFree(p));
}

std::uint64_t managed::physical_free() const noexcept {
  return opts_.preferred == TierKind::host ? detail::numa_node_free_bytes(opts_.numa_node)
                                           : detail::device_free_bytes(opts_.device);
}

#else  // !GHT_HAVE_CUDA

managed::managed(ManagedOptions options) : opts_(options), name_(managed_name(options)) {
  GHT_FAIL("managed: ghtier was built without CUDA (configure with a CUDA toolkit and "
           "GHT_ENABLE_CUDA=ON)");
}
void* managed::do_allocate(std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("managed: built without CUDA");
}
void managed::do_deallocate(void*, std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("managed: built without CUDA");
}
std::uint64_t managed::physical_free() const noexcept { return 0; }

#endif

}  // namespace ght::alloc
