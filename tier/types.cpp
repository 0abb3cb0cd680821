#include "tier/types.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace ght {

namespace {
bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}
constexpr std::array<std::string_view, kNumTiers> kTierNames = {"hbm", "host"};
constexpr std::array<std::string_view, 3> kLinkNames = {"none", "pcie", "c2c"};
constexpr std::array<std::string_view, kNumTensorClasses> kClassNames = {
    "weight", "grad", "master", "adam_m", "adam_v", "activation", "other"};

template <typename E, std::size_t N>
std::optional<E> parse_in(const std::array<std::string_view, N>& names, std::string_view s) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    if (iequals(names[i], s)) return static_cast<E>(i);
  }
  return std::nullopt;
}
}  // namespace

std::string_view to_string(TierKind t) noexcept { return kTierNames[static_cast<int>(t)]; }
std::string_view to_string(LinkKind k) noexcept { return kLinkNames[static_cast<int>(k)]; }
std::string_view to_string(TensorClass c) noexcept { return kClassNames[static_cast<int>(c)]; }

std::optional<TierKind> parse_tier(std::string_view s) noexcept {
  return parse_in<TierKind>(kTierNames, s);
}
std::optional<LinkKind> parse_link_kind(std::string_view s) noexcept {
  return parse_in<LinkKind>(kLinkNames, s);
}
std::optional<TensorClass> parse_tensor_class(std::string_view s) noexcept {
  return parse_in<TensorClass>(kClassNames, s);
}

}  // namespace ght
