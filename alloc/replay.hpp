#pragma once
/**
 * @file replay.hpp
 * @brief Replay an allocation log (logging.hpp's CSV): peak usage and fragmentation per tier.
 *
 * Every event is checked: a malformed line, a free of a block that is not live, an address
 * allocated twice, or a free whose size or tier differs from its allocation throws
 * ght::io_error "FILE:LINE: ...". Fragmentation is measured by replaying the events through a
 * best-fit allocator with coalescing over one address range per tier (sizes rounded up to
 * 256 B): fragmentation = 1 - peak live bytes / peak extent of that range, i.e. the share of
 * the memory a contiguous heap would need that rounding and holes waste.
 */
#include <array>
#include <cstdint>
#include <istream>
#include <string>

#include "tier/types.hpp"

namespace ght::alloc {

struct TierReplay {
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t peak_live = 0;      ///< most bytes live at once (as requested)
  std::uint64_t live_at_end = 0;    ///< bytes never freed
  std::uint64_t blocks_at_end = 0;  ///< blocks never freed
  std::uint64_t peak_extent = 0;    ///< high-water mark of the best-fit replay heap
  std::uint64_t largest_block = 0;
  double fragmentation = 0.0;       ///< 1 - peak_live / peak_extent (0 when nothing was used)
};

struct ReplayReport {
  std::string origin;
  std::uint64_t events = 0;
  std::uint64_t threads = 0;                ///< distinct thread ids
  std::uint64_t peak_live_all = 0;          ///< most bytes live at once over all tiers
  std::uint64_t duration_ns = 0;            ///< last time_ns minus first
  std::array<TierReplay, kNumTiers> tiers{};

  /// A table: one row per tier that saw events, then the totals.
  [[nodiscard]] std::string to_text() const;
  [[nodiscard]] std::string to_json() const;
};

/// Replay the CSV at `path`. @throws ght::io_error naming the file (and line)
[[nodiscard]] ReplayReport replay_log(const std::string& path);
/// Replay from a stream; `origin` names it in messages.
[[nodiscard]] ReplayReport replay_log(std::istream& in, const std::string& origin);

}  // namespace ght::alloc
