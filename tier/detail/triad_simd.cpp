// The host triad's loop for every Highway target (triad_simd.hpp). Compiled with
// -ffp-contract=off (tier/CMakeLists.txt), so the multiply and the add stay two roundings.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tier/detail/triad_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>

#include "tier/detail/triad_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace ght::tier::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void triad_target(float* HWY_RESTRICT a, const float* HWY_RESTRICT b, const float* HWY_RESTRICT c,
                  float s, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  const std::uintptr_t mask = lanes * sizeof(float) - 1;
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b) |
                         reinterpret_cast<std::uintptr_t>(c)) & mask) == 0;
  std::size_t i = 0;
  if (aligned) {
    for (; i + lanes <= n; i += lanes) {
      hn::Stream(hn::Add(hn::Load(d, b + i), hn::Mul(vs, hn::Load(d, c + i))), d, a + i);
    }
    hwy::FlushStream();  // streaming stores are weakly ordered: drain them before returning
  } else {
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Add(hn::LoadU(d, b + i), hn::Mul(vs, hn::LoadU(d, c + i))), d, a + i);
    }
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace ght::tier::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ght::tier::detail {

HWY_EXPORT(triad_target);

void triad(float* a, const float* b, const float* c, float s, std::size_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(triad_target)(a, b, c, s, n);
}

}  // namespace ght::tier::detail
#endif  // HWY_ONCE
