#pragma once
/// @file usage_json.hpp  @brief JSON of usage counters, shared by the adaptors and the tiers.
#include <nlohmann/json.hpp>

#include "alloc/statistics.hpp"

namespace ght::alloc::detail {
[[nodiscard]] nlohmann::json usage_json(const Usage& u);
[[nodiscard]] nlohmann::json counters_json(const usage_counters& c);
}  // namespace ght::alloc::detail
