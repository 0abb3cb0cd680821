// The tiered allocator: tier choice (request, plan, class defaults, rules), budgets and spills,
// the out-of-memory message, where(), statistics, the log, thread safety, and the factory.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "alloc/replay.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

constexpr std::uint64_t MiB = 1 << 20;
#ifdef GHT_HAVE_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif

/// Both tiers backed by host memory (the "hbm" one stands in for a GPU), with budgets.
std::unique_ptr<tiered_allocator> make(std::uint64_t hbm_budget, std::uint64_t host_budget,
                                       TieredOptions opts = {}) {
  std::array<TierSetup, kNumTiers> t;
  t[0].resource = std::make_unique<system_host>(-1, false);
  t[0].budget = hbm_budget;
  t[1].resource = std::make_unique<system_host>(-1, false);
  t[1].budget = host_budget;
  return std::make_unique<tiered_allocator>(std::move(t), std::move(opts));
}

AllocRequest req(TensorClass c, std::string region = {}, std::optional<TierKind> pref = {}) {
  return AllocRequest{c, std::move(region), pref, true};
}

TEST(Tiered, ClassDefaults) {
  auto t = make(UINT64_MAX, UINT64_MAX);
  const std::pair<TensorClass, TierKind> expected[] = {
      {TensorClass::weight, TierKind::hbm},   {TensorClass::grad, TierKind::hbm},
      {TensorClass::activation, TierKind::hbm}, {TensorClass::other, TierKind::hbm},
      {TensorClass::master, TierKind::host},  {TensorClass::adam_m, TierKind::host},
      {TensorClass::adam_v, TierKind::host}};
  for (const auto& [cls, tier] : expected) {
    void* p = t->allocate(4096, req(cls, "r"));
    const auto w = t->where(p);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(w->tier, tier) << to_string(cls);
    EXPECT_EQ(w->cls, cls);
    EXPECT_FALSE(w->spilled);
    t->deallocate(p);
  }
}

TEST(Tiered, ClassRules) {
  const auto table = parse_class_rules(" grad = host, adam_*=hbm ,master=hbm");
  EXPECT_EQ(table[static_cast<int>(TensorClass::grad)], TierKind::host);
  EXPECT_EQ(table[static_cast<int>(TensorClass::adam_m)], TierKind::hbm);
  EXPECT_EQ(table[static_cast<int>(TensorClass::adam_v)], TierKind::hbm);
  EXPECT_EQ(table[static_cast<int>(TensorClass::master)], TierKind::hbm);
  EXPECT_EQ(table[static_cast<int>(TensorClass::weight)], TierKind::hbm);
  const auto all_host = parse_class_rules("*=host");
  for (TierKind k : all_host) EXPECT_EQ(k, TierKind::host);
  const auto later_wins = parse_class_rules("*=host,weight=hbm");
  EXPECT_EQ(later_wins[static_cast<int>(TensorClass::weight)], TierKind::hbm);
  EXPECT_EQ(later_wins[static_cast<int>(TensorClass::grad)], TierKind::host);
  EXPECT_EQ(parse_class_rules("")[static_cast<int>(TensorClass::master)], TierKind::host);

  for (const char* bad : {"grad", "grad=gpu", "gradient=host", "x*=host", "=host"}) {
    try {
      (void)parse_class_rules(bad);
      FAIL() << bad << " was accepted";
    } catch (const ght::config_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("GHT_ALLOC_TIERS"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string(bad).substr(0, 4)), std::string::npos) << msg;
    }
  }
  TieredOptions o;
  o.class_rules = "grad=host";
  auto t = make(UINT64_MAX, UINT64_MAX, o);
  EXPECT_EQ(t->class_default(TensorClass::grad), TierKind::host);
  void* p = t->allocate(100, req(TensorClass::grad));
  EXPECT_EQ(t->where(p)->tier, TierKind::host);
  t->deallocate(p);
}

TEST(Tiered, PlacementFunctionAndPreference) {
  auto t = make(UINT64_MAX, UINT64_MAX);
  t->set_placement([](std::string_view region, TensorClass) -> std::optional<TierKind> {
    if (region.starts_with("experts.cold")) return TierKind::host;
    if (region == "pinned.master") return TierKind::hbm;
    return std::nullopt;  // leave it to the class default
  });
  EXPECT_EQ(t->choose_tier(req(TensorClass::weight, "experts.cold.3")), TierKind::host);
  EXPECT_EQ(t->choose_tier(req(TensorClass::master, "pinned.master")), TierKind::hbm);
  EXPECT_EQ(t->choose_tier(req(TensorClass::master, "other")), TierKind::host);
  EXPECT_EQ(t->choose_tier(req(TensorClass::weight, "experts.cold.3", TierKind::hbm)),
            TierKind::hbm);  // the request's preference wins over the plan
  void* p = t->allocate(1000, req(TensorClass::weight, "experts.cold.3"));
  EXPECT_EQ(t->where(p)->tier, TierKind::host);
  EXPECT_EQ(t->where(p)->region, "experts.cold.3");
  t->deallocate(p);
  t->set_placement({});
  EXPECT_EQ(t->choose_tier(req(TensorClass::weight, "experts.cold.3")), TierKind::hbm);
  const auto j = nlohmann::json::parse(t->stats_json());
  EXPECT_FALSE(j["plan_installed"].get<bool>());
}

TEST(Tiered, SpillsWhenBudgetRunsOut) {
  auto t = make(MiB, UINT64_MAX);
  void* a = t->allocate(768 << 10, req(TensorClass::weight, "a"));
  void* b = t->allocate(512 << 10, req(TensorClass::weight, "b"));
  EXPECT_EQ(t->where(a)->tier, TierKind::hbm);
  EXPECT_FALSE(t->where(a)->spilled);
  EXPECT_EQ(t->where(b)->tier, TierKind::host);
  EXPECT_TRUE(t->where(b)->spilled);
  EXPECT_EQ(t->spill_count(), 1u);
  EXPECT_EQ(t->report(TierKind::host).spills_in, 1u);
  EXPECT_EQ(t->report(TierKind::hbm).failures, 1u);
  EXPECT_EQ(t->report(TierKind::hbm).usage.current, 768u << 10);
  EXPECT_EQ(t->report(TierKind::host).usage.current, 512u << 10);
  t->deallocate(a);
  void* c = t->allocate(512 << 10, req(TensorClass::weight, "c"));
  EXPECT_EQ(t->where(c)->tier, TierKind::hbm);  // room again after the free
  t->deallocate(b);
  t->deallocate(c);
  EXPECT_EQ(t->total_usage().current, 0u);
}

TEST(Tiered, NoSpillWhenOffOrRefused) {
  TieredOptions off;
  off.spill = false;
  auto t = make(MiB, 64 * MiB, off);
  void* a = t->allocate(MiB, req(TensorClass::weight, "fills_hbm"));
  try {
    (void)t->allocate(4096, req(TensorClass::weight, "layers.0.w"));
    FAIL() << "expected out_of_memory";
  } catch (const ght::out_of_memory& e) {
    const std::string msg = e.what();
    // Per tier: usage, budget, largest free block; then the hint naming the variable.
    EXPECT_NE(msg.find("cannot allocate 4.00 KiB for class weight, region 'layers.0.w'"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("tier hbm chosen by the class default"), std::string::npos) << msg;
    EXPECT_NE(msg.find("spilling is off"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hbm: 1.00 MiB in use of a 1.00 MiB budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest free block ~0 B"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host: 0 B in use of a 64.00 MiB budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise GHT_HBM_BUDGET (now 1.00 MiB) by at least 4.00 KiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GHT_SPILL=on"), std::string::npos) << msg;
  }
  EXPECT_EQ(t->spill_count(), 0u);
  t->deallocate(a);

  auto u = make(MiB, UINT64_MAX);
  void* b = u->allocate(MiB, req(TensorClass::weight));
  AllocRequest stay{TensorClass::weight, "stay", std::nullopt, false};
  try {
    (void)u->allocate(1, stay);
    FAIL() << "expected out_of_memory";
  } catch (const ght::out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("does not allow spilling"), std::string::npos) << e.what();
  }
  u->deallocate(b);
}

TEST(Tiered, OutOfMemoryWhenAllTiersExhausted) {
  auto t = make(MiB, 2 * MiB);
  void* a = t->allocate(MiB, req(TensorClass::weight));
  void* b = t->allocate(2 * MiB, req(TensorClass::master));
  try {
    (void)t->allocate(MiB, req(TensorClass::grad, "g"));
    FAIL() << "expected out_of_memory";
  } catch (const ght::out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("every tier it may spill to is exhausted"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise GHT_HBM_BUDGET (now 1.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise GHT_HOST_BUDGET (now 2.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host: 2.00 MiB in use of a 2.00 MiB budget (peak 2.00 MiB)"),
              std::string::npos) << msg;
  }
  // A host-class request does not spill "up" to hbm: spilling follows tier order.
  t->deallocate(a);
  EXPECT_THROW((void)t->allocate(MiB, req(TensorClass::master)), ght::out_of_memory);
  t->deallocate(b);
}

TEST(Tiered, AbsentTierFallsThroughWithoutSpill) {
  std::array<TierSetup, kNumTiers> tiers;
  tiers[1].resource = std::make_unique<system_host>(-1, false);
  tiered_allocator t(std::move(tiers));
  EXPECT_FALSE(t.has_tier(TierKind::hbm));
  void* p = t.allocate(4096, req(TensorClass::weight));
  EXPECT_EQ(t.where(p)->tier, TierKind::host);
  EXPECT_FALSE(t.where(p)->spilled);
  EXPECT_EQ(t.spill_count(), 0u);
  t.deallocate(p);
  // Only an hbm tier: host requests fall back to it.
  std::array<TierSetup, kNumTiers> only_first;
  only_first[0].resource = std::make_unique<system_host>(-1, false);
  tiered_allocator u(std::move(only_first));
  void* q = u.allocate(4096, req(TensorClass::master));
  EXPECT_EQ(u.where(q)->tier, TierKind::hbm);
  u.deallocate(q);
  EXPECT_THROW(tiered_allocator(std::array<TierSetup, kNumTiers>{}), ght::logic_error);
}

TEST(Tiered, WhereAndMisuse) {
  auto t = make(UINT64_MAX, UINT64_MAX);
  void* p = t->allocate(12345, req(TensorClass::adam_m, "layers.7.adam_m"));
  auto w = t->where(p);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->tier, TierKind::host);
  EXPECT_EQ(w->cls, TensorClass::adam_m);
  EXPECT_EQ(w->region, "layers.7.adam_m");
  EXPECT_EQ(w->bytes, 12345u);
  EXPECT_FALSE(t->where(static_cast<char*>(p) + 1).has_value());  // only block starts
  EXPECT_FALSE(t->where(nullptr).has_value());
  EXPECT_EQ(t->tier_of(p), TierKind::host);
  // memory_resource interface: the size must match.
  EXPECT_THROW(t->memory_resource::deallocate(p, 100), ght::logic_error);
  t->memory_resource::deallocate(p, 12345, kDefaultAlignment);
  EXPECT_FALSE(t->where(p).has_value());
  EXPECT_THROW(t->deallocate(p), ght::logic_error);  // freed twice
  int local = 0;
  EXPECT_THROW(t->deallocate(&local), ght::logic_error);
  EXPECT_EQ(t->allocate(0, req(TensorClass::weight)), nullptr);
  EXPECT_THROW((void)t->allocate(8, req(TensorClass::weight), nullptr, 3), ght::logic_error);
}

TEST(Tiered, StatsJson) {
  auto t = make(MiB, UINT64_MAX);
  void* a = t->allocate(600 << 10, req(TensorClass::weight));
  void* b = t->allocate(600 << 10, req(TensorClass::weight));  // spills
  void* c = t->allocate(100, req(TensorClass::adam_v));
  const auto j = nlohmann::json::parse(t->stats_json());
  EXPECT_EQ(j["tiers"]["hbm"]["current"].get<std::uint64_t>(), 600u << 10);
  EXPECT_EQ(j["tiers"]["hbm"]["budget"].get<std::uint64_t>(), MiB);
  EXPECT_TRUE(j["tiers"]["host"]["budget"].is_null());  // unlimited
  EXPECT_EQ(j["tiers"]["host"]["current"].get<std::uint64_t>(), (600u << 10) + 100);
  EXPECT_EQ(j["tiers"]["host"]["spills_in"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(j["classes"]["weight"]["current"].get<std::uint64_t>(), 1200u << 10);
  EXPECT_EQ(j["classes"]["weight"]["count"].get<std::uint64_t>(), 2u);
  EXPECT_EQ(j["classes"]["adam_v"]["peak"].get<std::uint64_t>(), 100u);
  EXPECT_EQ(j["spills"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(j["class_defaults"]["master"].get<std::string>(), "host");
  EXPECT_EQ(j["all"]["total"].get<std::uint64_t>(), (1200u << 10) + 100);
  t->deallocate(a);
  t->deallocate(b);
  t->deallocate(c);
  const auto k = nlohmann::json::parse(t->stats_json());
  EXPECT_EQ(k["all"]["current"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(k["all"]["peak"].get<std::uint64_t>(), (1200u << 10) + 100);
}

TEST(Tiered, LogReplaysToTheSamePeaks) {
  const auto path = (std::filesystem::path(::testing::TempDir()) / "ght_tiered_log.csv").string();
  TieredOptions o;
  o.log_path = path;
  auto t = make(4 * MiB, UINT64_MAX, o);
  std::mt19937_64 rng(7);
  std::vector<void*> live;
  for (int i = 0; i < 3000; ++i) {
    if (live.size() < 40 && (live.empty() || rng() % 3 != 0)) {
      live.push_back(t->allocate(1 + rng() % (256 << 10),
                                 req(static_cast<TensorClass>(rng() % kNumTensorClasses))));
    } else {
      const std::size_t k = rng() % live.size();
      t->deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  t->flush_log();
  const ReplayReport rep = replay_log(path);
  for (TierKind k : {TierKind::hbm, TierKind::host}) {
    const TierReport r = t->report(k);
    const TierReplay& x = rep.tiers[static_cast<std::size_t>(k)];
    EXPECT_EQ(x.peak_live, r.usage.peak) << to_string(k);
    EXPECT_EQ(x.allocations, r.usage.count) << to_string(k);
    EXPECT_EQ(x.live_at_end, r.usage.current) << to_string(k);
    EXPECT_GE(x.peak_extent, x.peak_live);
  }
  EXPECT_EQ(rep.peak_live_all, t->total_usage().peak);
  for (void* p : live) t->deallocate(p);
}

TEST(Tiered, ThreadSafety) {
  // Eight threads, a small hbm budget that they race for, regions per thread; every block is
  // checked with where() before it is freed.
  auto t = make(8 * MiB, UINT64_MAX);
  std::atomic<long> spilled{0};
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(static_cast<unsigned>(th));
      const std::string region = "thread." + std::to_string(th);
      std::vector<std::pair<void*, std::size_t>> mine;
      try {
        for (int i = 0; i < 4000; ++i) {
          if (mine.size() < 32 && (mine.empty() || rng() % 2 == 0)) {
            const std::size_t n = 1 + rng() % (512 << 10);
            void* p = t->allocate(n, req(TensorClass::weight, region));
            mine.emplace_back(p, n);
          } else {
            const std::size_t k = rng() % mine.size();
            const auto w = t->where(mine[k].first);
            if (!w || w->bytes != mine[k].second || w->region != region) {
              errors[static_cast<std::size_t>(th)] = "where() disagrees";
            }
            if (w && w->spilled) spilled.fetch_add(1);
            t->deallocate(mine[k].first);
            mine[k] = mine.back();
            mine.pop_back();
          }
        }
        for (auto& [p, n] : mine) {
          if (t->where(p)->spilled) spilled.fetch_add(1);
          t->deallocate(p);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(th)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(t->total_usage().current, 0u);
  EXPECT_EQ(t->report(TierKind::hbm).usage.current, 0u);
  EXPECT_LE(t->report(TierKind::hbm).usage.peak, 8 * MiB);
  EXPECT_EQ(static_cast<std::uint64_t>(spilled.load()), t->spill_count());
  EXPECT_GT(t->spill_count(), 0u);
}

// ---- the factory, from GHT_* options ---------------------------------------------------------

class Factory : public ::testing::Test {
 protected:
  void TearDown() override {
    auto& c = config::cfg();
    c.set_flag("GHT_HOST_BUDGET", "");
    c.set_flag("GHT_SPILL", "on");
    c.set_flag("GHT_ALLOC_TIERS", "");
    c.set_flag("GHT_HOST_MEMORY", "auto");
    c.set_flag("GHT_ALLOC_LOG", "");
  }
};

TEST_F(Factory, BudgetsRulesAndSpillFromConfig) {
  auto& c = config::cfg();
  c.set_flag("GHT_HOST_BUDGET", "64MiB");
  c.set_flag("GHT_SPILL", "off");
  c.set_flag("GHT_ALLOC_TIERS", "weight=host");
  auto t = make_default_tiered_allocator();
  const TierReport host = t->report(TierKind::host);
  ASSERT_TRUE(host.present);
  EXPECT_EQ(host.budget, 64 * MiB);
  EXPECT_FALSE(t->spill_enabled());
  EXPECT_EQ(t->class_default(TensorClass::weight), TierKind::host);
  EXPECT_EQ(t->has_tier(TierKind::hbm), tier::topology().gpu() != nullptr && kCuda);
  try {
    (void)t->allocate(65 * MiB, req(TensorClass::master, "big"));
    FAIL() << "expected out_of_memory";
  } catch (const ght::out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("raise GHT_HOST_BUDGET (now 64.00 MiB)"),
              std::string::npos) << e.what();
  }
  void* p = t->allocate(32 * MiB, req(TensorClass::master));
  EXPECT_EQ(t->where(p)->tier, TierKind::host);
  t->deallocate(p);
}

TEST_F(Factory, PercentBudgetAndBadRules) {
  auto& c = config::cfg();
  c.set_flag("GHT_HOST_BUDGET", "50%");
  auto t = make_default_tiered_allocator();
  EXPECT_EQ(t->report(TierKind::host).budget, tier::topology().capacity(TierKind::host) / 2);
  c.set_flag("GHT_ALLOC_TIERS", "master=gpu");
  EXPECT_THROW((void)make_default_tiered_allocator(), ght::config_error);
}

TEST_F(Factory, HostMemoryKinds) {
  auto& c = config::cfg();
  c.set_flag("GHT_HOST_MEMORY", "system");
  EXPECT_NE(make_default_tiered_allocator()->tier_resource(TierKind::host)->name().find(
                "system_host"),
            std::string::npos);
#ifndef GHT_HAVE_CUDA
  c.set_flag("GHT_HOST_MEMORY", "pinned");  // without CUDA: NUMA-bound, unregistered memory
  EXPECT_NE(make_default_tiered_allocator()->tier_resource(TierKind::host)->name().find(
                "pinned_host"),
            std::string::npos);
  c.set_flag("GHT_HOST_MEMORY", "managed");
  EXPECT_THROW((void)make_default_tiered_allocator(), ght::logic_error);
#endif
}

TEST_F(Factory, AllocationLogFromConfig) {
  const auto path = (std::filesystem::path(::testing::TempDir()) / "ght_factory_log.csv").string();
  config::cfg().set_flag("GHT_ALLOC_LOG", path);
  {
    auto t = make_default_tiered_allocator();
    void* p = t->allocate(1000, req(TensorClass::master));
    t->deallocate(p);
  }
  const ReplayReport rep = replay_log(path);
  EXPECT_EQ(rep.events, 2u);
  EXPECT_EQ(rep.tiers[static_cast<std::size_t>(TierKind::host)].peak_live, 1000u);
}

}  // namespace
