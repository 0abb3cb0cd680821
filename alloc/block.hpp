#pragma once
/**
 * @file block.hpp
 * @brief unique_block: one allocation from a tiered_allocator, returned when the owner goes.
 *
 * The owner of a buffer that the optimizer or the trainer needs for its whole life (state,
 * staging, scratch) holds a unique_block instead of a raw pointer and a matching free call:
 *
 *   alloc::unique_block slots(*a, bytes, {TensorClass::other, "optimizer.dma_slots", TierKind::hbm, false});
 *   float* p = slots.as<float>();
 *
 * The block is freed on `stream` (the one given at allocation, or reset()'s): HBM frees are
 * ordered on it, host frees happen at once, so the owner first waits for GPU work that reads a
 * host block. Move-only.
 */
#include <cstddef>
#include <utility>

#include "alloc/tiered.hpp"

namespace ght::alloc {

class unique_block {
 public:
  unique_block() = default;
  /// @throws ght::out_of_memory (typed, with per-tier statistics) when no allowed tier has room
  unique_block(tiered_allocator& a, std::size_t bytes, const AllocRequest& request,
               stream_t stream = nullptr, std::size_t alignment = kDefaultAlignment)
      : alloc_(&a), p_(a.allocate(bytes, request, stream, alignment)), bytes_(bytes), stream_(stream) {
    if (p_ != nullptr) tier_ = a.tier_of(p_);
  }
  ~unique_block() { release(stream_); }
  unique_block(unique_block&& o) noexcept { swap(o); }
  unique_block& operator=(unique_block&& o) noexcept {
    if (this != &o) {
      release(stream_);
      swap(o);
    }
    return *this;
  }
  unique_block(const unique_block&) = delete;
  unique_block& operator=(const unique_block&) = delete;

  /// Free now (ordered on `stream` for HBM). Errors are swallowed: this runs in destructors.
  void reset(stream_t stream = nullptr) noexcept {
    release(stream);
    alloc_ = nullptr;
  }

  /// Give up the block without freeing it (for memory something else may still write, e.g.
  /// a buffer a driver never handed back): it stays allocated until the process exits.
  [[nodiscard]] void* release_ownership() noexcept {
    void* p = p_;
    alloc_ = nullptr;
    p_ = nullptr;
    bytes_ = 0;
    return p;
  }
  [[nodiscard]] void* get() const noexcept { return p_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(p_);
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// Where the block landed (after spilling); host when empty.
  [[nodiscard]] TierKind tier() const noexcept { return tier_; }
  [[nodiscard]] explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  void release(stream_t stream) noexcept {
    if (alloc_ != nullptr && p_ != nullptr) {
      try {
        alloc_->deallocate(p_, stream);
      } catch (...) {  // a CUDA error at teardown: the context is gone, nothing to return to
      }
    }
    p_ = nullptr;
    bytes_ = 0;
  }
  void swap(unique_block& o) noexcept {
    std::swap(alloc_, o.alloc_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(stream_, o.stream_);
    std::swap(tier_, o.tier_);
  }

  tiered_allocator* alloc_ = nullptr;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  stream_t stream_ = nullptr;
  TierKind tier_ = TierKind::host;
};

}  // namespace ght::alloc
