// Machine model: discovery on the machine running the test, and the decision rules on synthetic
// machines (GH200, two-socket x86) that CI is not.
#include "tier/topology.hpp"

#include <gtest/gtest.h>
#include <numa.h>
#include <sched.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "tier/config.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/detail/topology_detail.hpp"
#include "tier/error.hpp"

namespace {

using ght::LinkKind;
using ght::TierKind;
using ght::tier::NumaNode;
namespace detail = ght::tier::detail;

constexpr std::uint64_t kTiB = std::uint64_t{1} << 40;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

/// Restores the options a test changed, so tests can run in one process in any order.
class TopologyTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ght::config::cfg().set_flag("GHT_HOST_NUMA", "-1");
    (void)ght::tier::topology(/*refresh=*/true);
  }
};

NumaNode node(int os, std::uint64_t total, std::vector<int> cpus) {
  NumaNode n;
  n.os_index = os;
  n.total_bytes = total;
  n.free_bytes = total / 2;
  n.cpus = std::move(cpus);
  return n;
}

// ---- this machine ---------------------------------------------------------------------------

TEST_F(TopologyTest, DiscoversCpusNodesAndHostTier) {
  const auto& t = ght::tier::topology();
  EXPECT_FALSE(t.hostname.empty());
  EXPECT_FALSE(t.cpu_arch.empty());
  EXPECT_GE(t.cores, 1);
  EXPECT_GE(t.pus, t.cores);
  ASSERT_FALSE(t.numa_nodes.empty());

  int with_cpus = 0;
  std::set<int> seen_cpus;
  for (const auto& n : t.numa_nodes) {
    if (!n.cpus.empty()) ++with_cpus;
    EXPECT_LE(n.free_bytes, n.total_bytes) << "node " << n.os_index;
    EXPECT_LE(n.total_bytes, 64 * kTiB) << "node " << n.os_index;
    for (int c : n.cpus) EXPECT_TRUE(seen_cpus.insert(c).second) << "cpu " << c << " twice";
  }
  EXPECT_GE(with_cpus, 1);
  EXPECT_EQ(static_cast<int>(seen_cpus.size()), t.cores) << "one entry per core";

  // The host tier sits on a real node with memory that is not GPU memory.
  bool found = false;
  for (const auto& n : t.numa_nodes) {
    if (n.os_index != t.host_numa_node) continue;
    found = true;
    EXPECT_TRUE(detail::is_host_candidate(n));
    EXPECT_FALSE(n.is_gpu_memory);
  }
  EXPECT_TRUE(found) << "host_numa_node " << t.host_numa_node << " is not a discovered node";

  const std::uint64_t cap = t.capacity(TierKind::host);
  const std::uint64_t avail = t.available(TierKind::host);
  EXPECT_GT(cap, 0u);
  EXPECT_LE(cap, 64 * kTiB);
  EXPECT_GT(avail, 0u);
  EXPECT_LE(avail, cap);
  EXPECT_GT(t.host_total_bytes, 0u);
  EXPECT_LE(t.host_total_bytes, 64 * kTiB);
  EXPECT_GE(t.host_total_bytes, cap);
  EXPECT_LE(t.host_available_bytes, t.host_total_bytes);
}

TEST_F(TopologyTest, LinkKindFollowsTheSelectedGpu) {
  const auto& t = ght::tier::topology();
#ifndef GHT_HAVE_CUDA
  EXPECT_TRUE(t.gpus.empty()) << "a CPU-only build must report no GPU";
#endif
  if (t.gpus.empty()) {
    EXPECT_EQ(t.gpu(), nullptr);
    EXPECT_EQ(t.gpu_index, -1);
    EXPECT_EQ(t.link, LinkKind::none);
    EXPECT_EQ(t.capacity(TierKind::hbm), 0u);
    EXPECT_EQ(t.available(TierKind::hbm), 0u);
    return;
  }
  const auto* g = t.gpu();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(t.link, g->pageable_uses_host_page_tables && g->host_native_atomics ? LinkKind::c2c
                                                                                : LinkKind::pcie);
  EXPECT_EQ(t.capacity(TierKind::hbm), g->hbm_total_bytes);
  EXPECT_LE(t.available(TierKind::hbm), t.capacity(TierKind::hbm));
}

TEST_F(TopologyTest, TextAndJsonDescribeTheMachine) {
  const auto& t = ght::tier::topology();
  const std::string text = t.format_text();
  EXPECT_NE(text.find(t.hostname), std::string::npos);
  EXPECT_NE(text.find("link        " + std::string(ght::to_string(t.link))), std::string::npos);
  EXPECT_NE(text.find("<- host tier"), std::string::npos);

  const auto j = nlohmann::json::parse(t.format_json());
  EXPECT_EQ(j["hostname"], t.hostname);
  EXPECT_EQ(j["cores"], t.cores);
  EXPECT_EQ(j["numa_nodes"].size(), t.numa_nodes.size());
  EXPECT_EQ(j["gpus"].size(), t.gpus.size());
  EXPECT_EQ(j["host_numa_node"], t.host_numa_node);
  EXPECT_EQ(j["link"], std::string(ght::to_string(t.link)));
}

TEST_F(TopologyTest, HostNumaOptionSelectsAndValidates) {
  const int node = ght::tier::topology().host_numa_node;
  ght::config::cfg().set_flag("GHT_HOST_NUMA", std::to_string(node));
  EXPECT_EQ(ght::tier::topology(true).host_numa_node, node);

  ght::config::cfg().set_flag("GHT_HOST_NUMA", "1000");
  try {
    (void)ght::tier::topology(true);
    FAIL() << "GHT_HOST_NUMA=1000 was accepted";
  } catch (const ght::config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GHT_HOST_NUMA=1000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("valid host NUMA nodes: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(node)), std::string::npos) << msg;
  }
}

TEST_F(TopologyTest, BindThreadToNodeSetsAffinityAndPreference) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support";
  const int node = ght::tier::topology().host_numa_node;
  bool ok = false;
  int preferred = -2;
  std::vector<int> wrong_cpus;
  std::thread th([&] {
    ght::tier::bind_thread_to_node(node);
    preferred = numa_preferred();
    cpu_set_t set;
    CPU_ZERO(&set);
    ok = sched_getaffinity(0, sizeof set, &set) == 0;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set) && numa_node_of_cpu(c) != node) wrong_cpus.push_back(c);
    }
  });
  th.join();
  ASSERT_TRUE(ok);
  EXPECT_EQ(preferred, node);
  EXPECT_TRUE(wrong_cpus.empty()) << "thread may run on cpu " << wrong_cpus.front()
                                  << " outside node " << node;
}

TEST_F(TopologyTest, BindThreadToNodeRejectsMissingNodes) {
  EXPECT_THROW(ght::tier::bind_thread_to_node(-1), ght::logic_error);
  EXPECT_THROW(ght::tier::bind_thread_to_node(5000), ght::logic_error);
}

TEST_F(TopologyTest, ProbeSizesTheTriadForThisMachine) {
  const auto& t = ght::tier::topology();
  const std::size_t triad = detail::triad_array_bytes(t);
  EXPECT_GE(triad, std::size_t{64} << 20);
  EXPECT_LE(triad, std::size_t{4} << 30);
  EXPECT_LE(triad, std::max<std::uint64_t>(t.available(TierKind::host) / 16, 64u << 20));
  EXPECT_GE(detail::host_threads(t), 1);
}

// ---- decision rules -------------------------------------------------------------------------

TEST(TopologyRules, LinkKindTruthTable) {
  EXPECT_EQ(detail::link_kind_from_attributes(false, true, true), LinkKind::none);
  EXPECT_EQ(detail::link_kind_from_attributes(true, true, true), LinkKind::c2c);
  EXPECT_EQ(detail::link_kind_from_attributes(true, true, false), LinkKind::pcie);
  EXPECT_EQ(detail::link_kind_from_attributes(true, false, true), LinkKind::pcie);
  EXPECT_EQ(detail::link_kind_from_attributes(true, false, false), LinkKind::pcie);
}

TEST(TopologyRules, Gh200HostTierIsLpddrNotHbm) {
  // Grace: node 0 has the 72 cores and LPDDR5X; node 1 is the HBM, CPU-less; nodes 2-9 are
  // empty MIG placeholders.
  std::vector<NumaNode> nodes = {node(0, 480 * kGiB, {0, 1, 2, 3}), node(1, 96 * kGiB, {})};
  for (int i = 2; i < 10; ++i) nodes.push_back(node(i, 0, {}));
  detail::flag_gpu_memory_nodes(nodes, {1});
  EXPECT_FALSE(nodes[0].is_gpu_memory);
  EXPECT_TRUE(nodes[1].is_gpu_memory);
  EXPECT_FALSE(nodes[2].is_gpu_memory) << "no memory: not flagged";

  // hwloc may put both nodes in the GPU's ancestor nodeset; the CPU node wins.
  EXPECT_EQ(detail::nearest_host_node(nodes, {1, 0}), 0);
  EXPECT_EQ(detail::nearest_host_node(nodes, {1}), -1);
  EXPECT_EQ(detail::select_host_node(nodes, -1, 0), 0);
  EXPECT_EQ(detail::select_host_node(nodes, -1, 1), 0) << "never the HBM node";
  EXPECT_EQ(detail::select_host_node(nodes, -1, -1), 0);

  try {
    (void)detail::select_host_node(nodes, 1, 0);
    FAIL() << "GHT_HOST_NUMA=1 (the HBM) was accepted";
  } catch (const ght::config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GHT_HOST_NUMA=1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HBM"), std::string::npos) << msg;
    EXPECT_NE(msg.find("valid host NUMA nodes: 0 "), std::string::npos) << msg;
  }
  EXPECT_THROW((void)detail::select_host_node(nodes, 5, 0), ght::config_error);  // no memory
  EXPECT_THROW((void)detail::select_host_node(nodes, 42, 0), ght::config_error);  // no node
}

TEST(TopologyRules, NodeWithCpusIsNeverGpuMemory) {
  std::vector<NumaNode> nodes = {node(0, 64 * kGiB, {0, 1})};
  detail::flag_gpu_memory_nodes(nodes, {0});
  EXPECT_FALSE(nodes[0].is_gpu_memory);
}

TEST(TopologyRules, TwoSocketPicksNodeNearestGpuUnlessOverridden) {
  const std::vector<NumaNode> nodes = {node(0, 256 * kGiB, {0, 1}), node(1, 256 * kGiB, {2, 3})};
  EXPECT_EQ(detail::nearest_host_node(nodes, {1}), 1);
  EXPECT_EQ(detail::select_host_node(nodes, -1, 1), 1);
  EXPECT_EQ(detail::select_host_node(nodes, 0, 1), 0);
  EXPECT_EQ(detail::select_host_node(nodes, -1, -1), 0);
  // A CPU-less memory node (CXL) is used only when no node with CPUs is nearer.
  const std::vector<NumaNode> cxl = {node(0, 256 * kGiB, {0, 1}), node(2, 512 * kGiB, {})};
  EXPECT_EQ(detail::nearest_host_node(cxl, {2, 0}), 0);
  EXPECT_EQ(detail::nearest_host_node(cxl, {2}), 2);
}

TEST(TopologyRules, NoNodeZeroFallsBackToFirstCandidate) {
  const std::vector<NumaNode> nodes = {node(0, 0, {}), node(3, 32 * kGiB, {0})};
  EXPECT_EQ(detail::select_host_node(nodes, -1, -1), 3);
}

TEST(TopologyRules, FormatsUuidCpuListsAndMeminfo) {
  const unsigned char b[16] = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67,
                               0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0xff};
  EXPECT_EQ(detail::format_gpu_uuid(b), "GPU-deadbeef-0123-4567-89ab-cdef001122ff");

  EXPECT_EQ(detail::format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(detail::format_cpu_list({5}), "5");
  EXPECT_EQ(detail::format_cpu_list({}), "");

  const std::string mi =
      "MemTotal:       24683652 kB\nMemFree:        24467724 kB\nMemAvailable:   24407456 kB\n";
  EXPECT_EQ(detail::meminfo_bytes(mi, "MemTotal"), 24683652ull * 1024);
  EXPECT_EQ(detail::meminfo_bytes(mi, "MemAvailable"), 24407456ull * 1024);
  EXPECT_EQ(detail::meminfo_bytes(mi, "MemFre"), 0u) << "prefix of a key is not the key";
  EXPECT_EQ(detail::meminfo_bytes(mi, "SwapTotal"), 0u);
}

}  // namespace
