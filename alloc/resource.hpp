#pragma once
/**
 * @file resource.hpp
 * @brief The memory-resource interface every allocator in alloc/ implements (RMM style).
 *
 * Public allocate()/deallocate() check their arguments, then call the private virtual
 * do_allocate()/do_deallocate(). Adaptors take an upstream resource, do their bookkeeping and
 * forward the call; the tiered allocator sits on top of both.
 *
 * Contract shared by every resource (tests/alloc/contract_test.cpp):
 *   - allocate(0, ...) returns nullptr and deallocate(nullptr, ...) does nothing;
 *   - alignment is a power of two no larger than max_alignment(); the pointer honours it;
 *   - deallocate() takes the same bytes, alignment and class that allocate() was given;
 *   - allocation failure for lack of memory or budget throws ght::out_of_memory and leaves the
 *     resource unchanged and usable.
 */
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tier/types.hpp"

struct CUstream_st;

namespace ght::alloc {

/// A CUDA stream. It is the same type as cudaStream_t, declared opaquely so host-only code
/// compiles without the CUDA headers; nullptr is the default (legacy) stream.
using stream_t = CUstream_st*;

/// Alignment used when the caller gives none: what cudaMalloc guarantees.
inline constexpr std::size_t kDefaultAlignment = 256;

class memory_resource {
 public:
  memory_resource() = default;
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;
  virtual ~memory_resource() = default;

  /**
   * @brief Allocate `bytes` aligned to `alignment`, ordered on `stream`.
   * @param cls the tensor class, for statistics and logging (resources themselves ignore it)
   * @return nullptr when bytes == 0
   * @throws ght::logic_error if alignment is not a power of two or exceeds max_alignment()
   * @throws ght::out_of_memory when the memory or a budget is exhausted
   */
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = kDefaultAlignment,
                               stream_t stream = nullptr, TensorClass cls = TensorClass::other);

  /**
   * @brief Return a block. Arguments must match the allocate() call that produced `p`.
   * @throws ght::logic_error for an invalid alignment; ght::cuda_error if CUDA fails
   */
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = kDefaultAlignment,
                  stream_t stream = nullptr, TensorClass cls = TensorClass::other);

  /// The tier this resource's memory belongs to.
  [[nodiscard]] virtual TierKind tier() const noexcept = 0;
  /// The tier of one live block; differs from tier() only for resources spanning tiers.
  [[nodiscard]] virtual TierKind tier_of(const void* /*p*/) const noexcept { return tier(); }
  /// A short name for messages and logs, e.g. "pinned_host(node 0)".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Largest alignment allocate() accepts.
  [[nodiscard]] virtual std::size_t max_alignment() const noexcept { return kDefaultAlignment; }
  /// Whether the CPU may dereference pointers from this resource.
  [[nodiscard]] virtual bool host_accessible() const noexcept = 0;
  /// Bytes the underlying memory could still provide (free HBM, free memory of the NUMA node);
  /// UINT64_MAX when unknown. An estimate used in out-of-memory messages.
  [[nodiscard]] virtual std::uint64_t physical_free() const noexcept { return UINT64_MAX; }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                            TensorClass cls) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                             TensorClass cls) = 0;
};

/// True when `a` is a power of two (0 is not).
[[nodiscard]] constexpr bool is_pow2(std::size_t a) noexcept { return a != 0 && (a & (a - 1)) == 0; }
/// Round `n` up to a multiple of the power of two `a`.
[[nodiscard]] constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept {
  return (n + a - 1) & ~(a - 1);
}

}  // namespace ght::alloc
