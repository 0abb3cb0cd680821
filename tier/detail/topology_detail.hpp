#pragma once
/**
 * @file topology_detail.hpp
 * @brief Pure decision rules of the machine model, split out of discovery so tests can feed
 * them synthetic machines (a GH200, a two-socket x86) that the CI host is not.
 */
#include <cstdint>
#include <string>
#include <vector>

#include "tier/topology.hpp"

namespace ght::tier::detail {

/// c2c iff the GPU walks the host page tables and has native host atomics (DESIGN.md, "Link").
[[nodiscard]] LinkKind link_kind_from_attributes(bool has_gpu, bool pageable_uses_host_page_tables,
                                                 bool host_native_atomics) noexcept;

/// Nodes that may hold the host tier: memory present and not a GPU's HBM.
[[nodiscard]] bool is_host_candidate(const NumaNode& n) noexcept;

/// Mark CPU-less nodes with memory that belong to a GPU (their os_index is listed in
/// `gpu_memory_nodes`, from cudaDevAttrNumaId or hwloc's "GPUMemory" subtype).
void flag_gpu_memory_nodes(std::vector<NumaNode>& nodes, const std::vector<int>& gpu_memory_nodes);

/// The host-tier node: `requested` (GHT_HOST_NUMA) when >= 0, validated; else `nearest` (the node
/// nearest the GPU) when it is a candidate; else node 0; else the first candidate.
/// @throws ght::config_error naming GHT_HOST_NUMA and the valid nodes when `requested` is not a
///         candidate.
[[nodiscard]] int select_host_node(const std::vector<NumaNode>& nodes, int requested, int nearest);

/// Among `node_ids` (e.g. the nodeset of the GPU's non-I/O ancestor), the first host candidate,
/// preferring nodes with CPUs; -1 when none.
[[nodiscard]] int nearest_host_node(const std::vector<NumaNode>& nodes,
                                    const std::vector<int>& node_ids);

/// The machine an hwloc XML export describes (lstopo --of xml; tests/data/gh200-topology.xml),
/// with `gpus` as CUDA would report them: the same rules as topology(), on hwloc's NUMA sizes
/// (libnuma and /proc/meminfo describe the machine running, not the file; free bytes are 0).
/// @throws ght::io_error naming the file when hwloc cannot read it
[[nodiscard]] Topology topology_from_hwloc_xml(const std::string& xml_path,
                                               std::vector<GpuInfo> gpus);

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from the 16 raw bytes of cudaUUID_t.
[[nodiscard]] std::string format_gpu_uuid(const unsigned char (&bytes)[16]);

/// "0-3,8,10-11" from a sorted list of CPU indices.
[[nodiscard]] std::string format_cpu_list(const std::vector<int>& cpus);

/// A small text file's contents (/proc, /sys); "" when it cannot be read.
[[nodiscard]] std::string read_text_file(const std::string& path);

/// Value of a "Key:   123 kB" line of a /proc/meminfo-style text, in bytes; 0 when absent.
[[nodiscard]] std::uint64_t meminfo_bytes(const std::string& text, const std::string& key);

}  // namespace ght::tier::detail
