#include "optimizer/cpu_threads.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

namespace ght::optimizer {
namespace {

TEST(CpuThreads, RangesCoverEverythingOnceOnLineBoundaries) {
  for (std::size_t n : {0ul, 1ul, 15ul, 16ul, 17ul, 1000ul, 1000003ul}) {
    for (int nt : {1, 2, 3, 7, 16, 64}) {
      std::size_t expect_begin = 0;
      for (int t = 0; t < nt; ++t) {
        const Range r = thread_range(n, t, nt);
        ASSERT_EQ(r.begin, expect_begin) << "n=" << n << " nt=" << nt << " t=" << t;
        ASSERT_LE(r.begin, r.end);
        if (r.end < n) {
          ASSERT_EQ(r.end % 16, 0u) << "cut inside a cache line";
        }
        expect_begin = r.end;
      }
      ASSERT_EQ(expect_begin, n) << "n=" << n << " nt=" << nt;
    }
  }
}

TEST(CpuThreads, ResolveHonoursAnExplicitRequest) {
  EXPECT_EQ(resolve_cpu_threads(3), 3);
  EXPECT_GE(resolve_cpu_threads(0), 1);
  EXPECT_FALSE(pinned_cpu_list().empty());
}

TEST(CpuThreads, TeamThreadsArePinnedAndCallerMaskIsRestored) {
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const int n = std::max(2, resolve_cpu_threads(0));  // a team of one runs inline, unpinned
  std::mutex mu;
  std::vector<int> counts(static_cast<std::size_t>(n), -1);
  std::vector<int> cpus(static_cast<std::size_t>(n), -1);
  std::atomic<int> team{0};
  parallel_pinned(n, [&](int tid, int nt) {
    cpu_set_t s;
    CPU_ZERO(&s);
    sched_getaffinity(0, sizeof s, &s);
    std::lock_guard<std::mutex> lock(mu);
    team = nt;
    counts[static_cast<std::size_t>(tid)] = CPU_COUNT(&s);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &s)) cpus[static_cast<std::size_t>(tid)] = c;
    }
  });
  ASSERT_EQ(team.load(), n);
  const auto& list = pinned_cpu_list();
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(counts[static_cast<std::size_t>(t)], 1) << "thread " << t << " is not pinned";
    EXPECT_EQ(cpus[static_cast<std::size_t>(t)], list[static_cast<std::size_t>(t) % list.size()]);
  }
  cpu_set_t after;
  CPU_ZERO(&after);
  ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the caller's affinity mask was not restored";
}

TEST(CpuThreads, ZeroHostClearsEveryByteForAnyTeam) {
  for (std::size_t bytes : {1ul, 63ul, 4097ul, (5ul << 20) + 3}) {
    for (int threads : {1, 2, 3}) {
      std::vector<unsigned char> buf(bytes + 2, 0xAB);
      zero_host(buf.data() + 1, bytes, threads);
      EXPECT_EQ(buf.front(), 0xAB);
      EXPECT_EQ(buf.back(), 0xAB) << "wrote past the end";
      std::size_t nonzero = 0;
      for (std::size_t i = 1; i <= bytes; ++i) nonzero += buf[i] != 0;
      EXPECT_EQ(nonzero, 0u) << bytes << " bytes, " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace ght::optimizer
