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
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace ght::alloc {

namespace {

using config::Key;

/// GHT_<TIER>_BUDGET, or what is free now minus GHT_<TIER>_HEADROOM when it is empty.
std::uint64_t resolve_budget(Key budget_key, Key headroom_key, const char* budget_name,
                             const char* headroom_name, std::uint64_t capacity,
                             std::uint64_t available) {
  const config::Registry& c = config::cfg();
  if (!c.is_empty(budget_key)) return c.get_size(budget_key).resolve(capacity, budget_name);
  const std::uint64_t headroom = c.get_size(headroom_key).resolve(capacity, headroom_name);
  return available > headroom ? available - headroom : 0;
}

}  // namespace

std::unique_ptr<tiered_allocator> make_default_tiered_allocator() {
  const config::Registry& c = config::cfg();
  const tier::Topology& topo = tier::topology();

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
    hbm.budget = resolve_budget(Key::GHT_HBM_BUDGET, Key::GHT_HBM_HEADROOM, "GHT_HBM_BUDGET",
                                "GHT_HBM_HEADROOM", topo.capacity(TierKind::hbm),
                                topo.available(TierKind::hbm));
  }
#endif

  // The topology's default node may be unusable here (a container's cpuset, no libnuma); only
  // a node the user asked for is an error.
  int node = topo.host_numa_node;
  if (c.source(Key::GHT_HOST_NUMA) == config::Source::Default && !detail::numa_node_usable(node)) {
    node = -1;
  }
  std::string kind = c.get_string(Key::GHT_HOST_MEMORY);
  if (kind == "auto") kind = topo.link == LinkKind::pcie ? "pinned" : "system";
  auto& host = tiers[static_cast<std::size_t>(TierKind::host)];
  if (kind == "pinned") {
    PinnedHostOptions o;
    o.numa_node = node;
    o.device = std::max(device, 0);
    host.resource = std::make_unique<pinned_host>(o);
  } else if (kind == "managed") {
    GHT_EXPECTS(device >= 0, "GHT_HOST_MEMORY=managed needs a CUDA device, and there is none");
    host.resource = std::make_unique<managed>(ManagedOptions{device, TierKind::host, node});
  } else {
    host.resource = std::make_unique<system_host>(node);
  }
  host.budget = resolve_budget(Key::GHT_HOST_BUDGET, Key::GHT_HOST_HEADROOM, "GHT_HOST_BUDGET",
                               "GHT_HOST_HEADROOM", topo.capacity(TierKind::host),
                               topo.available(TierKind::host));

  TieredOptions opts;
  opts.spill = c.get_bool(Key::GHT_SPILL);
  opts.class_rules = c.get_string(Key::GHT_ALLOC_TIERS);
  opts.log_path = c.get_string(Key::GHT_ALLOC_LOG);
  return std::make_unique<tiered_allocator>(std::move(tiers), std::move(opts));
}

}  // namespace ght::alloc
