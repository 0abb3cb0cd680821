#include "alloc/device_pool.hpp"

#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include "alloc/detail/cuda_device.hpp"
#endif

namespace ght::alloc {

#ifdef GHT_HAVE_CUDA

namespace {
cudaMemPool_t as_pool(void* p) { return static_cast<cudaMemPool_t>(p); }
std::uint64_t pool_attr(void* pool, cudaMemPoolAttr attr) {
  unsigned long long v = 0;  // the attribute type is cuuint64_t
  GHT_CUDA_TRY(cudaMemPoolGetAttribute(as_pool(pool), attr, &v));
  return v;
}
}  // namespace

device_pool::device_pool(DevicePoolOptions options)
    : opts_(options), name_("device_pool(dev " + std::to_string(options.device) + ")") {
  detail::check_device(opts_.device, "device_pool");
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = opts_.device;
  cudaMemPool_t pool = nullptr;
  GHT_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
  pool_ = pool;
  unsigned long long threshold = opts_.release_threshold;
  const cudaError_t err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (err != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);
    pool_ = nullptr;
    GHT_CUDA_TRY(err);
  }
}

device_pool::~device_pool() {
  // Blocks still live or with pending frees keep the pool alive inside CUDA until they are
  // freed; destroying here never invalidates them.
  if (pool_ != nullptr) (void)cudaMemPoolDestroy(as_pool(pool_));
}

void* device_pool::do_allocate(std::size_t bytes, std::size_t, stream_t stream, TensorClass) {
  // The pool decides the device, so no device switch is needed: CUDA allows allocating from a
  // pool on a stream of another device.
  void* p = nullptr;
  const cudaError_t err =
      cudaMallocFromPoolAsync(&p, bytes, as_pool(pool_), static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) detail::throw_alloc_error(err, name_, "cudaMallocFromPoolAsync", bytes);
  return p;
}

void device_pool::do_deallocate(void* p, std::size_t, std::size_t, stream_t stream, TensorClass) {
  GHT_CUDA_TRY(cudaFreeAsync(p, static_cast<cudaStream_t>(stream)));
}

PoolStats device_pool::stats() const {
  PoolStats s;
  s.reserved = pool_attr(pool_, cudaMemPoolAttrReservedMemCurrent);
  s.used = pool_attr(pool_, cudaMemPoolAttrUsedMemCurrent);
  s.reserved_high = pool_attr(pool_, cudaMemPoolAttrReservedMemHigh);
  s.used_high = pool_attr(pool_, cudaMemPoolAttrUsedMemHigh);
  return s;
}

void device_pool::trim(std::size_t keep_bytes) {
  GHT_CUDA_TRY(cudaMemPoolTrimTo(as_pool(pool_), keep_bytes));
}

std::uint64_t device_pool::physical_free() const noexcept {
  const std::uint64_t free_b = detail::device_free_bytes(opts_.device);
  if (free_b == UINT64_MAX) return free_b;
  try {
    const PoolStats s = stats();
    return free_b + (s.reserved > s.used ? s.reserved - s.used : 0);
  } catch (...) {
    return free_b;
  }
}

#else  // !GHT_HAVE_CUDA

device_pool::device_pool(DevicePoolOptions options) : opts_(options) {
  GHT_FAIL("device_pool: ghtier was built without CUDA (configure with a CUDA toolkit and "
           "GHT_ENABLE_CUDA=ON)");
}
device_pool::~device_pool() = default;
void* device_pool::do_allocate(std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("device_pool: built without CUDA");
}
void device_pool::do_deallocate(void*, std::size_t, std::size_t, stream_t, TensorClass) {
  GHT_FAIL("device_pool: built without CUDA");
}
PoolStats device_pool::stats() const { GHT_FAIL("device_pool: built without CUDA"); }
void device_pool::trim(std::size_t) { GHT_FAIL("device_pool: built without CUDA"); }
std::uint64_t device_pool::physical_free() const noexcept { return 0; }

#endif

double device_pool::fragmentation() const {
  const PoolStats s = stats();
  if (s.reserved == 0) return 0.0;
  return static_cast<double>(s.reserved - std::min(s.used, s.reserved)) /
         static_cast<double>(s.reserved);
}

}  // namespace ght::alloc
