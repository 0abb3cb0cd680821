#include "alloc/adaptor.hpp"

#include "tier/error.hpp"

namespace ght::alloc {

adaptor_base::adaptor_base(std::unique_ptr<memory_resource> upstream)
    : owned_(std::move(upstream)), upstream_(owned_.get()) {
  GHT_EXPECTS(upstream_ != nullptr, "adaptor: the upstream resource is null");
}

}  // namespace ght::alloc
