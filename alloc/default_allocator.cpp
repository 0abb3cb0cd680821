// make_default_tiered_allocator(): the tiered allocator that GHT_* options and the machine
// describe (tiered.hpp has the rules).
#include <algorithm>

#include "alloc/detail/host_memory.hpp"
#include "alloc/device_direct.hpp"
#include "alloc/device_pool.hpp"
#include "alloc/managed.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "tier/budget.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace ght::alloc {

using config::Key;

std::string host_resource_kind(const std::string& option, LinkKind link) {
  if (option != "auto") return option;
  return link == LinkKind::pcie ? "pinned" : "system";
}

std::unique_ptr<tiered_allocator> make_default_tiered_allocator() {
  const config::Registry& c = config::cfg();
  const tier::Topology& topo = tier::topology();
  const tier::Capacities caps = tier::machine_capacities();

  std::array<TierSetup, kNumTiers> tiers;
  int device = -1;
#ifdef GHT_HAVE_CUDA
  if (const tier::GpuInfo* gpu = topo.gpu()) {
    device = gpu->ordinal;
    auto& hbm = tiers[static_cast<std::size_t>(TierKind::hbm)];
    if (c.get_string(Key::GHT_DEVICE_POOL) == "direct") {
      hbm.resource = std::make_unique<device_direct>(device);
    } else {
      hbm.resource = std::make_unique<device_pool>(DevicePoolOptions{device, UINT64_MAX});
    }
    hbm.budget = tier::resolve_budget(TierKind::hbm, caps, c).bytes;
  }
#endif

  // The topology's default node may be unusable here (a container's cpuset, no libnuma); only
  // a node the user asked for is an error.
  int node = topo.host_numa_node;
  if (c.source(Key::GHT_HOST_NUMA) == config::Source::Default && !detail::numa_node_usable(node)) {
    node = -1;
  }
  const std::string kind = host_resource_kind(c.get_string(Key::GHT_HOST_MEMORY), topo.link);
  auto& host = tiers[static_cast<std::size_t>(TierKind::host)];
  detail::HostCacheOptions cache;
  cache.max_bytes = c.get_size(Key::GHT_HOST_CACHE).resolve(caps.host_total, "GHT_HOST_CACHE");
  if (kind == "pinned") {
    PinnedHostOptions o;
    o.numa_node = node;
    o.device = std::max(device, 0);
    o.cache = cache;
    host.resource = std::make_unique<pinned_host>(o);
  } else if (kind == "managed") {
    GHT_EXPECTS(device >= 0, "GHT_HOST_MEMORY=managed needs a CUDA device, and there is none");
    host.resource = std::make_unique<managed>(ManagedOptions{device, TierKind::host, node});
  } else {
    host.resource = std::make_unique<system_host>(node, /*huge_pages=*/true, cache);
  }
  host.budget = tier::resolve_budget(TierKind::host, caps, c).bytes;

  TieredOptions opts;
  opts.spill = c.get_bool(Key::GHT_SPILL);
  opts.class_rules = c.get_string(Key::GHT_ALLOC_TIERS);
  opts.log_path = c.get_string(Key::GHT_ALLOC_LOG);
  return std::make_unique<tiered_allocator>(std::move(tiers), std::move(opts));
}

}  // namespace ght::alloc
