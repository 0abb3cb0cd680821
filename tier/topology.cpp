#include "tier/topology.hpp"

#include <hwloc.h>
#include <numa.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tier/config.hpp"
#include "tier/detail/topology_detail.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::tier {

// ---- pure rules (tier/detail/topology_detail.hpp) -----------------------------------------------
namespace detail {

LinkKind link_kind_from_attributes(bool has_gpu, bool pageable_uses_host_page_tables,
                                   bool host_native_atomics) noexcept {
  if (!has_gpu) return LinkKind::none;
  return pageable_uses_host_page_tables && host_native_atomics ? LinkKind::c2c : LinkKind::pcie;
}

bool is_host_candidate(const NumaNode& n) noexcept { return n.total_bytes > 0 && !n.is_gpu_memory; }

void flag_gpu_memory_nodes(std::vector<NumaNode>& nodes, const std::vector<int>& gpu_memory_nodes) {
  for (auto& n : nodes) {
    const bool listed = std::find(gpu_memory_nodes.begin(), gpu_memory_nodes.end(), n.os_index) !=
                        gpu_memory_nodes.end();
    // A node with CPUs is never HBM, whatever a driver attribute says: the host tier must stay on
    // the CPU's own memory (LPDDR5X on Grace).
    if (listed && n.cpus.empty() && n.total_bytes > 0) n.is_gpu_memory = true;
  }
}

int select_host_node(const std::vector<NumaNode>& nodes, int requested, int nearest) {
  auto find = [&](int os) -> const NumaNode* {
    for (const auto& n : nodes) {
      if (n.os_index == os) return &n;
    }
    return nullptr;
  };
  if (requested >= 0) {
    const NumaNode* n = find(requested);
    if (n != nullptr && is_host_candidate(*n)) return requested;
    std::string valid;
    for (const auto& c : nodes) {
      if (!is_host_candidate(c)) continue;
      valid += (valid.empty() ? "" : ", ") + std::to_string(c.os_index);
    }
    std::string why = n == nullptr           ? "no such NUMA node"
                      : n->is_gpu_memory     ? "that node is the GPU's HBM, not host memory"
                                             : "that node has no memory";
    throw ght::config_error("GHT_HOST_NUMA=" + std::to_string(requested) + ": " + why +
                            "; valid host NUMA nodes: " + (valid.empty() ? "none" : valid) +
                            " (or -1 for the node nearest the GPU)");
  }
  if (nearest >= 0) {
    const NumaNode* n = find(nearest);
    if (n != nullptr && is_host_candidate(*n)) return nearest;
  }
  if (const NumaNode* n0 = find(0); n0 != nullptr && is_host_candidate(*n0)) return 0;
  for (const auto& n : nodes) {
    if (is_host_candidate(n)) return n.os_index;
  }
  return 0;
}

int nearest_host_node(const std::vector<NumaNode>& nodes, const std::vector<int>& node_ids) {
  int without_cpus = -1;
  for (int id : node_ids) {
    for (const auto& n : nodes) {
      if (n.os_index != id || !is_host_candidate(n)) continue;
      if (!n.cpus.empty()) return id;
      if (without_cpus < 0) without_cpus = id;
    }
  }
  return without_cpus;
}

std::string format_gpu_uuid(const unsigned char (&b)[16]) {
  char buf[64];
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return buf;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint64_t meminfo_bytes(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.compare(0, colon, key) != 0) continue;
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str() + colon + 1, "%llu", &kb) != 1) return 0;
    return static_cast<std::uint64_t>(kb) * 1024;
  }
  return 0;
}

}  // namespace detail

// ---- discovery ----------------------------------------------------------------------------------
namespace {

/// Owns an hwloc topology with I/O discovery, so the GPU's PCI device can be located: this
/// machine's, or the one an hwloc XML export describes (`xml_path`; hwloc also honours
/// HWLOC_XMLFILE).
class Hwloc {
 public:
  explicit Hwloc(const std::string& xml_path = "") {
    if (hwloc_topology_init(&t_) != 0) throw ght::io_error("hwloc: hwloc_topology_init failed");
    // PCI devices are filtered out by default; the GPU's place in the tree is what tells us the
    // NUMA node nearest to it.
    hwloc_topology_set_io_types_filter(t_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (!xml_path.empty() && hwloc_topology_set_xml(t_, xml_path.c_str()) != 0) {
      const int err = errno;
      hwloc_topology_destroy(t_);
      throw ght::io_error("hwloc: cannot use " + xml_path + " as a topology: " +
                          std::strerror(err) + " (an XML file that lstopo --of xml writes)");
    }
    if (hwloc_topology_load(t_) != 0) {
      const int err = errno;
      hwloc_topology_destroy(t_);
      throw ght::io_error("hwloc: hwloc_topology_load" +
                          (xml_path.empty() ? std::string() : " of " + xml_path) +
                          " failed: " + std::strerror(err));
    }
  }
  ~Hwloc() { hwloc_topology_destroy(t_); }
  Hwloc(const Hwloc&) = delete;
  Hwloc& operator=(const Hwloc&) = delete;
  [[nodiscard]] hwloc_topology_t get() const { return t_; }

 private:
  hwloc_topology_t t_ = nullptr;
};

std::vector<int> bitmap_ids(hwloc_const_bitmap_t set) {
  std::vector<int> ids;
  if (set == nullptr) return ids;
  for (int i = hwloc_bitmap_first(set); i != -1; i = hwloc_bitmap_next(set, i)) ids.push_back(i);
  return ids;
}

std::string cpu_model(hwloc_topology_t t) {
  hwloc_obj_t pkg = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PACKAGE, nullptr);
  for (hwloc_obj_t o : {pkg, hwloc_get_root_obj(t)}) {
    if (o == nullptr) continue;
    if (const char* m = hwloc_obj_get_info_by_name(o, "CPUModel"); m != nullptr && *m != '\0') {
      return m;
    }
  }
  // aarch64 /proc/cpuinfo has no model name; hwloc exposes the implementer and part numbers
  // (Grace: implementer 0x41, part 0xd4f = Neoverse V2).
  for (hwloc_obj_t o : {pkg, hwloc_get_root_obj(t)}) {
    if (o == nullptr) continue;
    const char* impl = hwloc_obj_get_info_by_name(o, "CPUImplementer");
    const char* part = hwloc_obj_get_info_by_name(o, "CPUPartNumber");
    if (impl != nullptr && part != nullptr) {
      return std::string("implementer ") + impl + " part " + part +
             (std::strcmp(part, "0xd4f") == 0 ? " (Neoverse V2)" : "");
    }
  }
  return "unknown";
}

void read_cpu(hwloc_topology_t t, Topology& topo) {
  topo.pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  topo.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  if (topo.cores <= 0) topo.cores = topo.pus;
  for (hwloc_obj_type_t type : {HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE}) {
    for (hwloc_obj_t c = hwloc_get_next_obj_by_type(t, type, nullptr); c != nullptr;
         c = hwloc_get_next_obj_by_type(t, type, c)) {
      topo.l3_bytes = std::max<std::uint64_t>(topo.l3_bytes, c->attr->cache.size);
    }
    if (topo.l3_bytes > 0) break;  // the last level present
  }
  topo.cpu_model = cpu_model(t);
}

/// NUMA nodes from hwloc (CPU-less memory nodes included), each with the first PU of every core.
std::vector<NumaNode> read_numa_nodes(hwloc_topology_t t, std::vector<int>& hwloc_gpu_memory) {
  std::vector<NumaNode> nodes;
  const bool have_cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0;
  const hwloc_obj_type_t unit = have_cores ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    node.total_bytes = n->attr->numanode.local_memory;
    // hwloc tags HBM that the OS onlined as a NUMA node (GH200, POWER9+V100) with this subtype,
    // and gives it the GPU's local CPUs as its cpuset: where it sits, not CPUs of its own.
    const bool gpu_memory = n->subtype != nullptr && std::strcmp(n->subtype, "GPUMemory") == 0;
    if (gpu_memory) hwloc_gpu_memory.push_back(node.os_index);
    for (hwloc_obj_t c = gpu_memory ? nullptr : hwloc_get_next_obj_by_type(t, unit, nullptr);
         c != nullptr; c = hwloc_get_next_obj_by_type(t, unit, c)) {
      if (hwloc_bitmap_intersects(c->cpuset, n->cpuset)) {
        node.cpus.push_back(hwloc_bitmap_first(c->cpuset));
      }
    }
    std::sort(node.cpus.begin(), node.cpus.end());
    nodes.push_back(std::move(node));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  if (nodes.empty()) nodes.push_back(NumaNode{});  // hwloc always reports one; be safe anyway
  return nodes;
}

/// Per-node capacity and free memory from libnuma (MemTotal / MemFree of each node).
void read_numa_memory(std::vector<NumaNode>& nodes) {
  if (numa_available() < 0) return;  // kernel without NUMA support: keep hwloc's totals
  for (auto& n : nodes) {
    long long free_b = 0;
    const long long total = numa_node_size64(n.os_index, &free_b);
    if (total > 0) {
      n.total_bytes = static_cast<std::uint64_t>(total);
      n.free_bytes = static_cast<std::uint64_t>(std::max(0LL, free_b));
    }
  }
}

#ifdef GHT_HAVE_CUDA
int cuda_attr(cudaDeviceAttr attr, int dev, int fallback) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    (void)cudaGetLastError();  // older drivers reject newer attributes; not fatal
    return fallback;
  }
  return v;
}

/// Every visible device; a missing driver or no device is "no GPU", never an error.
std::vector<GpuInfo> discover_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) (void)cudaGetLastError();
  std::vector<GpuInfo> gpus;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    GHT_CUDA_TRY(cudaGetDeviceProperties(&p, d));
    GpuInfo g;
    g.ordinal = d;
    g.name = p.name;
    unsigned char raw[16];
    std::memcpy(raw, p.uuid.bytes, sizeof raw);
    g.uuid = detail::format_gpu_uuid(raw);
    char bus[32] = {};
    GHT_CUDA_TRY(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), d));
    g.pci_bus_id = bus;
    g.sm_count = p.multiProcessorCount;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.hbm_total_bytes = p.totalGlobalMem;
    g.l2_bytes = static_cast<std::uint64_t>(std::max(0, p.l2CacheSize));
    const int mem_khz = cuda_attr(cudaDevAttrMemoryClockRate, d, 0);
    const int bus_bits = cuda_attr(cudaDevAttrGlobalMemoryBusWidth, d, 0);
    g.hbm_peak_bps = 2.0 * 1e3 * mem_khz * (bus_bits / 8.0);
    g.driver_version = driver;
    g.pageable_memory_access = cuda_attr(cudaDevAttrPageableMemoryAccess, d, 0) == 1;
    g.pageable_uses_host_page_tables =
        cuda_attr(cudaDevAttrPageableMemoryAccessUsesHostPageTables, d, 0) == 1;
    g.host_native_atomics = cuda_attr(cudaDevAttrHostNativeAtomicSupported, d, 0) == 1;
    g.concurrent_managed_access = cuda_attr(cudaDevAttrConcurrentManagedAccess, d, 0) == 1;
    g.can_use_host_pointer_for_registered_mem =
        cuda_attr(cudaDevAttrCanUseHostPointerForRegisteredMem, d, 0) == 1;
    if (cuda_attr(cudaDevAttrNumaConfig, d, cudaDeviceNumaConfigNone) ==
        cudaDeviceNumaConfigNumaNode) {
      g.memory_numa_node = cuda_attr(cudaDevAttrNumaId, d, -1);
    }
    g.driver_host_numa_node = cuda_attr(cudaDevAttrHostNumaId, d, -1);
    gpus.push_back(std::move(g));
  }
  return gpus;
}

/// Free HBM of one device. This creates its primary context, so only the selected device is
/// asked: a context on every GPU of an 8-GPU node would cost each of them memory.
void read_free_hbm(GpuInfo& g) {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) (void)cudaGetLastError();
  GHT_CUDA_TRY(cudaSetDevice(g.ordinal));
  std::size_t free_b = 0, total_b = 0;
  GHT_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  g.hbm_free_bytes = free_b;
  if (prev != g.ordinal && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
}
#endif

int nearest_node_of_gpu(hwloc_topology_t t, const std::vector<NumaNode>& nodes, const GpuInfo& g) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(g.pci_bus_id.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
    if (hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t, dom, bus, dev, fn); pci != nullptr) {
      if (hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, pci); anc != nullptr) {
        const int n = detail::nearest_host_node(nodes, bitmap_ids(anc->nodeset));
        if (n >= 0) return n;
      }
    }
  }
  // hwloc without PCI discovery (some containers hide /sys/bus/pci): trust the driver's answer.
  if (g.driver_host_numa_node >= 0) {
    return detail::nearest_host_node(nodes, {g.driver_host_numa_node});
  }
  return -1;
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

/// GHT_DEVICE among topo.gpus; none without GPUs.
void select_gpu(Topology& topo) {
  if (topo.gpus.empty()) return;
  const auto dev = config::cfg().get_int(config::Key::GHT_DEVICE);
  if (dev >= static_cast<std::int64_t>(topo.gpus.size())) {
    throw ght::config_error("GHT_DEVICE=" + std::to_string(dev) + ": no such CUDA device; " +
                            std::to_string(topo.gpus.size()) + " visible, valid ordinals 0.." +
                            std::to_string(topo.gpus.size() - 1));
  }
  topo.gpu_index = static_cast<int>(dev);
}

/// What follows from the nodes and GPUs found: which nodes are HBM, the host totals (from
/// `meminfo`, /proc/meminfo's text; "" for a machine that is not this one), the host node and the
/// link kind.
void resolve(hwloc_topology_t t, Topology& topo, std::vector<int> gpu_memory_nodes,
             const std::string& meminfo) {
  for (const auto& g : topo.gpus) {
    if (g.memory_numa_node >= 0) gpu_memory_nodes.push_back(g.memory_numa_node);
  }
  detail::flag_gpu_memory_nodes(topo.numa_nodes, gpu_memory_nodes);

  // System-wide totals. /proc/meminfo counts the GH200's HBM node as system memory, so the
  // GPU-memory nodes are subtracted to get the host's own memory.
  const std::uint64_t mem_total = detail::meminfo_bytes(meminfo, "MemTotal");
  const std::uint64_t mem_available = detail::meminfo_bytes(meminfo, "MemAvailable");
  std::uint64_t gpu_total = 0, gpu_free = 0, host_nodes_total = 0;
  std::vector<NumaNode*> host_nodes;
  for (auto& n : topo.numa_nodes) {
    if (n.is_gpu_memory) {
      gpu_total += n.total_bytes;
      gpu_free += n.free_bytes;
    } else if (n.total_bytes > 0) {
      host_nodes.push_back(&n);
      host_nodes_total += n.total_bytes;
    }
  }
  const std::uint64_t sys_total = mem_total > gpu_total ? mem_total - gpu_total : 0;
  const std::uint64_t sys_available = mem_available > gpu_free ? mem_available - gpu_free : 0;
  if (host_nodes.size() == 1) {
    // One host node: MemAvailable is the better "free" (it counts reclaimable page cache, which
    // the node's MemFree does not), and in VMs with hot-plugged memory the node's own MemTotal
    // can be smaller than the system's.
    NumaNode& n = *host_nodes.front();
    n.total_bytes = std::max(n.total_bytes, sys_total);
    n.free_bytes = std::min(n.total_bytes, std::max(n.free_bytes, sys_available));
    host_nodes_total = n.total_bytes;
  }
  topo.host_total_bytes = host_nodes_total > 0 ? host_nodes_total : sys_total;
  topo.host_available_bytes = std::min(topo.host_total_bytes, sys_available);
  if (topo.host_available_bytes == 0) {
    for (const NumaNode* n : host_nodes) topo.host_available_bytes += n->free_bytes;
  }

  const GpuInfo* gpu = topo.gpu();
  const int nearest = gpu != nullptr ? nearest_node_of_gpu(t, topo.numa_nodes, *gpu) : -1;
  const auto requested = config::cfg().get_int(config::Key::GHT_HOST_NUMA);
  topo.host_numa_node =
      detail::select_host_node(topo.numa_nodes, static_cast<int>(requested), nearest);
  topo.link = detail::link_kind_from_attributes(gpu != nullptr,
                                                gpu != nullptr && gpu->pageable_uses_host_page_tables,
                                                gpu != nullptr && gpu->host_native_atomics);
}

/// Host name and architecture of a machine that hwloc read from an XML export.
void read_exported_names(hwloc_topology_t t, Topology& topo) {
  const hwloc_obj_t root = hwloc_get_root_obj(t);
  const char* host = hwloc_obj_get_info_by_name(root, "HostName");
  const char* arch = hwloc_obj_get_info_by_name(root, "Architecture");
  topo.hostname = host != nullptr ? host : "unknown";
  topo.cpu_arch = arch != nullptr ? arch : "unknown";
}

Topology discover() {
  Topology topo;
  const Hwloc hw;  // HWLOC_XMLFILE may make it another machine's export
  // libnuma and /proc describe this machine; for an exported one, hwloc's own sizes stand.
  const bool this_system = hwloc_topology_is_thissystem(hw.get()) != 0;
  if (this_system) {
    topo.hostname = hostname();
    struct utsname u{};
    topo.cpu_arch = uname(&u) == 0 ? u.machine : "unknown";
  } else {
    read_exported_names(hw.get(), topo);
  }
  read_cpu(hw.get(), topo);
  std::vector<int> gpu_memory_nodes;
  topo.numa_nodes = read_numa_nodes(hw.get(), gpu_memory_nodes);
  if (this_system) read_numa_memory(topo.numa_nodes);

#ifdef GHT_HAVE_CUDA
  topo.gpus = discover_gpus();
#endif
  select_gpu(topo);
#ifdef GHT_HAVE_CUDA
  if (topo.gpu_index >= 0) read_free_hbm(topo.gpus[topo.gpu_index]);
#endif
  resolve(hw.get(), topo, std::move(gpu_memory_nodes),
          this_system ? detail::read_text_file("/proc/meminfo") : std::string());
  return topo;
}

const NumaNode* find_node(const Topology& t, int os) {
  for (const auto& n : t.numa_nodes) {
    if (n.os_index == os) return &n;
  }
  return nullptr;
}

std::string yes_no(bool b) { return b ? "1" : "0"; }

}  // namespace

Topology detail::topology_from_hwloc_xml(const std::string& xml_path,
                                         std::vector<GpuInfo> gpus) {
  const Hwloc hw(xml_path);
  Topology topo;
  read_exported_names(hw.get(), topo);
  read_cpu(hw.get(), topo);
  std::vector<int> gpu_memory_nodes;
  topo.numa_nodes = read_numa_nodes(hw.get(), gpu_memory_nodes);
  topo.gpus = std::move(gpus);
  select_gpu(topo);
  resolve(hw.get(), topo, std::move(gpu_memory_nodes), /*meminfo=*/"");
  return topo;
}

// ---- Topology -----------------------------------------------------------------------------------
std::uint64_t Topology::capacity(TierKind t) const {
  if (t == TierKind::hbm) return gpu() != nullptr ? gpu()->hbm_total_bytes : 0;
  const NumaNode* n = find_node(*this, host_numa_node);
  return n != nullptr ? n->total_bytes : host_total_bytes;
}

std::uint64_t Topology::available(TierKind t) const {
  if (t == TierKind::hbm) return gpu() != nullptr ? gpu()->hbm_free_bytes : 0;
  const NumaNode* n = find_node(*this, host_numa_node);
  return n != nullptr ? n->free_bytes : host_available_bytes;
}

std::string Topology::format_text() const {
  using config::format_bytes;
  std::ostringstream o;
  o << "host        " << hostname << " (" << cpu_arch << ", " << cpu_model << ")\n";
  o << "cpu         " << cores << " cores, " << pus << " hardware threads, last-level cache "
    << format_bytes(l3_bytes) << "\n";
  o << "memory      " << format_bytes(host_total_bytes) << " host total, "
    << format_bytes(host_available_bytes) << " available\n";
  bool first = true;
  for (const auto& n : numa_nodes) {
    if (n.total_bytes == 0 && n.cpus.empty()) continue;  // GH200's empty MIG placeholder nodes
    o << (first ? "numa        " : "            ") << "node " << n.os_index << ": "
      << format_bytes(n.total_bytes) << " total, " << format_bytes(n.free_bytes) << " free, ";
    o << (n.cpus.empty() ? std::string("no cpus") : "cpus " + detail::format_cpu_list(n.cpus));
    if (n.is_gpu_memory) o << ", GPU memory (HBM)";
    if (n.os_index == host_numa_node) o << "  <- host tier";
    o << "\n";
    first = false;
  }
  if (gpus.empty()) o << "gpu         none\n";
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const GpuInfo& g = gpus[i];
    const bool selected = static_cast<int>(i) == gpu_index;
    o << "gpu " << g.ordinal << (g.ordinal < 10 ? "       " : "      ") << g.name << " ("
      << g.uuid << ")" << (selected ? "  <- selected (GHT_DEVICE)" : "") << "\n";
    o << "            PCI " << g.pci_bus_id << ", sm_" << g.cc_major << g.cc_minor << ", "
      << g.sm_count << " SMs, L2 " << format_bytes(g.l2_bytes) << ", HBM "
      << format_bytes(g.hbm_total_bytes);
    if (selected) o << " (" << format_bytes(g.hbm_free_bytes) << " free)";
    if (g.hbm_peak_bps > 0) {
      char peak[32];
      std::snprintf(peak, sizeof peak, "%.2f", g.hbm_peak_bps / 1e12);
      o << ", HBM peak " << peak << " TB/s";
    }
    o << ", CUDA driver " << g.driver_version / 1000 << "." << (g.driver_version % 1000) / 10;
    if (g.memory_numa_node >= 0) o << ", HBM is NUMA node " << g.memory_numa_node;
    o << "\n";
    o << "            pageableMemoryAccess=" << yes_no(g.pageable_memory_access)
      << " pageableMemoryAccessUsesHostPageTables=" << yes_no(g.pageable_uses_host_page_tables)
      << " hostNativeAtomicSupported=" << yes_no(g.host_native_atomics)
      << " concurrentManagedAccess=" << yes_no(g.concurrent_managed_access)
      << " canUseHostPointerForRegisteredMem=" << yes_no(g.can_use_host_pointer_for_registered_mem)
      << "\n";
  }
  o << "link        " << to_string(link) << "\n";
  return o.str();
}

std::string Topology::format_json() const {
  nlohmann::ordered_json j;
  j["hostname"] = hostname;
  j["cpu_arch"] = cpu_arch;
  j["cpu_model"] = cpu_model;
  j["cores"] = cores;
  j["pus"] = pus;
  j["l3_bytes"] = l3_bytes;
  j["host_total_bytes"] = host_total_bytes;
  j["host_available_bytes"] = host_available_bytes;
  j["numa_nodes"] = nlohmann::ordered_json::array();
  for (const auto& n : numa_nodes) {
    j["numa_nodes"].push_back({{"os_index", n.os_index},
                               {"total_bytes", n.total_bytes},
                               {"free_bytes", n.free_bytes},
                               {"cpus", n.cpus},
                               {"is_gpu_memory", n.is_gpu_memory}});
  }
  j["gpus"] = nlohmann::ordered_json::array();
  for (const auto& g : gpus) {
    j["gpus"].push_back({{"ordinal", g.ordinal},
                         {"name", g.name},
                         {"uuid", g.uuid},
                         {"pci_bus_id", g.pci_bus_id},
                         {"sm_count", g.sm_count},
                         {"compute_capability", std::to_string(g.cc_major) + "." +
                                                    std::to_string(g.cc_minor)},
                         {"hbm_total_bytes", g.hbm_total_bytes},
                         {"hbm_free_bytes", g.hbm_free_bytes},
                         {"l2_bytes", g.l2_bytes},
                         {"hbm_peak_bps", g.hbm_peak_bps},
                         {"driver_version", g.driver_version},
                         {"pageable_memory_access", g.pageable_memory_access},
                         {"pageable_memory_access_uses_host_page_tables",
                          g.pageable_uses_host_page_tables},
                         {"host_native_atomic_supported", g.host_native_atomics},
                         {"concurrent_managed_access", g.concurrent_managed_access},
                         {"can_use_host_pointer_for_registered_mem",
                          g.can_use_host_pointer_for_registered_mem},
                         {"memory_numa_node", g.memory_numa_node},
                         {"driver_host_numa_node", g.driver_host_numa_node}});
  }
  j["gpu_index"] = gpu_index;
  j["host_numa_node"] = host_numa_node;
  j["link"] = std::string(to_string(link));
  return j.dump(2);
}

const Topology& topology(bool refresh) {
  static std::mutex mu;
  static std::optional<Topology> cached;
  const std::lock_guard<std::mutex> lock(mu);
  if (!cached || refresh) {
    Topology fresh = discover();  // a throw leaves the previous answer in place
    cached = std::move(fresh);
  }
  return *cached;
}

void bind_thread_to_node(int node) {
  if (numa_available() < 0) {
    // No NUMA support in the kernel: there is one memory node and nothing to bind to.
    GHT_EXPECTS(node == 0, "bind_thread_to_node(" + std::to_string(node) +
                               "): this system has no NUMA support, only node 0 exists");
    return;
  }
  GHT_EXPECTS(node >= 0 && node <= numa_max_node(),
              "bind_thread_to_node(" + std::to_string(node) + "): no such NUMA node (max " +
                  std::to_string(numa_max_node()) + ")");
  if (numa_run_on_node(node) != 0) {
    GHT_FAIL("bind_thread_to_node(" + std::to_string(node) +
             "): numa_run_on_node failed: " + std::strerror(errno) +
             " (a node without CPUs, such as a GH200 HBM node, cannot run threads)");
  }
  // Preferred, not strict: when the node fills, the kernel falls back to another node instead of
  // invoking the OOM killer; the budgets keep us within the node in normal operation.
  numa_set_preferred(node);
}

}  // namespace ght::tier
