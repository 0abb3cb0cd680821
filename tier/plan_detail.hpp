#pragma once
/// @file plan_detail.hpp
/// @brief What plan.cpp and plan_table.cpp share; not part of the tier API.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tier/config.hpp"
#include "tier/plan.hpp"

namespace ght::tier::detail {

/// The optimizer state classes: fp32 master, Adam m and v.
inline bool is_state(TensorClass c) {
  return c == TensorClass::master || c == TensorClass::adam_m || c == TensorClass::adam_v;
}

/// v with `digits` decimals ("inf" when not finite).
inline std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "inf";
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

/// Bytes as people read them (config::format_bytes).
inline std::string gib(std::uint64_t b) { return config::format_bytes(b); }

}  // namespace ght::tier::detail
