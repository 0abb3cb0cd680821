#pragma once
/**
 * @file tiered.hpp
 * @brief The tiered allocator: places every allocation on a tier, keeps per-tier budgets,
 * spills to the next tier when one runs out, and answers where(ptr).
 *
 * The tier of a request is, in order of precedence:
 *   1. the request's `preferred` tier;
 *   2. the installed placement function (the plan), if it names one for (region, class);
 *   3. the class default: weight, grad, activation, other -> hbm; master, adam_m, adam_v ->
 *      host; changed by GHT_ALLOC_TIERS rules ("grad=host,adam_*=host").
 * An absent tier (hbm in a CPU-only build or without a GPU) falls through to the next present
 * one without counting as a spill. When the chosen tier's budget or memory runs out and
 * spilling is on (GHT_SPILL), the allocation goes to the next tier in TierKind order and is
 * counted as a spill. When no tier can take it, ght::out_of_memory is thrown; its message lists
 * every tier's usage, budget and largest free block and names the variable to raise.
 *
 * Thread safety: every member function may be called concurrently. Block records live in 64
 * shards, each a mutex and a hash map chosen by the pointer: allocation rates are bounded by
 * the underlying resources (which lock internally, or make a CUDA call), so a short,
 * rarely contended critical section costs far less than the call it records, and plain mutexes
 * keep erase-and-reinsert on failure simple to reason about (and clean under TSan). Counters
 * are atomics; the placement function is an atomically swapped shared_ptr.
 */
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "alloc/limit.hpp"
#include "alloc/logging.hpp"
#include "alloc/resource.hpp"
#include "alloc/statistics.hpp"

namespace ght::alloc {

struct AllocRequest {
  TensorClass cls = TensorClass::other;
  std::string region;                 ///< the plan's region name; may be empty
  std::optional<TierKind> preferred;  ///< overrides the plan and the class defaults
  bool may_spill = true;              ///< false: fail rather than leave the chosen tier
};

/// What where() reports about a live block.
struct Placement {
  TierKind tier = TierKind::host;
  TensorClass cls = TensorClass::other;
  std::string region;
  std::size_t bytes = 0;
  bool spilled = false;  ///< placed on a later tier because the chosen one was full
};

/// The plan's hook: a tier for (region, class), or nullopt to leave it to the class default.
using placement_fn =
    std::function<std::optional<TierKind>(std::string_view region, TensorClass cls)>;

/// One tier's memory and budget. A null resource means the tier is absent.
struct TierSetup {
  std::unique_ptr<memory_resource> resource;
  std::uint64_t budget = UINT64_MAX;
};

struct TieredOptions {
  bool spill = true;        ///< GHT_SPILL
  std::string class_rules;  ///< GHT_ALLOC_TIERS
  std::string log_path;     ///< GHT_ALLOC_LOG: replayable CSV of every call; empty = none
};

/// Per-tier state for reports and out-of-memory messages.
struct TierReport {
  bool present = false;
  std::string resource;
  Usage usage;
  std::uint64_t budget = 0;        ///< UINT64_MAX = unlimited
  std::uint64_t largest_free = 0;  ///< estimate: min(budget left, free memory of the tier)
  std::uint64_t spills_in = 0;     ///< allocations placed here because their tier was full
  std::uint64_t failures = 0;      ///< requests this tier could not satisfy
};

class tiered_allocator final : public memory_resource {
 public:
  /// @throws ght::logic_error if no tier is present; ght::config_error for bad class rules;
  /// ght::io_error if the log cannot be created
  explicit tiered_allocator(std::array<TierSetup, kNumTiers> tiers, TieredOptions options = {});
  /// Frees every block still live (on the default stream), then the resources.
  ~tiered_allocator() override;

  using memory_resource::allocate;
  using memory_resource::deallocate;

  /**
   * @brief Allocate on the tier the request resolves to, spilling as configured.
   * @return nullptr when bytes == 0
   * @throws ght::out_of_memory when no allowed tier can take the block
   * @throws ght::logic_error for a bad alignment
   */
  [[nodiscard]] void* allocate(std::size_t bytes, const AllocRequest& request,
                               stream_t stream = nullptr,
                               std::size_t alignment = kDefaultAlignment);
  /// Free a block from this allocator (size and tier are known). nullptr is ignored. HBM frees
  /// are ordered on `stream`; host memory is released at once, so the caller frees it only
  /// after GPU work that reads it has finished (the C ABI's PyTorch hook waits on an event).
  /// @throws ght::logic_error for a pointer this allocator does not own
  void deallocate(void* p, stream_t stream = nullptr);

  /// Tier, class, region and size of the live block starting at `p`; nullopt if unknown.
  [[nodiscard]] std::optional<Placement> where(const void* p) const;

  /// Install the plan's placement function; an empty function removes it.
  void set_placement(placement_fn fn);
  /// The tier a request resolves to before absence and spilling are considered.
  [[nodiscard]] TierKind choose_tier(const AllocRequest& request) const;
  [[nodiscard]] TierKind class_default(TensorClass cls) const noexcept {
    return class_defaults_[static_cast<std::size_t>(cls)];
  }

  [[nodiscard]] bool has_tier(TierKind t) const noexcept;
  /// The tier's base resource (e.g. a pinned_host, for device_pointer()); nullptr if absent.
  [[nodiscard]] memory_resource* tier_resource(TierKind t) const noexcept;
  [[nodiscard]] TierReport report(TierKind t) const;
  [[nodiscard]] Usage class_usage(TensorClass c) const noexcept { return usage_.cls(c); }
  [[nodiscard]] Usage total_usage() const noexcept { return usage_.all(); }
  [[nodiscard]] Usage tier_usage(TierKind t) const noexcept { return usage_.tier(t); }
  /// One class on one tier: where the plan's state, gradients and activations actually went.
  [[nodiscard]] Usage tier_class_usage(TierKind t, TensorClass c) const noexcept {
    return usage_.cell(t, c);
  }
  [[nodiscard]] std::uint64_t spill_count() const noexcept { return spills_.load(); }
  [[nodiscard]] bool spill_enabled() const noexcept { return spill_; }
  /// Statistics: per tier (usage, budget, largest free, spills), per class, overall, spills.
  [[nodiscard]] std::string stats_json() const;
  /// Flush the allocation log, if one is written. @throws ght::io_error
  void flush_log();

  [[nodiscard]] TierKind tier() const noexcept override;
  [[nodiscard]] TierKind tier_of(const void* p) const noexcept override;
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] std::size_t max_alignment() const noexcept override { return max_alignment_; }
  [[nodiscard]] bool host_accessible() const noexcept override;
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  /// Checks `bytes` against the record, then frees like deallocate(p, stream).
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  struct Record {
    const std::string* region;  // interned; nullptr = no region
    std::size_t bytes;
    std::size_t alignment;
    TierKind tier;
    TensorClass cls;
    bool spilled;
  };
  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::unordered_map<const void*, Record> blocks;
  };
  struct Tier {
    std::unique_ptr<memory_resource> base;
    std::unique_ptr<limit_adaptor> limit;  // wraps base; what allocations go through
    std::atomic<std::uint64_t> spills_in{0};
    std::atomic<std::uint64_t> failures{0};
  };

  [[nodiscard]] Shard& shard_of(const void* p) const noexcept;
  [[nodiscard]] const std::string* intern(std::string_view region);
  [[nodiscard]] TierKind choose(const AllocRequest& request, const char** reason) const;
  [[nodiscard]] std::string oom_message(std::size_t bytes, const AllocRequest& request,
                                        TierKind chosen, const char* reason,
                                        const std::array<std::string, kNumTiers>& errors) const;

  std::array<Tier, kNumTiers> tiers_;
  std::array<TierKind, kNumTensorClasses> class_defaults_{};
  bool spill_ = true;
  std::size_t max_alignment_ = kDefaultAlignment;
  std::string name_;
  std::shared_ptr<log_sink> sink_;
  usage_counters usage_;
  std::atomic<std::uint64_t> spills_{0};
  std::atomic<std::shared_ptr<const placement_fn>> placement_;
  mutable std::array<Shard, 64> shards_;
  mutable std::shared_mutex regions_mu_;
  std::set<std::string, std::less<>> regions_;
};

/**
 * @brief Class -> tier table: the built-in defaults, then `rules` applied left to right.
 *
 * Rules: comma-separated CLASS=TIER, where CLASS is a class name, a prefix ending in '*'
 * ("adam_*") or '*' for all, and TIER is hbm or host; spaces are ignored.
 * @throws ght::config_error naming GHT_ALLOC_TIERS and the offending rule
 */
[[nodiscard]] std::array<TierKind, kNumTensorClasses> parse_class_rules(std::string_view rules);

/**
 * @brief The allocator the GHT_* configuration and the machine describe.
 *
 * hbm tier (only with CUDA and a GPU): device_pool, or device_direct when
 * GHT_DEVICE_POOL=direct; budget GHT_HBM_BUDGET, else free HBM minus GHT_HBM_HEADROOM.
 * host tier on topology().host_numa_node: GHT_HOST_MEMORY=pinned|system|managed, or auto =
 * system_host where the link is c2c or there is no GPU, pinned_host on pcie; budget
 * GHT_HOST_BUDGET, else available memory minus GHT_HOST_HEADROOM. GHT_SPILL, GHT_ALLOC_TIERS
 * and GHT_ALLOC_LOG become the options.
 * @throws ght::config_error, ght::cuda_error, ght::logic_error
 */
[[nodiscard]] std::unique_ptr<tiered_allocator> make_default_tiered_allocator();

/// The host-tier resource that GHT_HOST_MEMORY=`option` gives on a `link`: the option itself,
/// or for "auto" "system" on c2c (the GPU reads pageable memory coherently, so pinning buys
/// nothing) and without a GPU, "pinned" on pcie.
[[nodiscard]] std::string host_resource_kind(const std::string& option, LinkKind link);

}  // namespace ght::alloc
