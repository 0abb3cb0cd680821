#include "optimizer/accumulate.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_simd.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/host_triad.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

namespace {

// A parallel region costs a few microseconds; below this many elements per thread it does not
// pay. Fewer threads never change the result (each element is one addition by one thread).
constexpr std::size_t kMinPerThread = 1 << 15;

// Each thread's contiguous range through the Highway loop (detail/adamw_simd.cpp).
void acc_team(float* dst, const void* src, GradType type, std::size_t n, bool assign, int threads) {
  const std::size_t esize = grad_type_size(type);
  parallel_pinned(accumulate_team_size(n, threads), [&](int tid, int team) {
    const Range r = thread_range(n, tid, team);
    if (r.end > r.begin) {
      simd::accumulate(dst + r.begin, static_cast<const char*>(src) + r.begin * esize, type,
                       r.end - r.begin, assign);
    }
  });
}

}  // namespace

int accumulate_team_size(std::size_t n, int threads) {
  const int want = resolve_cpu_threads(threads);
  const std::size_t useful = (n + kMinPerThread - 1) / kMinPerThread;
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(want, useful)));
}

std::size_t place_accumulator(float* dst, std::size_t n, int threads) {
  if (n == 0) return 0;
  GHT_EXPECTS(dst != nullptr, "place_accumulator: null dst");
  (void)tier::advise_huge_pages(dst, n * sizeof(float));
  parallel_pinned(accumulate_team_size(n, threads), [&](int tid, int team) {
    const Range r = thread_range(n, tid, team);
    if (r.end > r.begin) std::memset(dst + r.begin, 0, (r.end - r.begin) * sizeof(float));
  });
  return tier::huge_page_bytes(dst, n * sizeof(float));
}

void accumulate(float* dst, const float* src, std::size_t n, int threads) {
  accumulate(dst, src, GradType::fp32, n, AccumulateMode::add, threads);
}

void accumulate(float* dst, const bf16* src, std::size_t n, int threads) {
  accumulate(dst, src, GradType::bf16, n, AccumulateMode::add, threads);
}

void accumulate(float* dst, const void* src, GradType type, std::size_t n, AccumulateMode mode,
                int threads) {
  if (n == 0) return;
  GHT_EXPECTS(dst != nullptr && src != nullptr, "accumulate: null dst or src");
  acc_team(dst, src, type, n, mode == AccumulateMode::assign, threads);
}

namespace detail {

void run_double_buffered(std::size_t n, std::size_t chunk, const StagingOps& ops) {
  GHT_EXPECTS(chunk > 0, "run_double_buffered: chunk must be > 0");
  if (n == 0) return;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  auto count_of = [&](std::size_t k) { return std::min(chunk, n - k * chunk); };
  ops.start_copy(0, 0, count_of(0));
  for (std::size_t k = 0; k < chunks; ++k) {
    const int slot = static_cast<int>(k % 2);
    // Slot (k+1)%2 last held chunk k-1, consumed synchronously in the previous iteration.
    if (k + 1 < chunks) ops.start_copy(1 - slot, (k + 1) * chunk, count_of(k + 1));
    ops.wait_copy(slot);
    ops.consume(slot, k * chunk, count_of(k));
  }
}

}  // namespace detail

GradStreamAccumulator::GradStreamAccumulator() : GradStreamAccumulator(Options{}) {}

GradStreamAccumulator::GradStreamAccumulator(Options opts, std::shared_ptr<alloc::tiered_allocator> alloc)
    : opts_(opts), alloc_(alloc ? std::move(alloc) : alloc::make_default_tiered_allocator()) {
  slot_bytes_ = opts_.staging_bytes;
  if (slot_bytes_ == 0) {
    slot_bytes_ = config::cfg()
                      .get_size(config::Key::GHT_STAGING_BYTES)
                      .resolve(0, "GHT_STAGING_BYTES");
  }
  // Whole cache lines of whole elements of either type.
  slot_bytes_ = std::max<std::size_t>(64, slot_bytes_ / 64 * 64);
  try {
    for (alloc::unique_block& s : slots_) {
      s = alloc::unique_block(*alloc_, slot_bytes_, {TensorClass::other, "accumulator.staging", TierKind::host, false});
    }
#ifdef GHT_HAVE_CUDA
    if (detail::gpu_available()) {
      cudaStream_t st = nullptr;
      GHT_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      copy_stream_ = st;
      for (CUevent_st*& e : copied_) {
        cudaEvent_t ev = nullptr;
        GHT_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        e = ev;
      }
      cudaEvent_t ev = nullptr;
      GHT_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      produced_ = ev;
    }
#endif
  } catch (...) {
    release();
    throw;
  }
}

GradStreamAccumulator::~GradStreamAccumulator() { release(); }

void GradStreamAccumulator::release() noexcept {
#ifdef GHT_HAVE_CUDA
  if (copy_stream_ != nullptr) (void)cudaStreamSynchronize(copy_stream_);
  for (CUevent_st*& e : copied_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
    e = nullptr;
  }
  if (produced_ != nullptr) (void)cudaEventDestroy(produced_);
  produced_ = nullptr;
  if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
  copy_stream_ = nullptr;
#endif
  for (alloc::unique_block& s : slots_) s.reset();
}

void GradStreamAccumulator::run(float* dst, const void* src, GradType type, std::size_t n,
                                AccumulateMode mode, CUstream_st* producer) {
  if (n == 0) return;
  GHT_EXPECTS(dst != nullptr && src != nullptr, "GradStreamAccumulator::run: null dst or src");
  const std::size_t esize = grad_type_size(type);
  const bool on_device = detail::is_device_memory(src);
  if (!on_device && !opts_.stage_host_sources) {
    accumulate(dst, src, type, n, mode, opts_.threads);
    return;
  }
  const auto* bytes = static_cast<const unsigned char*>(src);
  const std::size_t chunk = slot_bytes_ / esize;
  detail::StagingOps ops;
  if (on_device) {
#ifdef GHT_HAVE_CUDA
    // The copy stream must not read src before the producer has finished writing it.
    GHT_CUDA_TRY(cudaEventRecord(produced_, producer));
    GHT_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, produced_, 0));
    ops.start_copy = [&](int slot, std::size_t off, std::size_t count) {
      GHT_CUDA_TRY(cudaMemcpyAsync(slots_[slot].get(), bytes + off * esize, count * esize,
                                   cudaMemcpyDeviceToHost, copy_stream_));
      GHT_CUDA_TRY(cudaEventRecord(copied_[slot], copy_stream_));
    };
    ops.wait_copy = [&](int slot) { GHT_CUDA_TRY(cudaEventSynchronize(copied_[slot])); };
#else
    GHT_FAIL("GradStreamAccumulator: device source in a build without CUDA");
#endif
  } else {
    ops.start_copy = [&](int slot, std::size_t off, std::size_t count) {
      std::memcpy(slots_[slot].get(), bytes + off * esize, count * esize);
    };
    ops.wait_copy = [](int) {};
  }
  (void)producer;
  ops.consume = [&](int slot, std::size_t off, std::size_t count) {
    accumulate(dst + off, slots_[slot].get(), type, count, mode, opts_.threads);
  };
  detail::run_double_buffered(n, chunk, ops);
  bytes_staged_ += n * esize;
}

}  // namespace ght::optimizer
