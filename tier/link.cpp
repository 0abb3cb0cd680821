#include "tier/link.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tier/config.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace ght::tier {

namespace {

using ojson = nlohmann::ordered_json;

struct Field {
  const char* key;
  double LinkNumbers::*member;
  const char* label;
};

// Order is the order of to_json() and of the printed table.
constexpr Field kFields[] = {
    {"h2d_bps", &LinkNumbers::h2d_bps, "memcpy H2D (pinned)"},
    {"d2h_bps", &LinkNumbers::d2h_bps, "memcpy D2H (pinned)"},
    {"bidir_bps", &LinkNumbers::bidir_bps, "memcpy both ways (sum)"},
    {"kernel_read_bps", &LinkNumbers::kernel_read_bps, "GPU kernel reads host"},
    {"kernel_write_bps", &LinkNumbers::kernel_write_bps, "GPU kernel writes host"},
    {"host_triad_bps", &LinkNumbers::host_triad_bps, "host memory triad"},
    {"hbm_bps", &LinkNumbers::hbm_bps, "GPU kernel reads HBM"},
};

// Optional keys besides the numbers: documentation and the probe's provenance.
constexpr const char* kOptionalKeys[] = {"name", "source", "comment", "meta"};

// A bandwidth outside this range is a unit mistake (GB/s written where bytes/s is expected, or
// bits): 1 MB/s is slower than any link we plan for, 100 TB/s faster than any memory we know.
constexpr double kMinPlausibleBps = 1e6;
constexpr double kMaxPlausibleBps = 1e14;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string format_gbps(double bps) {
  char buf[32];
  if (bps >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.2f TB/s", bps / 1e12);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB/s", bps / 1e9);
  }
  return buf;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ght::io_error(what + ": cannot open '" + path + "': " + std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ght::io_error(what + ": cannot read '" + path + "'");
  return ss.str();
}

std::string sanitize(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '.' || c == '-' || c == '_')) c = '_';
  }
  return out.empty() ? std::string("unknown") : out;
}

/// The builtin profile matching a link kind (for "measured" without a cache).
std::string profile_for_kind(LinkKind k) {
  switch (k) {
    case LinkKind::c2c: return "gh200";
    case LinkKind::pcie: return "pcie5";
    case LinkKind::none: break;
  }
  return "none";
}

}  // namespace

// ---- built-in profiles --------------------------------------------------------------------------
LinkNumbers builtin_profile(const std::string& name) {
  LinkNumbers n;
  const std::string key = lower(name);
  n.name = key;
  n.source = "builtin";
  if (key == "gh200") {
    // Public GH200 figures, /work/shared/HARDWARE.md ("NVIDIA GH200"):
    n.kind = LinkKind::c2c;
    n.h2d_bps = 375e9;          // C2C measured H2D, Schieffer et al., arXiv 2407.07850
    n.d2h_bps = 297e9;          // C2C measured D2H, same source
    n.bidir_bps = 600e9;        // ESTIMATE: no source we cite measured both ways at once.
                                // 0.9 x (375 + 297) = 605, using the ratio the H200's PCIe
                                // link shows (99.8 / (55.4 + 55.3) = 0.90), rounded down
    n.kernel_read_bps = 342e9;  // GPU kernel reading host memory, nvbandwidth issue 23
    n.kernel_write_bps = 297e9; // ESTIMATE: no public kernel-write figure; taken equal to D2H
    n.host_triad_bps = 486e9;   // Grace LPDDR5X STREAM, Schieffer et al. (spec 546)
    n.hbm_bps = 3.4e12;         // HBM3 STREAM, Schieffer et al.
  } else if (key == "pcie5") {
    // H200 SXM on x86, PCIe Gen5 x16, measured by us: HARDWARE.md ("NVIDIA H200 SXM on x86").
    n.kind = LinkKind::pcie;
    n.h2d_bps = 55.4e9;         // memcpy H2D pinned
    n.d2h_bps = 55.3e9;         // memcpy D2H pinned
    n.bidir_bps = 99.8e9;       // both directions at once on two streams, combined
    n.kernel_read_bps = 51.3e9; // kernel reading mapped pinned host memory (zero-copy)
    n.kernel_write_bps = 52.6e9;// kernel writing mapped pinned host memory
    n.host_triad_bps = 111e9;   // CPU fp32 a += b on 16 threads, 3 streams counted (the closest
                                // figure to a triad that table has)
    n.hbm_bps = 4.43e12;        // GPU kernel reading HBM
  } else if (key == "none") {
    n.kind = LinkKind::none;    // no GPU: every figure 0 (unknown), nothing to move
  } else {
    GHT_FAIL("unknown built-in link profile '" + name + "' (built-ins: gh200, pcie5, none)");
  }
  return n;
}

LinkNumbers builtin_profile_for(LinkKind kind) { return builtin_profile(profile_for_kind(kind)); }

double builtin_profile_hbm_peak(const std::string& name) {
  const std::string key = lower(name);
  // 2 transfers per clock x bus width: GH200 96 GB, HBM3 at 2,619 MHz on 6,144 bits (4.0 TB/s
  // datasheet); H200 SXM, HBM3e at 3,201 MHz on 6,144 bits (4.8 TB/s datasheet).
  if (key == "gh200") return 2 * 2619e6 * 6144 / 8;
  if (key == "pcie5") return 2 * 3201e6 * 6144 / 8;
  return 0;
}

void scale_hbm_to_gpu(LinkNumbers& n, double gpu_hbm_peak_bps) {
  const double reference = builtin_profile_hbm_peak(n.name);
  if (reference <= 0 || gpu_hbm_peak_bps <= 0 || n.hbm_bps <= 0) return;
  n.hbm_bps *= gpu_hbm_peak_bps / reference;
  char b[160];
  std::snprintf(b, sizeof b, "; hbm_bps scaled to this GPU's HBM peak, %.2f of the profile's %.2f TB/s",
                gpu_hbm_peak_bps / 1e12, reference / 1e12);
  n.source += b;
}

std::string host_triad_origin(const LinkNumbers& n) {
  if (n.source.starts_with("builtin")) {
    if (n.name == "gh200") return "Grace LPDDR5X STREAM triad, Schieffer et al., arXiv 2407.07850";
    if (n.name == "pcie5") return "the x86 host of an H200, measured (shared/HARDWARE.md)";
    return "none: the profile has no host figure";
  }
  if (n.source == "probe" || n.source.starts_with("cache:")) return "measured on this host by `ght info --probe`";
  return n.source;
}

// ---- JSON ---------------------------------------------------------------------------------------
std::string LinkNumbers::to_json() const {
  ojson j;
  j["name"] = name;
  j["source"] = source;
  j["kind"] = std::string(ght::to_string(kind));
  for (const Field& f : kFields) j[f.key] = this->*f.member;
  return j.dump(2);
}

LinkNumbers LinkNumbers::from_json(const std::string& text, const std::string& origin) {
  const std::string where = "link profile '" + origin + "'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ght::io_error(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    throw ght::io_error(where + ": expected a JSON object, got " + std::string(j.type_name()));
  }
  for (const auto& [key, value] : j.items()) {
    const bool known =
        std::any_of(std::begin(kFields), std::end(kFields), [&](const Field& f) { return key == f.key; }) ||
        std::any_of(std::begin(kOptionalKeys), std::end(kOptionalKeys),
                    [&](const char* k) { return key == k; }) ||
        key == "kind";
    if (!known) {
      throw ght::io_error(where + ": unknown field '" + key +
                          "' (fields: kind, h2d_bps, d2h_bps, bidir_bps, kernel_read_bps, "
                          "kernel_write_bps, host_triad_bps, hbm_bps; optional name, source, "
                          "comment, meta)");
    }
  }

  LinkNumbers n;
  if (!j.contains("kind")) throw ght::io_error(where + ": missing field 'kind' (none|pcie|c2c)");
  if (!j["kind"].is_string()) {
    throw ght::io_error(where + ": field 'kind' must be a string (none|pcie|c2c), got " +
                        std::string(j["kind"].type_name()));
  }
  const auto kind = parse_link_kind(j["kind"].get<std::string>());
  if (!kind) {
    throw ght::io_error(where + ": field 'kind' = '" + j["kind"].get<std::string>() +
                        "' is not one of none|pcie|c2c");
  }
  n.kind = *kind;

  for (const Field& f : kFields) {
    if (!j.contains(f.key)) {
      throw ght::io_error(where + ": missing field '" + f.key + "' (bytes per second)");
    }
    const auto& v = j[f.key];
    if (!v.is_number()) {
      throw ght::io_error(where + ": field '" + f.key +
                          "' must be a number (bytes per second), got " + v.type_name() + " " +
                          v.dump());
    }
    const double x = v.get<double>();
    const std::string shown = v.dump();
    if (!std::isfinite(x) || x < 0) {
      throw ght::io_error(where + ": field '" + f.key + "' must be >= 0, got " + shown);
    }
    // A link kind that moves bytes needs every figure: a 0 would make the plan divide by zero.
    if (n.kind != LinkKind::none && x == 0) {
      throw ght::io_error(where + ": field '" + f.key + "' must be > 0 for link kind " +
                          std::string(ght::to_string(n.kind)) + ", got 0");
    }
    if (x != 0 && (x < kMinPlausibleBps || x > kMaxPlausibleBps)) {
      throw ght::io_error(where + ": field '" + f.key + "' = " + shown +
                          " is implausible; the unit is bytes per second (e.g. 55.4e9 for "
                          "55.4 GB/s)");
    }
    n.*f.member = x;
  }

  for (const char* k : {"name", "source", "comment"}) {
    if (j.contains(k) && !j[k].is_string()) {
      throw ght::io_error(where + ": field '" + k + "' must be a string, got " +
                          std::string(j[k].type_name()));
    }
  }
  if (j.contains("meta") && !j["meta"].is_object()) {
    throw ght::io_error(where + ": field 'meta' must be an object, got " +
                        std::string(j["meta"].type_name()));
  }
  n.name = j.contains("name") ? j["name"].get<std::string>() : origin;
  n.source = j.contains("source") ? j["source"].get<std::string>() : "file:" + origin;
  return n;
}

std::string LinkNumbers::format_text() const {
  std::ostringstream o;
  o << "link numbers  kind " << ght::to_string(kind) << ", profile " << name << ", source "
    << source << "\n";
  for (const Field& f : kFields) {
    char line[96];
    std::snprintf(line, sizeof line, "  %-26s %s\n", f.label,
                  this->*f.member > 0 ? format_gbps(this->*f.member).c_str() : "-");
    o << line;
  }
  return o.str();
}

// ---- cache --------------------------------------------------------------------------------------
namespace detail {

std::string cache_dir() {
  const std::string configured = config::cfg().get_string(config::Key::GHT_CACHE_DIR);
  if (!configured.empty()) return configured;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/ghtier";
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    // Services run without HOME; the password database still knows the home directory.
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr) home = pw->pw_dir;
  }
  if (home == nullptr || *home == '\0') return "/tmp/ghtier-" + std::to_string(getuid());
  return std::string(home) + "/.cache/ghtier";
}

void write_file_atomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    if (ec) {
      throw ght::io_error("cannot create directory '" + target.parent_path().string() +
                          "': " + ec.message());
    }
  }
  // Readers (another process resolving "measured") see either the old file or the new one,
  // never a half-written one.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ght::io_error("cannot create '" + tmp + "': " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw ght::io_error("cannot write '" + tmp + "': " + err);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw ght::io_error("cannot flush '" + tmp + "': " + err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw ght::io_error("cannot rename '" + tmp + "' to '" + path + "': " + err);
  }
}

std::string probe_cache_json(const ProbeReport& report, const Topology& topo) {
  ojson j = ojson::parse(report.numbers.to_json());
  ojson meta;
  if (const GpuInfo* g = topo.gpu()) {
    meta["gpu_name"] = g->name;
    meta["gpu_uuid"] = g->uuid;
    meta["pci_bus_id"] = g->pci_bus_id;
    meta["driver_version"] = g->driver_version;
  }
  meta["hostname"] = topo.hostname;
  meta["host_numa_node"] = topo.host_numa_node;
  meta["copy_bytes"] = report.copy_bytes;
  meta["triad_bytes"] = report.triad_bytes;
  meta["triad_threads"] = report.triad_threads;
  meta["reps_min"] = report.reps_min;
  meta["probe_seconds"] = report.seconds;
  meta["unix_time"] = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  j["meta"] = meta;
  return j.dump(2) + "\n";
}

}  // namespace detail

std::string probe_cache_path() {
  const Topology& topo = topology();
  std::string file = "link-" + sanitize(topo.hostname);
  if (const GpuInfo* g = topo.gpu()) {
    file += "-" + sanitize(g->uuid) + "-drv" + std::to_string(g->driver_version);
  } else {
    file += "-nogpu";
  }
  return detail::cache_dir() + "/" + file + ".json";
}

// ---- resolution ---------------------------------------------------------------------------------
LinkNumbers resolve_link_numbers() {
  const std::string value = config::cfg().get_string(config::Key::GHT_LINK_PROFILE);
  const std::string key = lower(value);
  if (key == "gh200" || key == "pcie5" || key == "none") return builtin_profile(key);

  if (key.empty() || key == "measured") {
    const Topology& topo = topology();
    const std::string builtin = profile_for_kind(topo.link);
    if (topo.gpu() == nullptr) {
      LinkNumbers n = builtin_profile(builtin);
      n.source = "builtin (GHT_LINK_PROFILE=measured: no GPU, link kind none)";
      return n;
    }
    const std::string path = probe_cache_path();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      LinkNumbers n = builtin_profile(builtin);
      n.source = "builtin (GHT_LINK_PROFILE=measured: no probe cache " + path +
                 "; profile of link kind " + std::string(ght::to_string(topo.link)) +
                 "; run `ght info --probe`)";
      scale_hbm_to_gpu(n, topo.gpu()->hbm_peak_bps);
      return n;
    }
    LinkNumbers n;
    try {
      n = LinkNumbers::from_json(read_text_file(path, "probe cache"), path);
    } catch (const ght::io_error& e) {
      throw ght::io_error(std::string(e.what()) +
                          " (a stale probe cache: delete it or run `ght info --probe`)");
    }
    n.name = "measured";
    n.source = "cache:" + path;
    return n;
  }

  // Anything else is a JSON file.
  const std::string text =
      read_text_file(value, "GHT_LINK_PROFILE=" + value +
                                " (not gh200, pcie5, none or measured, so read as a JSON file)");
  LinkNumbers n = LinkNumbers::from_json(text, value);
  n.source = "file:" + value;
  return n;
}

LinkNumbers probe_and_cache() {
#ifdef GHT_HAVE_CUDA
  const double seconds = config::cfg().get_float(config::Key::GHT_PROBE_SECONDS);
  detail::ProbeReport report = detail::run_probe(seconds);
  const std::string path = probe_cache_path();
  detail::write_file_atomically(path, detail::probe_cache_json(report, topology()));
  return report.numbers;
#else
  throw ght::logic_error(
      "link probe: this ghtier was built without CUDA (GHT_ENABLE_CUDA=OFF or no nvcc), so there "
      "is no GPU link to measure; use GHT_LINK_PROFILE=gh200|pcie5|<file.json> to plan for one");
#endif
}

}  // namespace ght::tier
