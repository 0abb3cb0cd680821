#include "alloc/tiered.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "alloc/detail/usage_json.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::alloc {

namespace {

constexpr std::array<std::string_view, kNumTiers> kBudgetVar = {"GHT_HBM_BUDGET",
                                                                "GHT_HOST_BUDGET"};

std::string budget_text(std::uint64_t b) {
  return b == UINT64_MAX ? std::string("unlimited") : config::format_bytes(b);
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, reinterpret_cast<std::uintptr_t>(p));
  return buf;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---- class rules ------------------------------------------------------------------------------

std::array<TierKind, kNumTensorClasses> parse_class_rules(std::string_view rules) {
  std::array<TierKind, kNumTensorClasses> table{};
  for (int c = 0; c < kNumTensorClasses; ++c) {
    switch (static_cast<TensorClass>(c)) {
      case TensorClass::master:
      case TensorClass::adam_m:
      case TensorClass::adam_v:
        table[static_cast<std::size_t>(c)] = TierKind::host;
        break;
      default:
        table[static_cast<std::size_t>(c)] = TierKind::hbm;
    }
  }
  const std::string all(rules);
  std::size_t pos = 0;
  while (pos <= rules.size()) {
    const std::size_t comma = std::min(rules.find(',', pos), rules.size());
    const std::string_view rule = trim(rules.substr(pos, comma - pos));
    pos = comma + 1;
    if (rule.empty()) continue;
    const auto fail = [&](const std::string& why) {
      throw ght::config_error("GHT_ALLOC_TIERS=" + all + ": rule '" + std::string(rule) + "' " +
                              why +
                              " (accepted: CLASS=TIER, CLASS a class name, a prefix ending in "
                              "'*' or '*'; classes weight grad master adam_m adam_v activation "
                              "other; TIER hbm or host)");
    };
    const std::size_t eq = rule.find('=');
    if (eq == std::string_view::npos) fail("has no '='");
    const std::string_view key = trim(rule.substr(0, eq));
    const std::string_view value = trim(rule.substr(eq + 1));
    const std::optional<TierKind> tier = parse_tier(value);
    if (!tier) fail("names an unknown tier '" + std::string(value) + "'");
    bool matched = false;
    if (!key.empty() && key.back() == '*') {
      const std::string_view prefix = key.substr(0, key.size() - 1);
      for (int c = 0; c < kNumTensorClasses; ++c) {
        if (to_string(static_cast<TensorClass>(c)).starts_with(prefix)) {
          table[static_cast<std::size_t>(c)] = *tier;
          matched = true;
        }
      }
    } else if (const auto cls = parse_tensor_class(key)) {
      table[static_cast<std::size_t>(*cls)] = *tier;
      matched = true;
    }
    if (!matched) fail("matches no tensor class");
  }
  return table;
}

// ---- construction -----------------------------------------------------------------------------

tiered_allocator::tiered_allocator(std::array<TierSetup, kNumTiers> tiers, TieredOptions options)
    : class_defaults_(parse_class_rules(options.class_rules)), spill_(options.spill) {
  bool any = false;
  std::size_t max_align = SIZE_MAX;
  name_ = "tiered(";
  for (int t = 0; t < kNumTiers; ++t) {
    auto& setup = tiers[static_cast<std::size_t>(t)];
    if (!setup.resource) continue;
    Tier& tier = tiers_[static_cast<std::size_t>(t)];
    tier.base = std::move(setup.resource);
    tier.limit = std::make_unique<limit_adaptor>(*tier.base, setup.budget);
    max_align = std::min(max_align, tier.base->max_alignment());
    if (any) name_ += ", ";
    name_ += std::string(to_string(static_cast<TierKind>(t))) + "=" + std::string(tier.base->name());
    any = true;
  }
  name_ += ")";
  GHT_EXPECTS(any, "tiered_allocator: at least one tier needs a resource");
  max_alignment_ = max_align;
  if (!options.log_path.empty()) sink_ = std::make_shared<log_sink>(options.log_path);
}

tiered_allocator::~tiered_allocator() {
  // Blocks still live go back to their tiers, so destroying the allocator returns all of its
  // memory (the resources alone would not unmap large host blocks). Default-stream frees.
  for (Shard& s : shards_) {
    for (const auto& [p, r] : s.blocks) {
      try {
        tiers_[static_cast<std::size_t>(r.tier)].limit->deallocate(const_cast<void*>(p), r.bytes,
                                                                   r.alignment, nullptr, r.cls);
      } catch (...) {  // nothing to report to from a destructor; carry on with the rest
      }
    }
    s.blocks.clear();
  }
  if (sink_) {
    try {
      sink_->flush();
    } catch (...) {  // a destructor cannot report it; flush_log() can
    }
  }
}

// ---- bookkeeping ------------------------------------------------------------------------------

tiered_allocator::Shard& tiered_allocator::shard_of(const void* p) const noexcept {
  // Blocks are at least 16-byte aligned and often far more; mix the bits before picking.
  auto x = reinterpret_cast<std::uintptr_t>(p) >> 4;
  x ^= x >> 17;
  x *= 0x9E3779B97F4A7C15ULL;
  return shards_[(x >> 58) & 63];
}

const std::string* tiered_allocator::intern(std::string_view region) {
  if (region.empty()) return nullptr;
  {
    std::shared_lock lock(regions_mu_);
    if (auto it = regions_.find(region); it != regions_.end()) return &*it;
  }
  std::unique_lock lock(regions_mu_);
  return &*regions_.emplace(region).first;  // set nodes never move
}

bool tiered_allocator::has_tier(TierKind t) const noexcept {
  return tiers_[static_cast<std::size_t>(t)].base != nullptr;
}

memory_resource* tiered_allocator::tier_resource(TierKind t) const noexcept {
  return tiers_[static_cast<std::size_t>(t)].base.get();
}

void tiered_allocator::set_placement(placement_fn fn) {
  if (fn) {
    placement_.store(std::make_shared<const placement_fn>(std::move(fn)));
  } else {
    placement_.store(nullptr);
  }
}

TierKind tiered_allocator::choose(const AllocRequest& request, const char** reason) const {
  if (request.preferred) {
    *reason = "requested";
    return *request.preferred;
  }
  if (const std::shared_ptr<const placement_fn> fn = placement_.load()) {
    if (const std::optional<TierKind> t = (*fn)(request.region, request.cls)) {
      *reason = "the plan";
      return *t;
    }
  }
  *reason = "the class default";
  return class_default(request.cls);
}

TierKind tiered_allocator::choose_tier(const AllocRequest& request) const {
  const char* reason = nullptr;
  return choose(request, &reason);
}

// ---- allocate / deallocate --------------------------------------------------------------------

void* tiered_allocator::allocate(std::size_t bytes, const AllocRequest& request, stream_t stream,
                                 std::size_t alignment) {
  GHT_EXPECTS(is_pow2(alignment), "tiered_allocator: alignment " + std::to_string(alignment) +
                                      " is not a power of two");
  GHT_EXPECTS(alignment <= max_alignment_,
              "tiered_allocator: alignment " + std::to_string(alignment) +
                  " exceeds the largest all tiers support, " + std::to_string(max_alignment_));
  if (bytes == 0) return nullptr;

  const char* reason = nullptr;
  const TierKind chosen = choose(request, &reason);
  // An absent chosen tier falls to the next present one (or, past the last, the one before):
  // that is where the machine puts it, not a spill.
  int start = static_cast<int>(chosen);
  while (start < kNumTiers && !has_tier(static_cast<TierKind>(start))) ++start;
  if (start == kNumTiers) {
    start = static_cast<int>(chosen);
    while (start >= 0 && !has_tier(static_cast<TierKind>(start))) --start;
  }
  const bool spill_allowed = spill_ && request.may_spill;

  std::array<std::string, kNumTiers> errors;
  for (int t = start; t < kNumTiers; ++t) {
    Tier& tier = tiers_[static_cast<std::size_t>(t)];
    if (!tier.base) continue;
    const auto tk = static_cast<TierKind>(t);
    void* p = nullptr;
    try {
      p = tier.limit->allocate(bytes, alignment, stream, request.cls);
    } catch (const ght::out_of_memory& e) {
      tier.failures.fetch_add(1, std::memory_order_relaxed);
      errors[static_cast<std::size_t>(t)] = e.what();
      if (!spill_allowed) break;
      continue;
    }
    const bool spilled = t != start;
    try {
      const Record rec{intern(request.region), bytes, alignment, tk, request.cls, spilled};
      Shard& s = shard_of(p);
      std::lock_guard lock(s.mu);
      s.blocks.emplace(p, rec);
    } catch (...) {  // bookkeeping failed (bad_alloc): give the block back, stay consistent
      tier.limit->deallocate(p, bytes, alignment, stream, request.cls);
      throw;
    }
    if (spilled) {
      spills_.fetch_add(1, std::memory_order_relaxed);
      tier.spills_in.fetch_add(1, std::memory_order_relaxed);
    }
    usage_.on_allocate(tk, request.cls, bytes);
    if (sink_) sink_->record(true, p, bytes, tk, request.cls, stream);
    return p;
  }
  throw ght::out_of_memory(oom_message(bytes, request, chosen, reason, errors));
}

void tiered_allocator::deallocate(void* p, stream_t stream) {
  if (p == nullptr) return;
  Record rec{};
  {
    Shard& s = shard_of(p);
    std::lock_guard lock(s.mu);
    auto it = s.blocks.find(p);
    GHT_EXPECTS(it != s.blocks.end(), "tiered_allocator: deallocate of " + hex(p) +
                                          ", which is not a live block of this allocator "
                                          "(freed twice, or allocated elsewhere)");
    rec = it->second;
    // Erased before the tier gets the block back: once it does, another thread may receive
    // the same address and must find the slot free.
    s.blocks.erase(it);
  }
  if (sink_) sink_->record(false, p, rec.bytes, rec.tier, rec.cls, stream);
  usage_.on_deallocate(rec.tier, rec.cls, rec.bytes);
  try {
    tiers_[static_cast<std::size_t>(rec.tier)].limit->deallocate(p, rec.bytes, rec.alignment,
                                                                 stream, rec.cls);
  } catch (...) {  // the block is still live: restore the record and the counters
    usage_.undo_deallocate(rec.tier, rec.cls, rec.bytes);
    Shard& s = shard_of(p);
    std::lock_guard lock(s.mu);
    s.blocks.emplace(p, rec);
    throw;
  }
}

void* tiered_allocator::do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                                    TensorClass cls) {
  return allocate(bytes, AllocRequest{cls, {}, std::nullopt, true}, stream, alignment);
}

void tiered_allocator::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                     stream_t stream, TensorClass) {
  {
    Shard& s = shard_of(p);
    std::lock_guard lock(s.mu);
    auto it = s.blocks.find(p);
    GHT_EXPECTS(it != s.blocks.end(), "tiered_allocator: deallocate of " + hex(p) +
                                          ", which is not a live block of this allocator");
    GHT_EXPECTS(it->second.bytes == bytes && it->second.alignment == alignment,
                "tiered_allocator: deallocate of " + hex(p) + " with " + std::to_string(bytes) +
                    " bytes, alignment " + std::to_string(alignment) + "; it was allocated with " +
                    std::to_string(it->second.bytes) + " bytes, alignment " +
                    std::to_string(it->second.alignment));
  }
  deallocate(p, stream);
}

// ---- queries ----------------------------------------------------------------------------------

std::optional<Placement> tiered_allocator::where(const void* p) const {
  if (p == nullptr) return std::nullopt;
  Shard& s = shard_of(p);
  std::lock_guard lock(s.mu);
  auto it = s.blocks.find(p);
  if (it == s.blocks.end()) return std::nullopt;
  const Record& r = it->second;
  return Placement{r.tier, r.cls, r.region ? *r.region : std::string(), r.bytes, r.spilled};
}

TierKind tiered_allocator::tier() const noexcept {
  for (int t = 0; t < kNumTiers; ++t) {
    if (has_tier(static_cast<TierKind>(t))) return static_cast<TierKind>(t);
  }
  return TierKind::host;
}

TierKind tiered_allocator::tier_of(const void* p) const noexcept {
  Shard& s = shard_of(p);
  std::lock_guard lock(s.mu);
  auto it = s.blocks.find(p);
  return it != s.blocks.end() ? it->second.tier : tier();
}

bool tiered_allocator::host_accessible() const noexcept {
  for (const Tier& t : tiers_) {
    if (t.base && !t.base->host_accessible()) return false;
  }
  return true;
}

std::uint64_t tiered_allocator::physical_free() const noexcept {
  std::uint64_t sum = 0;
  for (const Tier& t : tiers_) {
    if (!t.base) continue;
    const std::uint64_t f = t.limit->physical_free();
    sum = f > UINT64_MAX - sum ? UINT64_MAX : sum + f;
  }
  return sum;
}

TierReport tiered_allocator::report(TierKind t) const {
  const Tier& tier = tiers_[static_cast<std::size_t>(t)];
  TierReport r;
  if (!tier.base) return r;
  r.present = true;
  r.resource = std::string(tier.base->name());
  r.usage = usage_.tier(t);
  r.budget = tier.limit->budget();
  r.largest_free = tier.limit->physical_free();
  r.spills_in = tier.spills_in.load(std::memory_order_relaxed);
  r.failures = tier.failures.load(std::memory_order_relaxed);
  return r;
}

std::string tiered_allocator::stats_json() const {
  nlohmann::json tiers = nlohmann::json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    const auto tk = static_cast<TierKind>(t);
    const TierReport r = report(tk);
    nlohmann::json j = {{"present", r.present}};
    if (r.present) {
      j.update(detail::usage_json(r.usage));
      j["resource"] = r.resource;
      j["budget"] = r.budget == UINT64_MAX ? nlohmann::json(nullptr) : nlohmann::json(r.budget);
      j["largest_free"] =
          r.largest_free == UINT64_MAX ? nlohmann::json(nullptr) : nlohmann::json(r.largest_free);
      j["spills_in"] = r.spills_in;
      j["failures"] = r.failures;
    }
    tiers[std::string(to_string(tk))] = std::move(j);
  }
  nlohmann::json classes = nlohmann::json::object();
  nlohmann::json defaults = nlohmann::json::object();
  for (int c = 0; c < kNumTensorClasses; ++c) {
    const auto ck = static_cast<TensorClass>(c);
    classes[std::string(to_string(ck))] = detail::usage_json(usage_.cls(ck));
    defaults[std::string(to_string(ck))] = std::string(to_string(class_default(ck)));
  }
  nlohmann::json j = {{"allocator", name_},
                      {"all", detail::usage_json(usage_.all())},
                      {"tiers", tiers},
                      {"classes", classes},
                      {"spills", spills_.load()},
                      {"spill_enabled", spill_},
                      {"class_defaults", defaults},
                      {"plan_installed", placement_.load() != nullptr}};
  return j.dump();
}

void tiered_allocator::flush_log() {
  if (sink_) sink_->flush();
}

std::string tiered_allocator::oom_message(std::size_t bytes, const AllocRequest& request,
                                          TierKind chosen, const char* reason,
                                          const std::array<std::string, kNumTiers>& errors) const {
  std::string m = "cannot allocate " + config::format_bytes(bytes) + " for class " +
                  std::string(to_string(request.cls));
  if (!request.region.empty()) m += ", region '" + request.region + "'";
  m += " (tier " + std::string(to_string(chosen)) + " chosen by " + reason + ")";
  if (!spill_) {
    m += "; spilling is off (GHT_SPILL=off)";
  } else if (!request.may_spill) {
    m += "; the request does not allow spilling";
  } else {
    m += "; every tier it may spill to is exhausted";
  }
  std::string hint;
  for (int t = 0; t < kNumTiers; ++t) {
    const auto tk = static_cast<TierKind>(t);
    const TierReport r = report(tk);
    m += "\n  " + std::string(to_string(tk)) + ": ";
    if (!r.present) {
      m += "absent";
      continue;
    }
    const std::uint64_t free_est = r.largest_free == UINT64_MAX ? 0 : r.largest_free;
    m += config::format_bytes(r.usage.current) + " in use of a " + budget_text(r.budget) +
         " budget (peak " + config::format_bytes(r.usage.peak) + "), largest free block ~" +
         (r.largest_free == UINT64_MAX ? std::string("unknown") : config::format_bytes(free_est)) +
         " [" + r.resource + "]";
    const std::string& err = errors[static_cast<std::size_t>(t)];
    if (err.empty()) continue;
    m += "\n      " + err;
    if (!hint.empty()) hint += "; or ";
    const bool budget_bound = r.budget != UINT64_MAX && r.usage.current + bytes > r.budget;
    if (budget_bound) {
      // By at least what this request lacks; a run that allocates more after it needs more.
      hint += "raise " + std::string(kBudgetVar[static_cast<std::size_t>(t)]) + " (now " +
              budget_text(r.budget) + ") by at least " +
              config::format_bytes(r.usage.current + bytes - r.budget);
    } else {
      hint += "free " + std::string(to_string(tk)) +
              " memory: the tier itself is full below its budget (" +
              std::string(kBudgetVar[static_cast<std::size_t>(t)]) + ")";
    }
  }
  if (!spill_) hint += "; or set GHT_SPILL=on";
  hint += "; or move classes to another tier (GHT_ALLOC_TIERS, the plan)";
  m += "\n  hint: " + hint;
  return m;
}

}  // namespace ght::alloc
