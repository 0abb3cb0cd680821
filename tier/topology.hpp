#pragma once
/**
 * @file topology.hpp
 * @brief What the machine is: NUMA nodes, cores, caches, the GPU, its HBM and the link kind.
 *
 * Uses hwloc for NUMA nodes, cores and caches and for the NUMA node nearest the GPU (through the
 * GPU's PCI bus id), libnuma for per-node capacity and binding, and CUDA device attributes for the
 * link kind: c2c when pageableMemoryAccessUsesHostPageTables and hostNativeAtomicSupported are
 * both 1, pcie for any other GPU, none without one.
 */
#include <cstdint>
#include <string>
#include <vector>

#include "tier/types.hpp"

namespace ght::tier {

struct NumaNode {
  int os_index = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t free_bytes = 0;  ///< MemAvailable-style estimate for this node
  std::vector<int> cpus;         ///< OS indices of the cores (first PU of each core)
  bool is_gpu_memory = false;    ///< GH200: HBM exposed as a CPU-less NUMA node
};

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  std::string uuid;
  std::string pci_bus_id;  ///< e.g. "0000:19:00.0"
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::uint64_t hbm_total_bytes = 0;
  std::uint64_t hbm_free_bytes = 0;
  std::uint64_t l2_bytes = 0;
  /// HBM's peak bandwidth from the memory clock and bus width the driver reports (2 transfers
  /// per clock), bytes/s; 0 where the driver does not say.
  double hbm_peak_bps = 0;
  int driver_version = 0;
  // The attributes that decide the link kind, as read.
  bool pageable_memory_access = false;
  bool pageable_uses_host_page_tables = false;
  bool host_native_atomics = false;
  bool concurrent_managed_access = false;
  bool can_use_host_pointer_for_registered_mem = false;
  /// NUMA node of this GPU's HBM when the driver exposes it as one (GH200), else -1.
  int memory_numa_node = -1;
  /// Host NUMA node the driver reports as closest (cudaDevAttrHostNumaId), else -1.
  int driver_host_numa_node = -1;
};

struct Topology {
  std::string hostname;
  std::string cpu_arch;       ///< "x86_64", "aarch64"
  std::string cpu_model;
  int cores = 0;              ///< physical cores
  int pus = 0;                ///< hardware threads
  std::uint64_t l3_bytes = 0; ///< largest last-level cache
  std::vector<NumaNode> numa_nodes;
  std::uint64_t host_total_bytes = 0;
  std::uint64_t host_available_bytes = 0;
  std::vector<GpuInfo> gpus;  ///< empty without CUDA or without a device
  int gpu_index = -1;         ///< index into gpus of the selected device (GHT_DEVICE), -1 if none
  int host_numa_node = 0;     ///< node for host-tier memory: GHT_HOST_NUMA, else nearest the GPU
  LinkKind link = LinkKind::none;

  [[nodiscard]] const GpuInfo* gpu() const { return gpu_index >= 0 ? &gpus[gpu_index] : nullptr; }
  /// Capacity of a tier in bytes: HBM total, or memory of the host NUMA node.
  [[nodiscard]] std::uint64_t capacity(TierKind t) const;
  /// Free bytes of a tier now: HBM free, or available memory of the host NUMA node.
  [[nodiscard]] std::uint64_t available(TierKind t) const;
  [[nodiscard]] std::string format_text() const;
  [[nodiscard]] std::string format_json() const;
};

/// Discover the machine (cached after the first call; `refresh` re-reads free memory).
const Topology& topology(bool refresh = false);

/// Bind the calling thread's memory policy and CPU affinity to a NUMA node (libnuma).
void bind_thread_to_node(int node);

}  // namespace ght::tier
