// The C ABI (ght/ght.h): allocation by class and tier hint, where, stats, errors reported
// through ght_last_error with no exception escaping, and the PyTorch entry points.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "ght/ght.h"
#include "tier/config.hpp"
#include "tier/topology.hpp"

namespace {

class CAbi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ght_finalize(), 0);
    auto& c = ght::config::cfg();
    c.set_flag("GHT_HOST_BUDGET", "256MiB");
    c.set_flag("GHT_SPILL", "on");
  }
  void TearDown() override {
    EXPECT_EQ(ght_finalize(), 0);
    auto& c = ght::config::cfg();
    c.set_flag("GHT_HOST_BUDGET", "");
    c.set_flag("GHT_TORCH_TIER", "hbm");
  }
  static bool has_gpu() {
#ifdef GHT_HAVE_CUDA
    return ght::tier::topology().gpu() != nullptr;
#else
    return false;
#endif
  }
};

TEST_F(CAbi, MallocWhereFree) {
  ASSERT_EQ(ght_init(), 0) << ght_last_error();
  ASSERT_EQ(ght_init(), 0);  // idempotent
  void* m = ght_malloc_region(1 << 20, GHT_CLASS_MASTER, GHT_TIER_AUTO, "layers.0.master");
  ASSERT_NE(m, nullptr) << ght_last_error();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m) % 256, 0u);
  std::memset(m, 1, 1 << 20);  // host tier: the CPU writes it
  ght_placement pl{};
  ASSERT_EQ(ght_where(m, &pl), 0) << ght_last_error();
  EXPECT_EQ(pl.tier, GHT_TIER_HOST);
  EXPECT_EQ(pl.tensor_class, GHT_CLASS_MASTER);
  EXPECT_EQ(pl.bytes, 1u << 20);
  EXPECT_STREQ(pl.region, "layers.0.master");
  EXPECT_EQ(pl.spilled, 0);
  EXPECT_NE(ght_device_pointer(m), nullptr) << ght_last_error();

  void* w = ght_malloc(4096, GHT_CLASS_WEIGHT, GHT_TIER_AUTO);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(ght_where(w, &pl), 0);
  EXPECT_EQ(pl.tier, has_gpu() ? GHT_TIER_HBM : GHT_TIER_HOST);  // no hbm tier without a GPU
  EXPECT_STREQ(pl.region, "");

  void* h = ght_malloc(4096, GHT_CLASS_WEIGHT, GHT_TIER_HOST);  // the hint wins
  ASSERT_EQ(ght_where(h, &pl), 0);
  EXPECT_EQ(pl.tier, GHT_TIER_HOST);

  EXPECT_EQ(ght_free(m), 0);
  EXPECT_EQ(ght_free(w), 0);
  EXPECT_EQ(ght_free(h), 0);
  EXPECT_EQ(ght_free(nullptr), 0);
  EXPECT_EQ(ght_where(m, &pl), -1);
  EXPECT_EQ(ght_malloc(0, GHT_CLASS_OTHER, GHT_TIER_AUTO), nullptr);
}

TEST_F(CAbi, ErrorsAreReportedNotThrown) {
  EXPECT_EQ(ght_malloc(16, 42, GHT_TIER_AUTO), nullptr);
  EXPECT_NE(std::string(ght_last_error()).find("tensor_class 42"), std::string::npos)
      << ght_last_error();
  EXPECT_EQ(ght_malloc(16, GHT_CLASS_GRAD, 7), nullptr);
  EXPECT_NE(std::string(ght_last_error()).find("tier_hint 7"), std::string::npos);
  int local = 0;
  EXPECT_EQ(ght_free(&local), -1);
  EXPECT_NE(std::string(ght_last_error()).find("not a live block"), std::string::npos)
      << ght_last_error();
  EXPECT_EQ(ght_where(&local, nullptr), -1);
  // Over every budget: NULL, and the message carries the out-of-memory report.
  EXPECT_EQ(ght_malloc(std::size_t{300} << 20, GHT_CLASS_MASTER, GHT_TIER_HOST), nullptr);
  EXPECT_NE(std::string(ght_last_error()).find("GHT_HOST_BUDGET"), std::string::npos)
      << ght_last_error();
  // The error is per thread.
  std::string other;
  std::thread([&] { other = ght_last_error(); }).join();
  EXPECT_EQ(other, "");
}

TEST_F(CAbi, BadConfigurationFailsInit) {
  ght::config::cfg().set_flag("GHT_ALLOC_TIERS", "grad=nowhere");
  EXPECT_EQ(ght_init(), -1);
  EXPECT_NE(std::string(ght_last_error()).find("GHT_ALLOC_TIERS"), std::string::npos);
  EXPECT_EQ(ght_malloc(16, GHT_CLASS_GRAD, GHT_TIER_AUTO), nullptr);
  ght::config::cfg().set_flag("GHT_ALLOC_TIERS", "");
  EXPECT_EQ(ght_init(), 0) << ght_last_error();
}

TEST_F(CAbi, StatsJson) {
  void* a = ght_malloc(1000, GHT_CLASS_ADAM_M, GHT_TIER_AUTO);
  void* b = ght_malloc(3000, GHT_CLASS_ADAM_V, GHT_TIER_AUTO);
  const char* s = ght_stats_json();
  ASSERT_NE(s, nullptr) << ght_last_error();
  const auto j = nlohmann::json::parse(s);
  EXPECT_EQ(j["classes"]["adam_m"]["current"].get<std::uint64_t>(), 1000u);
  EXPECT_EQ(j["tiers"]["host"]["current"].get<std::uint64_t>(), 4000u);
  EXPECT_EQ(j["tiers"]["host"]["budget"].get<std::uint64_t>(), 256u << 20);
  EXPECT_EQ(j["tiers"]["hbm"]["present"].get<bool>(), has_gpu());
  ght_free(a);
  ght_free(b);
}

TEST_F(CAbi, TorchEntryPoints) {
  for (const char* tier : {"hbm", "host"}) {
    ASSERT_EQ(ght_finalize(), 0);
    ght::config::cfg().set_flag("GHT_TORCH_TIER", tier);
    void* p = ght_torch_malloc(1 << 20, 0, nullptr);
    ASSERT_NE(p, nullptr) << tier << ": " << ght_last_error();
    ght_placement pl{};
    ASSERT_EQ(ght_where(p, &pl), 0) << ght_last_error();  // by the address PyTorch holds
    const bool host = std::string(tier) == "host" || !has_gpu();
    EXPECT_EQ(pl.tier, host ? GHT_TIER_HOST : GHT_TIER_HBM) << tier;
    EXPECT_EQ(pl.tensor_class, GHT_CLASS_OTHER);
    EXPECT_STREQ(pl.region, "torch");
    if (!has_gpu()) std::memset(p, 5, 1 << 20);
    EXPECT_EQ(ght_torch_malloc(0, 0, nullptr), nullptr);
    EXPECT_EQ(ght_torch_malloc(-1, 0, nullptr), nullptr);
    ght_torch_free(p, 1 << 20, 0, nullptr);
    ght_torch_free(nullptr, 0, 0, nullptr);
    const auto j = nlohmann::json::parse(ght_stats_json());
    // Host blocks may wait for their stream before they are released; force it by finalize.
    EXPECT_EQ(j["tiers"][host ? "host" : "hbm"]["count"].get<std::uint64_t>(), 1u);
  }
}

TEST_F(CAbi, TorchThreadTier) {
  ght::config::cfg().set_flag("GHT_TORCH_TIER", "hbm");
  EXPECT_EQ(ght_torch_thread_tier(), GHT_TIER_AUTO);
  int prev = 99;
  ASSERT_EQ(ght_torch_set_thread_tier(GHT_TIER_HOST, &prev), 0) << ght_last_error();
  EXPECT_EQ(prev, GHT_TIER_AUTO);
  EXPECT_EQ(ght_torch_thread_tier(), GHT_TIER_HOST);
  void* p = ght_torch_malloc(1 << 16, 0, nullptr);  // GHT_TORCH_TIER says hbm; the thread, host
  ASSERT_NE(p, nullptr) << ght_last_error();
  ght_placement pl{};
  ASSERT_EQ(ght_where(p, &pl), 0) << ght_last_error();
  EXPECT_EQ(pl.tier, GHT_TIER_HOST);
  // Another thread keeps GHT_TORCH_TIER.
  int other = 99;
  std::thread([&] { other = ght_torch_thread_tier(); }).join();
  EXPECT_EQ(other, GHT_TIER_AUTO);
  // An invalid value is refused and leaves the setting alone.
  EXPECT_EQ(ght_torch_set_thread_tier(7, &prev), -1);
  EXPECT_NE(std::strstr(ght_last_error(), "tier 7"), nullptr) << ght_last_error();
  EXPECT_EQ(ght_torch_thread_tier(), GHT_TIER_HOST);
  ASSERT_EQ(ght_torch_set_thread_tier(GHT_TIER_HBM, &prev), 0);
  EXPECT_EQ(prev, GHT_TIER_HOST);
  void* q = ght_torch_malloc(1 << 16, 0, nullptr);
  ASSERT_NE(q, nullptr) << ght_last_error();
  ASSERT_EQ(ght_where(q, &pl), 0) << ght_last_error();
  EXPECT_EQ(pl.tier, has_gpu() ? GHT_TIER_HBM : GHT_TIER_HOST);  // no hbm tier without a GPU
  ASSERT_EQ(ght_torch_set_thread_tier(GHT_TIER_AUTO, nullptr), 0);
  EXPECT_EQ(ght_torch_thread_tier(), GHT_TIER_AUTO);
  ght_torch_free(p, 1 << 16, 0, nullptr);
  ght_torch_free(q, 1 << 16, 0, nullptr);
}

TEST_F(CAbi, ManyThreads) {
  std::vector<std::thread> th;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = ght_malloc(64 + static_cast<std::size_t>(i % 100) * 100, t % 7, GHT_TIER_HOST);
        if (p == nullptr || ght_free(p) != 0) failures.fetch_add(1);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(failures.load(), 0);
  const auto j = nlohmann::json::parse(ght_stats_json());
  EXPECT_EQ(j["all"]["current"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["all"]["count"].get<std::uint64_t>(), 16000u);
}

}  // namespace
