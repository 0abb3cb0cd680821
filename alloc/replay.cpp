#include "alloc/replay.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "alloc/logging.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::alloc {

namespace {

constexpr std::uint64_t kGranule = 256;

/// Best-fit heap over one address range, with coalescing; only offsets and sizes matter.
class replay_heap {
 public:
  std::uint64_t allocate(std::uint64_t n) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) {
      const std::uint64_t off = top_;
      top_ += n;
      peak_ = std::max(peak_, top_);
      return off;
    }
    const auto [len, off] = *it;
    by_size_.erase(it);
    by_off_.erase(off);
    if (len > n) insert_free(off + n, len - n);
    return off;
  }
  void free(std::uint64_t off, std::uint64_t n) {
    // Merge with the free neighbours on both sides.
    auto next = by_off_.lower_bound(off);
    if (next != by_off_.end() && next->first == off + n) {
      n += next->second;
      by_size_.erase({next->second, next->first});
      next = by_off_.erase(next);
    }
    if (next != by_off_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        n += prev->second;
        by_size_.erase({prev->second, prev->first});
        by_off_.erase(prev);
      }
    }
    if (off + n == top_) {
      top_ = off;  // the heap shrinks back rather than keep a free tail
    } else {
      insert_free(off, n);
    }
  }
  [[nodiscard]] std::uint64_t peak() const { return peak_; }

 private:
  void insert_free(std::uint64_t off, std::uint64_t n) {
    by_off_.emplace(off, n);
    by_size_.emplace(n, off);
  }
  std::map<std::uint64_t, std::uint64_t> by_off_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;
  std::uint64_t top_ = 0;
  std::uint64_t peak_ = 0;
};

struct LiveBlock {
  std::uint64_t bytes;
  std::uint64_t offset;
  std::uint64_t line;
  TierKind tier;
};

std::string_view field_name(std::size_t i) {
  static constexpr std::array<std::string_view, 8> kNames = {
      "thread", "time_ns", "action", "pointer", "size", "tier", "class", "stream"};
  return kNames[i];
}

template <typename T>
bool parse_number(std::string_view s, T& out, int base = 10) {
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool parse_hex(std::string_view s, std::uint64_t& out) {
  if (s.size() < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return false;
  return parse_number(s.substr(2), out, 16);
}

}  // namespace

ReplayReport replay_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ght::io_error("cannot open allocation log '" + path + "': " + std::strerror(errno));
  return replay_log(in, path);
}

ReplayReport replay_log(std::istream& in, const std::string& origin) {
  ReplayReport rep;
  rep.origin = origin;
  std::array<replay_heap, kNumTiers> heaps;
  std::array<std::uint64_t, kNumTiers> live{};
  std::uint64_t live_all = 0;
  std::unordered_map<std::uint64_t, LiveBlock> blocks;
  std::unordered_set<std::int64_t> threads;
  std::int64_t first_ns = -1, last_ns = 0;

  std::string line;
  std::uint64_t lineno = 0;
  bool seen_content = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      throw ght::io_error(origin + ":" + std::to_string(lineno) + ": " + why);
    };
    if (!seen_content) {
      seen_content = true;
      if (line == log_sink::kHeader) continue;
    }
    std::array<std::string_view, 8> f;
    std::size_t nf = 0, pos = 0;
    const std::string_view sv(line);
    while (true) {
      const std::size_t comma = sv.find(',', pos);
      if (nf == f.size()) {
        nf = 9;  // too many
        break;
      }
      f[nf++] = sv.substr(pos, comma == std::string_view::npos ? sv.size() - pos : comma - pos);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
    if (nf != f.size()) {
      fail("expected 8 comma-separated fields (" + std::string(log_sink::kHeader) + "), got " +
           (nf > f.size() ? std::string("more") : std::to_string(nf)));
    }
    const auto bad = [&](std::size_t i, const char* expected) {
      fail("bad " + std::string(field_name(i)) + " '" + std::string(f[i]) + "' (expected " +
           expected + ")");
    };
    std::int64_t thread = 0, ns = 0;
    std::uint64_t ptr = 0, size = 0, stream = 0;
    if (!parse_number(f[0], thread)) bad(0, "an integer");
    if (!parse_number(f[1], ns) || ns < 0) bad(1, "a non-negative integer");
    const bool is_alloc = f[2] == "allocate";
    if (!is_alloc && f[2] != "free") bad(2, "allocate or free");
    if (!parse_hex(f[3], ptr) || ptr == 0) bad(3, "a non-zero hex address 0x...");
    if (!parse_number(f[4], size) || size == 0) bad(4, "a positive integer");
    const std::optional<TierKind> tier = parse_tier(f[5]);
    if (!tier) bad(5, "hbm or host");
    if (!parse_tensor_class(f[6])) bad(6, "a tensor class");
    if (!parse_hex(f[7], stream)) bad(7, "a hex stream 0x...");

    ++rep.events;
    threads.insert(thread);
    if (first_ns < 0) first_ns = ns;
    last_ns = std::max(last_ns, ns);
    const auto t = static_cast<std::size_t>(*tier);
    TierReplay& tr = rep.tiers[t];
    if (is_alloc) {
      if (const auto it = blocks.find(ptr); it != blocks.end()) {
        fail("allocate of " + std::string(f[3]) + ", which is already live (allocated at line " +
             std::to_string(it->second.line) + ")");
      }
      const std::uint64_t rounded = (size + kGranule - 1) / kGranule * kGranule;
      const std::uint64_t off = heaps[t].allocate(rounded);
      blocks.emplace(ptr, LiveBlock{size, off, lineno, *tier});
      ++tr.allocations;
      live[t] += size;
      live_all += size;
      tr.peak_live = std::max(tr.peak_live, live[t]);
      tr.largest_block = std::max(tr.largest_block, size);
      rep.peak_live_all = std::max(rep.peak_live_all, live_all);
    } else {
      const auto it = blocks.find(ptr);
      if (it == blocks.end()) fail("free of " + std::string(f[3]) + ", which is not live");
      const LiveBlock b = it->second;
      if (b.bytes != size) {
        fail("free of " + std::string(f[3]) + " with size " + std::to_string(size) +
             ", but it was allocated with " + std::to_string(b.bytes) + " at line " +
             std::to_string(b.line));
      }
      if (b.tier != *tier) {
        fail("free of " + std::string(f[3]) + " on tier " + std::string(f[5]) +
             ", but it was allocated on " + std::string(to_string(b.tier)) + " at line " +
             std::to_string(b.line));
      }
      blocks.erase(it);
      heaps[t].free(b.offset, (size + kGranule - 1) / kGranule * kGranule);
      ++tr.frees;
      live[t] -= size;
      live_all -= size;
    }
  }
  if (in.bad()) throw ght::io_error("reading allocation log '" + origin + "' failed");

  for (const auto& [p, b] : blocks) {
    TierReplay& tr = rep.tiers[static_cast<std::size_t>(b.tier)];
    tr.live_at_end += b.bytes;
    ++tr.blocks_at_end;
  }
  for (std::size_t t = 0; t < rep.tiers.size(); ++t) {
    TierReplay& tr = rep.tiers[t];
    tr.peak_extent = heaps[t].peak();
    tr.fragmentation = tr.peak_extent > 0 ? 1.0 - static_cast<double>(tr.peak_live) /
                                                      static_cast<double>(tr.peak_extent)
                                          : 0.0;
  }
  rep.threads = threads.size();
  rep.duration_ns = first_ns < 0 ? 0 : static_cast<std::uint64_t>(last_ns - first_ns);
  return rep;
}

std::string ReplayReport::to_text() const {
  std::ostringstream o;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(duration_ns) * 1e-9);
  o << "allocation log " << origin << ": " << events << " events, " << threads << " threads, "
    << buf << " s\n";
  std::snprintf(buf, sizeof buf, "%-5s %10s %10s %12s %12s %12s %12s %8s\n", "tier", "allocs",
                "frees", "peak_live", "peak_extent", "fragment.", "leaked", "blocks");
  o << buf;
  for (std::size_t t = 0; t < tiers.size(); ++t) {
    const TierReplay& r = tiers[t];
    if (r.allocations == 0) continue;
    std::snprintf(buf, sizeof buf, "%-5s %10llu %10llu %12s %12s %11.1f%% %12s %8llu\n",
                  std::string(to_string(static_cast<TierKind>(t))).c_str(),
                  static_cast<unsigned long long>(r.allocations),
                  static_cast<unsigned long long>(r.frees),
                  config::format_bytes(r.peak_live).c_str(),
                  config::format_bytes(r.peak_extent).c_str(), 100.0 * r.fragmentation,
                  config::format_bytes(r.live_at_end).c_str(),
                  static_cast<unsigned long long>(r.blocks_at_end));
    o << buf;
  }
  o << "peak usage, all tiers: " << config::format_bytes(peak_live_all) << " ("
    << peak_live_all << " bytes)\n";
  o << "fragmentation = 1 - peak_live / peak_extent of a best-fit heap replaying the log "
       "(256 B granules)\n";
  return o.str();
}

std::string ReplayReport::to_json() const {
  nlohmann::json tj = nlohmann::json::object();
  for (std::size_t t = 0; t < tiers.size(); ++t) {
    const TierReplay& r = tiers[t];
    tj[std::string(to_string(static_cast<TierKind>(t)))] = {
        {"allocations", r.allocations},   {"frees", r.frees},
        {"peak_live", r.peak_live},       {"live_at_end", r.live_at_end},
        {"blocks_at_end", r.blocks_at_end}, {"peak_extent", r.peak_extent},
        {"largest_block", r.largest_block}, {"fragmentation", r.fragmentation}};
  }
  return nlohmann::json{{"origin", origin},         {"events", events},
                        {"threads", threads},       {"duration_ns", duration_ns},
                        {"peak_live_all", peak_live_all}, {"tiers", tj}}
      .dump(2);
}

}  // namespace ght::alloc
