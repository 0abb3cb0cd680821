// GPU tests of the machine model: the link kind against the device attributes, and the probe's
// H2D figure against a plain cudaMemcpy timed here, on equal sizes.
#include <cstdio>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "tier/config.hpp"
#include "tier/cuda_check.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/detail/topology_detail.hpp"
#include "tier/link.hpp"
#include "tier/topology.hpp"

namespace {

namespace fs = std::filesystem;
using ght::LinkKind;

int attr(cudaDeviceAttr a, int dev) {
  int v = -1;
  GHT_CUDA_TRY(cudaDeviceGetAttribute(&v, a, dev));
  return v;
}

class ProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ght-probe-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    ght::config::cfg().set_flag("GHT_CACHE_DIR", dir_.string());
  }
  void TearDown() override {
    ght::config::cfg().set_flag("GHT_CACHE_DIR", "");
    ght::config::cfg().set_flag("GHT_LINK_PROFILE", "measured");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST(TopologyGpu, LinkKindAndIdentityMatchTheDevice) {
  GHT_REQUIRE_GPU();
  const auto& t = ght::tier::topology();
  const auto* g = t.gpu();
  ASSERT_NE(g, nullptr);
  const int dev = g->ordinal;

  const bool host_pt = attr(cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev) == 1;
  const bool atomics = attr(cudaDevAttrHostNativeAtomicSupported, dev) == 1;
  EXPECT_EQ(g->pageable_uses_host_page_tables, host_pt);
  EXPECT_EQ(g->host_native_atomics, atomics);
  EXPECT_EQ(g->pageable_memory_access, attr(cudaDevAttrPageableMemoryAccess, dev) == 1);
  EXPECT_EQ(g->concurrent_managed_access, attr(cudaDevAttrConcurrentManagedAccess, dev) == 1);
  EXPECT_EQ(t.link, host_pt && atomics ? LinkKind::c2c : LinkKind::pcie);

  cudaDeviceProp p{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
  const std::string name = p.name;
  EXPECT_EQ(g->name, name);
  // An H200 SXM, or any discrete (non-Grace-Hopper) device, reaches the host over PCIe.
  if (name == "NVIDIA H200" || name.find("GH200") == std::string::npos) {
    EXPECT_EQ(t.link, LinkKind::pcie) << name;
  }
  unsigned char raw[16];
  std::memcpy(raw, p.uuid.bytes, sizeof raw);
  EXPECT_EQ(g->uuid, ght::tier::detail::format_gpu_uuid(raw));
  EXPECT_EQ(g->uuid.rfind("GPU-", 0), 0u);
  char bus[32] = {};
  GHT_CUDA_TRY(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  EXPECT_EQ(g->pci_bus_id, bus);
  EXPECT_EQ(g->sm_count, p.multiProcessorCount);
  EXPECT_EQ(g->hbm_total_bytes, p.totalGlobalMem);
  EXPECT_EQ(g->l2_bytes, static_cast<std::uint64_t>(p.l2CacheSize));
  EXPECT_GT(g->hbm_free_bytes, 0u);
  EXPECT_LE(g->hbm_free_bytes, g->hbm_total_bytes);
  int driver = 0;
  GHT_CUDA_TRY(cudaDriverGetVersion(&driver));
  EXPECT_EQ(g->driver_version, driver);

  // The HBM of a GH200 shows up as a NUMA node; it must never be the host tier.
  for (const auto& n : t.numa_nodes) {
    if (n.is_gpu_memory) EXPECT_NE(n.os_index, t.host_numa_node);
  }
}

TEST_F(ProbeTest, H2dIsReportedNextToAPlainMemcpyOfTheSameSize) {
  GHT_REQUIRE_GPU();
  const auto& t = ght::tier::topology();
  const ght::tier::detail::ProbeReport r = ght::tier::detail::run_probe(3.0);
  EXPECT_EQ(r.numbers.source, "probe");
  EXPECT_EQ(r.numbers.kind, t.link);
  for (double v : {r.numbers.h2d_bps, r.numbers.d2h_bps, r.numbers.bidir_bps,
                   r.numbers.kernel_read_bps, r.numbers.kernel_write_bps,
                   r.numbers.host_triad_bps, r.numbers.hbm_bps}) {
    EXPECT_GT(v, 0.0);
  }
  ASSERT_GT(r.copy_bytes, 0u);

  // The reference: cudaMemcpy of a pinned buffer of the probe's size, median of 9 after a warm-up.
  GHT_CUDA_TRY(cudaSetDevice(t.gpu()->ordinal));
  void* host = nullptr;
  void* dev = nullptr;
  GHT_CUDA_TRY(cudaMallocHost(&host, r.copy_bytes));
  GHT_CUDA_TRY(cudaMalloc(&dev, r.copy_bytes));
  std::memset(host, 0x11, r.copy_bytes);
  cudaEvent_t start, stop;
  GHT_CUDA_TRY(cudaEventCreate(&start));
  GHT_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> bps;
  for (int rep = -1; rep < 9; ++rep) {
    GHT_CUDA_TRY(cudaEventRecord(start, 0));
    GHT_CUDA_TRY(cudaMemcpy(dev, host, r.copy_bytes, cudaMemcpyHostToDevice));
    GHT_CUDA_TRY(cudaEventRecord(stop, 0));
    GHT_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    GHT_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    if (rep >= 0) bps.push_back(static_cast<double>(r.copy_bytes) / (ms * 1e-3));
  }
  GHT_CUDA_TRY(cudaEventDestroy(start));
  GHT_CUDA_TRY(cudaEventDestroy(stop));
  GHT_CUDA_TRY(cudaFree(dev));
  GHT_CUDA_TRY(cudaFreeHost(host));
  std::sort(bps.begin(), bps.end());
  const double reference = bps[bps.size() / 2];

  // Reported, not asserted: two bandwidth timings agree only on an idle machine (ctest runs GPU
  // tests in parallel, and a 0.82 ratio was seen that way), and tests hold no timing thresholds.
  // bench/run_gpu.sh's probe stage records the probe against HARDWARE.md on an idle GPU.
  const double ratio = r.numbers.h2d_bps / reference;
  EXPECT_GT(reference, 0.0);
  RecordProperty("probe_h2d_over_cudaMemcpy", std::to_string(ratio));
  std::printf("probe H2D %.1f GB/s vs cudaMemcpy %.1f GB/s over %zu bytes: ratio %.3f\n",
              r.numbers.h2d_bps / 1e9, reference / 1e9, static_cast<std::size_t>(r.copy_bytes), ratio);
}

TEST_F(ProbeTest, ProbeAndCacheFeedsMeasuredResolution) {
  GHT_REQUIRE_GPU();
  ght::config::cfg().set_flag("GHT_PROBE_SECONDS", "2");
  const ght::tier::LinkNumbers probed = ght::tier::probe_and_cache();
  ght::config::cfg().set_flag("GHT_PROBE_SECONDS", "8");
  const std::string path = ght::tier::probe_cache_path();
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(path.rfind(dir_.string(), 0), 0u) << path;

  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  EXPECT_EQ(j["meta"]["gpu_uuid"], ght::tier::topology().gpu()->uuid);

  ght::config::cfg().set_flag("GHT_LINK_PROFILE", "measured");
  const ght::tier::LinkNumbers resolved = ght::tier::resolve_link_numbers();
  EXPECT_EQ(resolved.source, "cache:" + path);
  EXPECT_EQ(resolved.name, "measured");
  EXPECT_EQ(resolved.kind, probed.kind);
  EXPECT_EQ(resolved.h2d_bps, probed.h2d_bps);
  EXPECT_EQ(resolved.d2h_bps, probed.d2h_bps);
  EXPECT_EQ(resolved.bidir_bps, probed.bidir_bps);
  EXPECT_EQ(resolved.kernel_read_bps, probed.kernel_read_bps);
  EXPECT_EQ(resolved.kernel_write_bps, probed.kernel_write_bps);
  EXPECT_EQ(resolved.host_triad_bps, probed.host_triad_bps);
  EXPECT_EQ(resolved.hbm_bps, probed.hbm_bps);
}

}  // namespace
