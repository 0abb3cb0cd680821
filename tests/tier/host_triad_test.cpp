// The host STREAM triad (tier/host_triad.hpp): its result is checked inside measure_host_triad,
// so these tests check the bookkeeping around it, the team hook and the CPU list. No timing
// thresholds: the machine's speed is not the code's correctness.
#include "tier/host_triad.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>

#include <cmath>
#include <vector>

#include "tier/error.hpp"
#include "tier/topology.hpp"

TEST(HostTriad, HostTriadComputesAndReportsBandwidth) {
  const auto& t = ght::tier::topology();
  // Small arrays: this checks the kernel and the bookkeeping, not the machine's speed.
  ght::tier::HostTriadOptions o;
  o.node = t.host_numa_node;
  o.threads = 2;
  o.array_bytes = 8u << 20;
  o.min_reps = 2;
  const ght::tier::HostTriadResult r = ght::tier::measure_host_triad(o);
  EXPECT_EQ(r.threads, 2);
  EXPECT_EQ(r.array_bytes, std::size_t{8} << 20);
  ASSERT_GE(r.pass_bps.size(), 2u);
  EXPECT_TRUE(std::isfinite(r.best_bps));
  EXPECT_GT(r.best_bps, 0.0);
  EXPECT_GE(r.best_bps, r.median_bps);
  EXPECT_GE(r.huge_page_fraction, 0.0);
  EXPECT_LE(r.huge_page_fraction, 1.0);
#if defined(__x86_64__)
  EXPECT_TRUE(r.nontemporal);
#endif
  o.threads = 0;
  EXPECT_THROW((void)ght::tier::measure_host_triad(o), ght::logic_error);
}

TEST(HostTriad, HostTriadRunsOnAGivenTeamWithOddSizes) {
  // A size that is not a whole number of cache lines, split unevenly over a caller-provided team
  // of three that runs the slices one after another: the slices must still cover every element
  // (the triad checks its result and throws otherwise).
  ght::tier::HostTriadOptions o;
  o.node = ght::tier::topology().host_numa_node;
  o.array_bytes = (1u << 20) + 4 * 37;
  o.huge_pages = false;
  o.parallel = [](const ght::tier::TeamBody& body) {
    for (int t = 0; t < 3; ++t) body(t, 3);
  };
  std::vector<int> after;  // after_pass sees every timed pass, in order
  o.min_reps = 3;
  o.after_pass = [&after](int pass) { after.push_back(pass); };
  const ght::tier::HostTriadResult r = ght::tier::measure_host_triad(o);
  EXPECT_EQ(after, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r.threads, 3);
  EXPECT_EQ(r.array_bytes, (std::size_t{1} << 20) + 128);  // whole 64-byte lines only
  EXPECT_EQ(r.pass_bps.size(), 3u);
}

TEST(HostTriad, TeamCpusAreAllowedAndNeverEmpty) {
  const std::vector<int> cpus = ght::tier::team_cpus(ght::tier::topology().host_numa_node);
  ASSERT_FALSE(cpus.empty());
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  for (int c : cpus) EXPECT_TRUE(CPU_ISSET(c, &set)) << "cpu " << c;
  EXPECT_FALSE(ght::tier::team_cpus(5000).empty());  // no such node: the process's CPUs
}

TEST(HostTriad, HugePageHelpersAnswerForAnyRange) {
  // Whether THP is granted depends on the kernel's settings; the helpers must not fail either way
  // and never report more huge-page bytes than the range holds.
  const std::size_t bytes = std::size_t{8} << 20;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  (void)ght::tier::advise_huge_pages(m, bytes);
  auto* p = static_cast<unsigned char*>(m);
  for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  EXPECT_LE(ght::tier::huge_page_bytes(m, bytes), bytes);
  EXPECT_LE(ght::tier::huge_page_bytes(p + 4096, 4096), std::size_t{4096});
  EXPECT_FALSE(ght::tier::advise_huge_pages(p + 4096, 4096));  // no whole huge page inside
  munmap(m, bytes);
}
