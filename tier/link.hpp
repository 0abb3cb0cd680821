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

/// The HBM peak (memory clock x bus width, as the driver reports it) of the GPU that a built-in
/// profile's hbm_bps was measured on: gh200 a GH200 with 96 GB of HBM3 (4.02 TB/s), pcie5 an H200
/// SXM (4.92 TB/s); 0 for "none" and other names.
double builtin_profile_hbm_peak(const std::string& name);

/// A built-in profile's hbm_bps carried over to a GPU whose HBM peak is `gpu_hbm_peak_bps`: the
/// profile's measured share of its own GPU's peak, times this one's (unchanged where either peak
/// is unknown). The link figures stay the profile's.
void scale_hbm_to_gpu(LinkNumbers& n, double gpu_hbm_peak_bps);

/// Resolve the numbers per GHT_LINK_PROFILE (see file comment).
LinkNumbers resolve_link_numbers();

/// Run the probe (<10 s, GHT_PROBE_SECONDS) on the selected GPU, write it to the cache and
/// return it. Throws ght::logic_error when there is no GPU.
LinkNumbers probe_and_cache();

/// Cache path for the current GPU UUID, driver and hostname.
std::string probe_cache_path();

}  // namespace ght::tier
