#include "alloc/limit.hpp"

#include <algorithm>

#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::alloc {

limit_adaptor::limit_adaptor(memory_resource& upstream, std::uint64_t budget)
    : adaptor_base(upstream), name_("limit(" + std::string(upstream.name()) + ")"), budget_(budget) {}

limit_adaptor::limit_adaptor(std::unique_ptr<memory_resource> upstream, std::uint64_t budget)
    : adaptor_base(std::move(upstream)),
      name_("limit(" + std::string(this->upstream().name()) + ")"),
      budget_(budget) {}

std::uint64_t limit_adaptor::physical_free() const noexcept {
  const std::uint64_t b = budget_.load(), u = used_.load();
  return std::min(b > u ? b - u : 0, upstream().physical_free());
}

void* limit_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                                 TensorClass cls) {
  std::uint64_t seen = used_.load();
  for (;;) {
    const std::uint64_t budget = budget_.load();
    if (bytes > budget || seen > budget - bytes) {
      throw ght::out_of_memory(std::string(upstream().name()) + ": allocating " +
                               config::format_bytes(bytes) + " would exceed the budget of " +
                               config::format_bytes(budget) + " (" + config::format_bytes(seen) +
                               " in use)");
    }
    if (used_.compare_exchange_weak(seen, seen + bytes)) break;
  }
  try {
    return upstream().allocate(bytes, alignment, stream, cls);
  } catch (...) {
    used_.fetch_sub(bytes);  // the reservation was never used
    throw;
  }
}

void limit_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                  stream_t stream, TensorClass cls) {
  upstream().deallocate(p, bytes, alignment, stream, cls);
  used_.fetch_sub(bytes);
}

}  // namespace ght::alloc
