#include "alloc/pinned_host.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "tier/config.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::alloc {

namespace {
PinnedHostOptions checked(PinnedHostOptions o) {
  GHT_EXPECTS(o.numa_node >= -1,
              "pinned_host: NUMA node " + std::to_string(o.numa_node) + " is invalid");
  GHT_EXPECTS(o.numa_node == -1 || detail::numa_node_usable(o.numa_node),
              "pinned_host: NUMA node " + std::to_string(o.numa_node) +
                  " does not exist, has no memory or is not allowed for this process");
  GHT_EXPECTS(o.threads >= 0, "pinned_host: threads must be >= 0, got " + std::to_string(o.threads));
  GHT_EXPECTS(o.register_chunk_bytes == 0 || o.register_chunk_bytes % detail::kHugePageBytes == 0,
              "pinned_host: register_chunk_bytes must be a multiple of 2 MiB, got " +
                  std::to_string(o.register_chunk_bytes));
  return o;
}

#ifdef GHT_HAVE_CUDA
constexpr unsigned kRegisterFlags = cudaHostRegisterMapped | cudaHostRegisterPortable;

[[noreturn]] void throw_register_error(cudaError_t err, std::size_t len) {
  (void)cudaGetLastError();
  const std::string what = "pinned_host: cudaHostRegister of " + config::format_bytes(len) +
                           " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) throw ght::out_of_memory(what);
  throw ght::cuda_error(what);
}
#endif
}  // namespace

pinned_host::pinned_host(PinnedHostOptions options)
    : opts_(checked(options)),
      name_("pinned_host" +
            (opts_.numa_node >= 0 ? "(node " + std::to_string(opts_.numa_node) + ")" : "")),
      small_([this](std::size_t n) { return map_registered(n); },
             [this](void* p, std::size_t n) { (void)unmap_registered(p, n); }),
      large_(opts_.cache, [this](std::size_t n) { return map_registered(n); },
             [this](void* p, std::size_t n) { return unmap_registered(p, n); },
             [node = opts_.numa_node] { return detail::numa_node_free_bytes(node); }) {
  threads_ = opts_.threads > 0 ? opts_.threads : detail::usable_cpus();
#ifdef GHT_HAVE_CUDA
  std::string why;
  const int count = ght::detail::cuda_device_count(&why);
  if (count == 0) {
    throw ght::config_error("GHT_HOST_MEMORY=pinned needs a CUDA device (none found: " + why +
                            "); use GHT_HOST_MEMORY=system or auto");
  }
  GHT_EXPECTS(opts_.device >= 0 && opts_.device < count,
              "pinned_host: CUDA device " + std::to_string(opts_.device) + " does not exist (" +
                  std::to_string(count) + " devices)");
  int same = 0;
  GHT_CUDA_TRY(cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                      opts_.device));
  registered_ = true;
  same_address_ = same != 0;
  // Chunks registered separately get device addresses of their own; only where the device
  // address equals the host address do the chunks form one contiguous device range.
  chunked_ = same_address_ && opts_.register_chunk_bytes > 0;
#endif
}

std::uint64_t pinned_host::physical_free() const noexcept {
  // Cached free blocks are this resource's to hand out (or to give back under pressure).
  return detail::numa_node_free_bytes(opts_.numa_node) + large_.cached_bytes();
}

void* pinned_host::map_registered(std::size_t bytes) {
  if (!registered_) return detail::map_host(bytes, opts_.numa_node, 0, opts_.huge_pages);
#ifdef GHT_HAVE_CUDA
  const std::size_t len = detail::mapped_length(bytes);
  const int touch = opts_.prefault ? detail::touch_threads_for(len, threads_) : 0;
  char* p = static_cast<char*>(detail::map_host(bytes, opts_.numa_node, touch, opts_.huge_pages));
  const std::size_t chunk =
      chunked_ && len > opts_.register_chunk_bytes ? opts_.register_chunk_bytes : len;
  const auto n = static_cast<std::int64_t>((len + chunk - 1) / chunk);
  std::vector<cudaError_t> errs(static_cast<std::size_t>(n), cudaSuccess);
  const int device = opts_.device;
  const auto reg = [&](std::int64_t i) {
    const std::size_t off = static_cast<std::size_t>(i) * chunk;
    // A fresh thread has device 0 current; registering from it would create a context there,
    // so select ours first.
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaHostRegister(p + off, std::min(chunk, len - off), kRegisterFlags);
    errs[static_cast<std::size_t>(i)] = e;
  };
  if (n == 1) {
    reg(0);
  } else {
    detail::parallel_slices(n, threads_, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) reg(i);
    });
  }
  const auto bad = std::find_if(errs.begin(), errs.end(), [](cudaError_t e) { return e != cudaSuccess; });
  if (bad != errs.end()) {
    const cudaError_t err = *bad;
    for (std::int64_t i = 0; i < n; ++i) {
      if (errs[static_cast<std::size_t>(i)] == cudaSuccess) {
        (void)cudaHostUnregister(p + static_cast<std::size_t>(i) * chunk);
      }
    }
    detail::unmap_host(p, bytes);
    throw_register_error(err, len);
  }
  if (!same_address_) {
    std::unique_lock lock(ranges_mu_);
    ranges_[reinterpret_cast<std::uintptr_t>(p)] = len;
  }
  return p;
#else
  return nullptr;  // unreachable: registered_ is false without CUDA
#endif
}

bool pinned_host::unmap_registered(void* p, std::size_t bytes) noexcept {
  bool ok = true;
#ifdef GHT_HAVE_CUDA
  if (registered_) {
    const std::size_t len = detail::mapped_length(bytes);
    const std::size_t chunk =
        chunked_ && len > opts_.register_chunk_bytes ? opts_.register_chunk_bytes : len;
    for (std::size_t off = 0; off < len; off += chunk) {
      if (cudaHostUnregister(static_cast<char*>(p) + off) != cudaSuccess) {
        (void)cudaGetLastError();
        ok = false;
      }
    }
    if (!same_address_) {
      std::unique_lock lock(ranges_mu_);
      ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
  }
#endif
  detail::unmap_host(p, bytes);
  return ok;
}

void* pinned_host::device_pointer(const void* p) const {
  if (!registered_ || same_address_ || p == nullptr) return const_cast<void*>(p);
#ifdef GHT_HAVE_CUDA
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t base = 0;
  {
    std::shared_lock lock(ranges_mu_);
    auto it = ranges_.upper_bound(addr);
    GHT_EXPECTS(it != ranges_.begin(), "pinned_host::device_pointer: pointer is not from this resource");
    --it;
    GHT_EXPECTS(addr < it->first + it->second,
                "pinned_host::device_pointer: pointer is not from this resource");
    base = it->first;
  }
  void* d = nullptr;
  GHT_CUDA_TRY(cudaHostGetDevicePointer(&d, reinterpret_cast<void*>(base), 0));
  return static_cast<char*>(d) + (addr - base);
#else
  return const_cast<void*>(p);
#endif
}

void* pinned_host::do_allocate(std::size_t bytes, std::size_t alignment, stream_t, TensorClass) {
  if (detail::small_block_pool::handles(bytes, alignment)) return small_.allocate(bytes, alignment);
  return large_.allocate(bytes);
}

void pinned_host::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t,
                                TensorClass) {
  if (detail::small_block_pool::handles(bytes, alignment)) {
    small_.deallocate(p, bytes, alignment);
    return;
  }
  // The block is cached or released either way; a failure may be an older block's, evicted to
  // make room.
  if (!large_.deallocate(p, bytes)) {
    throw ght::cuda_error("pinned_host: cudaHostUnregister failed releasing a block to the OS");
  }
}

}  // namespace ght::alloc
