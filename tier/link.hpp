#pragma once
/**
 * @file link.hpp
 * @brief The link model: what a byte costs to move between tiers, measured or from a profile.
 *
 * Sources (GHT_LINK_PROFILE): measured = probe cache for this GPU/driver/host, else the built-in
 * profile matching the link kind; gh200 / pcie5 / none = built-in; any other value = a JSON file.
 */
#include <string>

#include "tier/types.hpp"

namespace ght::tier {

/// Bandwidths in bytes per second (0 = not applicable).
struct LinkNumbers {
  std::string name;           ///< "gh200", "pcie5", "none", "measured", or the file path
  std::string source;         ///< "builtin", "probe", "cache:<path>", "file:<path>"
  LinkKind kind = LinkKind::none;
  double h2d_bps = 0;         ///< pinned memcpy host -> device
  double d2h_bps = 0;         ///< pinned memcpy device -> host
  double bidir_bps = 0;       ///< both directions at once, combined
  double kernel_read_bps = 0; ///< GPU kernel reading host memory (zero-copy / coherent)
  double kernel_write_bps = 0;///< GPU kernel writing host memory
  double host_triad_bps = 0;  ///< host memory STREAM triad (3 streams counted)
  double hbm_bps = 0;         ///< GPU kernel reading HBM

  [[nodiscard]] std::string format_text() const;
  [[nodiscard]] std::string to_json() const;
  /// Parse and validate (every field present, positive where the kind needs it); throws
  /// ght::io_error naming `origin` and the offending field.
  static LinkNumbers from_json(const std::string& text, const std::string& origin);
};

/// Where `n.host_triad_bps` comes from, in words a plan can print: the public measurement behind
/// a built-in profile (with its citation), or the probe, cache or file that supplied it.
std::string host_triad_origin(const LinkNumbers& n);

/// Built-in profiles: "gh200", "pcie5", "none". Throws ght::logic_error for other names.
LinkNumbers builtin_profile(const std::string& name);

/// The built-in profile of a link kind: c2c -> gh200, pcie -> pcie5, none -> none.
LinkNumbers builtin_profile_for(LinkKind kind);

/// Resolve the numbers per GHT_LINK_PROFILE (see file comment).
LinkNumbers resolve_link_numbers();

/// Run the probe (<10 s, GHT_PROBE_SECONDS) on the selected GPU, write it to the cache and
/// return it. Throws ght::logic_error when there is no GPU.
LinkNumbers probe_and_cache();

/// Cache path for the current GPU UUID, driver and hostname.
std::string probe_cache_path();

}  // namespace ght::tier
