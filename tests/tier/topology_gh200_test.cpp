// The machine model on a GH200 that CI is not: tests/data/gh200-topology.xml, an hwloc 2.x export
// of one superchip written out by hand (72 Neoverse V2 cores with ~480 GB LPDDR5X as NUMA node 0;
// the H100's 96 GB HBM3 as CPU-less node 1, tagged "GPUMemory" as hwloc 2.11+ tags it, with the
// GPU's local CPUs as its locality; the GPU at PCI 0009:01:00.0), read through hwloc's XML import.
// The CUDA attributes are those a GH200 reports.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "alloc/tiered.hpp"
#include "tier/config.hpp"
#include "tier/detail/topology_detail.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace {

using ght::LinkKind;
using ght::TierKind;
using ght::tier::GpuInfo;
using ght::tier::Topology;
namespace detail = ght::tier::detail;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string fixture() { return std::string(GHT_SOURCE_DIR) + "/tests/data/gh200-topology.xml"; }

/// The GH200's GPU as cudaGetDeviceProperties and cudaDeviceGetAttribute describe it.
GpuInfo gh200_gpu() {
  GpuInfo g;
  g.name = "NVIDIA GH200 480GB";
  g.pci_bus_id = "0009:01:00.0";
  g.sm_count = 132;
  g.cc_major = 9;
  g.hbm_total_bytes = 102005473280;
  g.pageable_memory_access = true;
  g.pageable_uses_host_page_tables = true;
  g.host_native_atomics = true;
  g.concurrent_managed_access = true;
  g.can_use_host_pointer_for_registered_mem = true;
  g.memory_numa_node = 1;
  g.driver_host_numa_node = 0;
  return g;
}

/// The same GPU behind a PCIe link: no host page tables, no native host atomics.
GpuInfo pcie_gpu() {
  GpuInfo g = gh200_gpu();
  g.pageable_memory_access = false;
  g.pageable_uses_host_page_tables = false;
  g.host_native_atomics = false;
  g.memory_numa_node = -1;
  return g;
}

class Gh200Topology : public ::testing::Test {
 protected:
  void TearDown() override { ght::config::cfg().set_flag("GHT_HOST_NUMA", "-1"); }
};

TEST_F(Gh200Topology, OnePackageOf72CoresAndItsMemory) {
  const Topology t = detail::topology_from_hwloc_xml(fixture(), {gh200_gpu()});
  EXPECT_EQ(t.hostname, "gh200-fixture");
  EXPECT_EQ(t.cpu_arch, "aarch64");
  EXPECT_NE(t.cpu_model.find("Neoverse V2"), std::string::npos) << t.cpu_model;
  EXPECT_EQ(t.cores, 72);
  EXPECT_EQ(t.pus, 72);
  EXPECT_EQ(t.l3_bytes, 114 * (std::uint64_t{1} << 20));

  ASSERT_EQ(t.numa_nodes.size(), 2u) << t.format_text();
  const auto& cpu = t.numa_nodes[0];
  EXPECT_EQ(cpu.os_index, 0);
  ASSERT_EQ(cpu.cpus.size(), 72u);
  for (int i = 0; i < 72; ++i) EXPECT_EQ(cpu.cpus[static_cast<std::size_t>(i)], i);
  EXPECT_FALSE(cpu.is_gpu_memory);
  EXPECT_GT(cpu.total_bytes, 470 * kGiB);
  EXPECT_LT(cpu.total_bytes, 481 * kGiB);
  EXPECT_EQ(detail::format_cpu_list(cpu.cpus), "0-71");
}

TEST_F(Gh200Topology, HbmIsACpuLessGpuMemoryNode) {
  const Topology t = detail::topology_from_hwloc_xml(fixture(), {gh200_gpu()});
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  const auto& hbm = t.numa_nodes[1];
  EXPECT_EQ(hbm.os_index, 1);
  // hwloc gives the node the GPU's local CPUs as its cpuset; none of them are the node's own.
  EXPECT_TRUE(hbm.cpus.empty()) << "cpus " << detail::format_cpu_list(hbm.cpus);
  EXPECT_TRUE(hbm.is_gpu_memory);
  EXPECT_GT(hbm.total_bytes, 90 * kGiB);
  EXPECT_LT(hbm.total_bytes, 97 * kGiB);
  EXPECT_FALSE(detail::is_host_candidate(hbm));
  EXPECT_NE(t.format_text().find("GPU memory (HBM)"), std::string::npos) << t.format_text();
}

TEST_F(Gh200Topology, HbmNodeIsKnownFromHwlocWithoutTheDriversNumaId) {
  // An older driver (no cudaDevAttrNumaId), or no GPU at all: hwloc's tag alone marks the HBM.
  GpuInfo old_driver = gh200_gpu();
  old_driver.memory_numa_node = -1;
  for (const auto& gpus : {std::vector<GpuInfo>{old_driver}, std::vector<GpuInfo>{}}) {
    const Topology t = detail::topology_from_hwloc_xml(fixture(), gpus);
    ASSERT_EQ(t.numa_nodes.size(), 2u);
    EXPECT_TRUE(t.numa_nodes[1].is_gpu_memory) << gpus.size() << " GPUs";
    EXPECT_EQ(t.host_numa_node, 0);
    EXPECT_EQ(t.host_total_bytes, t.numa_nodes[0].total_bytes);
  }
}

TEST_F(Gh200Topology, C2cAttributesGiveC2cAndSystemHostMemoryOnTheLpddrNode) {
  const Topology t = detail::topology_from_hwloc_xml(fixture(), {gh200_gpu()});
  ASSERT_NE(t.gpu(), nullptr);
  EXPECT_EQ(t.link, LinkKind::c2c);
  // The GPU's PCI ancestor holds both nodes; the host tier is the one with CPUs.
  EXPECT_EQ(t.host_numa_node, 0);
  // The HBM node is not host memory: host capacity is the LPDDR5X alone.
  EXPECT_EQ(t.host_total_bytes, t.numa_nodes[0].total_bytes);
  EXPECT_EQ(t.capacity(TierKind::host), t.numa_nodes[0].total_bytes);
  EXPECT_EQ(t.capacity(TierKind::hbm), gh200_gpu().hbm_total_bytes);
  // GHT_HOST_MEMORY=auto on c2c: pageable system memory, nothing pinned.
  EXPECT_EQ(ght::alloc::host_resource_kind("auto", t.link), "system");
  EXPECT_EQ(ght::alloc::host_resource_kind("pinned", t.link), "pinned");
}

TEST_F(Gh200Topology, PcieAttributesOnTheSameMachineGivePcieAndPinned) {
  const Topology t = detail::topology_from_hwloc_xml(fixture(), {pcie_gpu()});
  EXPECT_EQ(t.link, LinkKind::pcie);
  EXPECT_EQ(ght::alloc::host_resource_kind("auto", t.link), "pinned");
  const Topology none = detail::topology_from_hwloc_xml(fixture(), {});
  EXPECT_EQ(none.link, LinkKind::none);
  EXPECT_EQ(ght::alloc::host_resource_kind("auto", none.link), "system");
}

TEST_F(Gh200Topology, HostNumaOnTheHbmNodeIsRefused) {
  ght::config::cfg().set_flag("GHT_HOST_NUMA", "1");
  try {
    (void)detail::topology_from_hwloc_xml(fixture(), {gh200_gpu()});
    FAIL() << "GHT_HOST_NUMA=1 (the HBM node) was accepted";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("HBM"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid host NUMA nodes: 0"), std::string::npos)
        << e.what();
  }
}

TEST_F(Gh200Topology, AFileHwlocCannotReadIsNamed) {
  const std::string missing = fixture() + ".missing";
  try {
    (void)detail::topology_from_hwloc_xml(missing, {});
    FAIL() << "no error for " << missing;
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST_F(Gh200Topology, HwlocXmlFileMakesTopologyTheExportedMachine) {
  ASSERT_EQ(setenv("HWLOC_XMLFILE", fixture().c_str(), 1), 0);
  Topology t;
  try {
    t = ght::tier::topology(/*refresh=*/true);
  } catch (...) {
    unsetenv("HWLOC_XMLFILE");
    (void)ght::tier::topology(/*refresh=*/true);
    throw;
  }
  unsetenv("HWLOC_XMLFILE");
  (void)ght::tier::topology(/*refresh=*/true);
  // This machine's libnuma and /proc/meminfo are not mixed in: the sizes are the file's.
  EXPECT_EQ(t.hostname, "gh200-fixture");
  EXPECT_EQ(t.cores, 72);
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.numa_nodes[0].total_bytes, 514962030592u);
  EXPECT_TRUE(t.numa_nodes[1].is_gpu_memory);
  EXPECT_EQ(t.host_numa_node, 0);
  EXPECT_NE(ght::tier::topology().hostname, "gh200-fixture") << "the cache kept the file's";
}

}  // namespace
