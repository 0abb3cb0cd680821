#pragma once
/**
 * @file types.hpp
 * @brief Small vocabulary types shared by every layer: tiers, link kinds, tensor classes.
 */
#include <optional>
#include <string>
#include <string_view>

namespace ght {

/// Where bytes live. Order matters: spilling goes from a tier to the next one.
enum class TierKind { hbm = 0, host = 1 };
inline constexpr int kNumTiers = 2;

/// How the GPU reaches host memory.
enum class LinkKind { none, pcie, c2c };

/// What a region of tensors holds (DESIGN.md, "The plan").
enum class TensorClass { weight, grad, master, adam_m, adam_v, activation, other };
inline constexpr int kNumTensorClasses = 7;

[[nodiscard]] std::string_view to_string(TierKind t) noexcept;
[[nodiscard]] std::string_view to_string(LinkKind k) noexcept;
[[nodiscard]] std::string_view to_string(TensorClass c) noexcept;

/// Parse (case-insensitive); std::nullopt when the text names nothing known.
[[nodiscard]] std::optional<TierKind> parse_tier(std::string_view s) noexcept;
[[nodiscard]] std::optional<LinkKind> parse_link_kind(std::string_view s) noexcept;
[[nodiscard]] std::optional<TensorClass> parse_tensor_class(std::string_view s) noexcept;

}  // namespace ght
