#include "alloc/resource.hpp"

#include <string>

#include "tier/error.hpp"

namespace ght::alloc {

namespace {
void check_alignment(const memory_resource& r, std::size_t alignment) {
  GHT_EXPECTS(is_pow2(alignment), std::string(r.name()) + ": alignment " +
                                      std::to_string(alignment) + " is not a power of two");
  GHT_EXPECTS(alignment <= r.max_alignment(),
              std::string(r.name()) + ": alignment " + std::to_string(alignment) +
                  " exceeds the largest supported, " + std::to_string(r.max_alignment()));
}
}  // namespace

void* memory_resource::allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                                TensorClass cls) {
  check_alignment(*this, alignment);
  if (bytes == 0) return nullptr;
  return do_allocate(bytes, alignment, stream, cls);
}

void memory_resource::deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                 stream_t stream, TensorClass cls) {
  check_alignment(*this, alignment);
  if (p == nullptr) return;
  GHT_EXPECTS(bytes != 0, std::string(name()) + ": deallocate of a non-null pointer with 0 bytes");
  do_deallocate(p, bytes, alignment, stream, cls);
}

}  // namespace ght::alloc
