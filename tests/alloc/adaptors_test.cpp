// Adaptors: statistics counters and JSON, the limit's budget, the logging CSV format.
#include <gtest/gtest.h>

#include <barrier>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "alloc/limit.hpp"
#include "alloc/logging.hpp"
#include "alloc/statistics.hpp"
#include "alloc/system_host.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

TEST(Statistics, CountsPerClassAndTier) {
  system_host host(-1, false);
  statistics_adaptor s(host);
  void* a = s.allocate(1000, 256, nullptr, TensorClass::grad);
  void* b = s.allocate(3000, 256, nullptr, TensorClass::master);
  void* c = s.allocate(500, 256, nullptr, TensorClass::grad);
  EXPECT_EQ(s.class_usage(TensorClass::grad).current, 1500u);
  EXPECT_EQ(s.class_usage(TensorClass::grad).count, 2u);
  EXPECT_EQ(s.class_usage(TensorClass::master).current, 3000u);
  EXPECT_EQ(s.tier_usage(TierKind::host).current, 4500u);
  EXPECT_EQ(s.tier_usage(TierKind::hbm).count, 0u);
  s.deallocate(b, 3000, 256, nullptr, TensorClass::master);
  void* d = s.allocate(100, 256, nullptr, TensorClass::weight);
  const Usage all = s.total_usage();
  EXPECT_EQ(all.current, 1600u);
  EXPECT_EQ(all.peak, 4500u);
  EXPECT_EQ(all.total, 4600u);
  EXPECT_EQ(all.count, 4u);
  EXPECT_EQ(s.class_usage(TensorClass::master).peak, 3000u);
  EXPECT_EQ(s.class_usage(TensorClass::master).current, 0u);

  const auto j = nlohmann::json::parse(s.to_json());
  EXPECT_EQ(j["resource"].get<std::string>(), "system_host");
  EXPECT_EQ(j["all"]["peak"].get<std::uint64_t>(), 4500u);
  EXPECT_EQ(j["tiers"]["host"]["current"].get<std::uint64_t>(), 1600u);
  EXPECT_EQ(j["tiers"]["hbm"]["total"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["classes"]["grad"]["total"].get<std::uint64_t>(), 1500u);
  EXPECT_EQ(j["classes"]["weight"]["count"].get<std::uint64_t>(), 1u);
  for (const char* k : {"weight", "grad", "master", "adam_m", "adam_v", "activation", "other"}) {
    EXPECT_TRUE(j["classes"].contains(k)) << k;
  }
  s.deallocate(a, 1000, 256, nullptr, TensorClass::grad);
  s.deallocate(c, 500, 256, nullptr, TensorClass::grad);
  s.deallocate(d, 100, 256, nullptr, TensorClass::weight);
  EXPECT_EQ(s.total_usage().current, 0u);
  EXPECT_EQ(s.name(), "statistics(system_host)");
}

TEST(Statistics, PeakUnderConcurrency) {
  // Each of 4 threads holds at most 2 blocks of 1 KiB: the peak can never pass 8 KiB.
  system_host host(-1, false);
  statistics_adaptor s(host);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t) {
    th.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        void* a = s.allocate(1024);
        void* b = s.allocate(1024);
        s.deallocate(a, 1024);
        s.deallocate(b, 1024);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(s.total_usage().current, 0u);
  EXPECT_LE(s.total_usage().peak, 8u * 1024);
  EXPECT_GE(s.total_usage().peak, 2u * 1024);
  EXPECT_EQ(s.total_usage().count, 4u * 20000 * 2);
}

TEST(Limit, BudgetAndSetBudget) {
  system_host host(-1, false);
  limit_adaptor lim(host, 10000);
  EXPECT_EQ(lim.budget(), 10000u);
  void* a = lim.allocate(6000);
  EXPECT_THROW((void)lim.allocate(5000), ght::out_of_memory);
  EXPECT_THROW((void)lim.allocate(UINT64_MAX / 2), ght::out_of_memory);  // no overflow
  EXPECT_LE(lim.physical_free(), 4000u);
  lim.set_budget(20000);
  void* b = lim.allocate(5000);
  EXPECT_EQ(lim.used(), 11000u);
  lim.set_budget(1000);  // below what is in use: frees still work, allocations fail
  EXPECT_THROW((void)lim.allocate(1), ght::out_of_memory);
  EXPECT_EQ(lim.physical_free(), 0u);
  lim.deallocate(a, 6000);
  lim.deallocate(b, 5000);
  EXPECT_EQ(lim.used(), 0u);
  void* c = lim.allocate(1000);
  lim.deallocate(c, 1000);
}

TEST(Limit, ConcurrentCallersNeverOvershoot) {
  // Each round, 8 threads each try to hold 4 blocks of 4 KiB at once (a barrier keeps them
  // all holding) under a 64 KiB budget: exactly 16 requests succeed and 16 are refused.
  constexpr int kThreads = 8, kRounds = 200;
  system_host host(-1, false);
  limit_adaptor lim(host, 64 * 1024);
  statistics_adaptor s(lim);
  std::barrier sync(kThreads);
  std::atomic<int> refused{0};
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        std::vector<void*> mine;
        for (int i = 0; i < 4; ++i) {
          try {
            mine.push_back(s.allocate(4096));
          } catch (const ght::out_of_memory&) {
            refused.fetch_add(1);
          }
        }
        sync.arrive_and_wait();  // everyone holds what they got
        for (void* p : mine) s.deallocate(p, 4096);
        sync.arrive_and_wait();  // everyone has freed before the next round
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(s.total_usage().peak, 64u * 1024);
  EXPECT_EQ(lim.used(), 0u);
  EXPECT_EQ(refused.load(), kRounds * 16);
  EXPECT_EQ(s.total_usage().count, static_cast<std::uint64_t>(kRounds) * 16);
}

TEST(Logging, CsvFormat) {
  const auto path = (std::filesystem::path(::testing::TempDir()) / "ght_log_format.csv").string();
  {
    system_host host(-1, false);
    logging_adaptor log(host, std::make_shared<log_sink>(path));
    void* a = log.allocate(100, 256, reinterpret_cast<stream_t>(0x1234), TensorClass::adam_v);
    std::thread other([&] { log.deallocate(a, 100, 256, nullptr, TensorClass::adam_v); });
    other.join();
    log.sink().flush();
  }
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "thread,time_ns,action,pointer,size,tier,class,stream");
  // (std::regex would do, but GCC 12 warns inside it under -fsanitize; split by hand.)
  const auto fields = [](const std::string& l) {
    std::vector<std::string> f;
    std::size_t pos = 0;
    for (;;) {
      const std::size_t c = l.find(',', pos);
      f.push_back(l.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
      if (c == std::string::npos) return f;
      pos = c + 1;
    }
  };
  const auto is_hex = [](const std::string& v) {
    return v.size() > 2 && v.rfind("0x", 0) == 0 &&
           v.find_first_not_of("0123456789abcdef", 2) == std::string::npos;
  };
  const auto is_dec = [](const std::string& v) {
    return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  };
  ASSERT_TRUE(std::getline(in, line));
  const auto a = fields(line);
  ASSERT_EQ(a.size(), 8u) << line;
  EXPECT_TRUE(is_dec(a[0]) && is_dec(a[1]) && is_hex(a[3])) << line;
  EXPECT_EQ(a[2], "allocate");
  EXPECT_EQ(a[4], "100");
  EXPECT_EQ(a[5], "host");
  EXPECT_EQ(a[6], "adam_v");
  EXPECT_EQ(a[7], "0x1234");
  ASSERT_TRUE(std::getline(in, line));
  const auto f = fields(line);
  ASSERT_EQ(f.size(), 8u) << line;
  EXPECT_EQ(f[2], "free");
  EXPECT_EQ(f[3], a[3]);
  EXPECT_EQ(f[7], "0x0");
  EXPECT_NE(f[0], a[0]);  // freed on another thread
  EXPECT_GE(std::stoll(f[1]), std::stoll(a[1]));
  EXPECT_FALSE(std::getline(in, line));
}

TEST(Logging, UnwritablePathNamesIt) {
  try {
    log_sink bad("/nonexistent-dir/ght.csv");
    FAIL() << "expected io_error";
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/ght.csv"), std::string::npos);
  }
}

}  // namespace
