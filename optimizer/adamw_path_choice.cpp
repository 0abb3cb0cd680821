// AdamW's path choice: the names of paths, choices and link modes and their configuration, the
// path each region takes given where its state landed, and the split of the host-state regions
// between the cpu and gpu_link paths (PathChoice::split).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/config.hpp"
#include "tier/cost_model.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/plan.hpp"
#include "tier/topology.hpp"

namespace ght::optimizer {

// ---- names -----------------------------------------------------------------------------------

std::string_view to_string(Path p) noexcept {
  switch (p) {
    case Path::gpu_link: return "gpu_link";
    case Path::cpu: return "cpu";
    case Path::device: return "device";
  }
  return "?";
}

std::string_view to_string(PathChoice p) noexcept {
  switch (p) {
    case PathChoice::automatic: return "auto";
    case PathChoice::gpu_link: return "gpu_link";
    case PathChoice::cpu: return "cpu";
    case PathChoice::device: return "device";
    case PathChoice::split: return "split";
  }
  return "?";
}

PathChoice parse_path_choice(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "auto") return PathChoice::automatic;
  if (t == "gpu_link") return PathChoice::gpu_link;
  if (t == "cpu") return PathChoice::cpu;
  if (t == "device") return PathChoice::device;
  if (t == "split") return PathChoice::split;
  throw config_error("GHT_OPTIMIZER: '" + std::string(text) +
                     "' is not one of auto|gpu_link|cpu|device|split");
}

PathChoice path_choice_from_config() {
  return parse_path_choice(config::cfg().get_string(config::Key::GHT_OPTIMIZER));
}

StateType parse_state_type(std::string_view text) {
  const std::string t = config::parse_enum("GHT_OPT_STATE", text, "fp32|bf16|q8");
  return t == "q8" ? StateType::q8 : t == "bf16" ? StateType::bf16 : StateType::fp32;
}

double gpu_update_params_per_second(StateType t) {
  if (t != StateType::q8) return 0;
  return config::cfg().get_float(config::Key::GHT_ASSUMED_Q8_UPDATE) * 1e9;
}

StateType state_type_from_config() {
  return parse_state_type(config::cfg().get_string(config::Key::GHT_OPT_STATE));
}

std::string_view to_string(LinkMode m) noexcept {
  return m == LinkMode::dma ? "dma" : "zero_copy";
}

LinkMode link_mode_from_config() {
  // The registry has validated the value against auto|zero_copy|dma.
  const std::string v = config::cfg().get_string(config::Key::GHT_OPT_LINK_MODE);
  if (v == "dma") return LinkMode::dma;
  if (v == "zero_copy") return LinkMode::zero_copy;
  // auto: on PCIe the in-place kernel reached 0.70 Gparam/s (19% of the link roofline) while the
  // copy-engine path reached 3.95 Gparam/s (bench/results/2026-11-30-h200-optimizer.md); on a
  // coherent C2C link the GPU reads host memory natively, so it updates in place.
  return tier::topology().link == LinkKind::c2c ? LinkMode::zero_copy : LinkMode::dma;
}

// ---- each region's path ------------------------------------------------------------------------

// The path of rs under `choice`, from where its state landed (the choice pinned the tier, or the
// plan placed it).
void AdamW::Impl::choose_path(RegionState& rs, PathChoice choice) {
  bool all_host = true, all_dev = true, all_hbm = true;
  for (const StateBuffer& b : rs.st) {
    all_host = all_host && b.host != nullptr;
    all_dev = all_dev && b.device != nullptr;
    all_hbm = all_hbm && b.tier == TierKind::hbm;
  }
  const std::string where = "region '" + rs.desc.name + "'";
  switch (choice) {
    case PathChoice::automatic:
    case PathChoice::split:
      if (gpu && all_dev) {
        rs.path = all_hbm ? Path::device : Path::gpu_link;
      } else {
        GHT_EXPECTS(all_host, where + ": optimizer state is reachable by neither the CPU nor "
                                      "the GPU");
        rs.path = Path::cpu;
      }
      break;
    case PathChoice::gpu_link:
    case PathChoice::device:
      GHT_EXPECTS(all_dev, where + ": GHT_OPTIMIZER=" + std::string(to_string(choice)) +
                               " but the state is not GPU-addressable");
      rs.path = all_hbm ? Path::device : Path::gpu_link;
      break;
    case PathChoice::cpu:
      GHT_EXPECTS(all_host, where + ": GHT_OPTIMIZER=cpu but the state is in HBM");
      rs.path = Path::cpu;
      break;
  }
}

// PathChoice::split: the host-state regions the link path would take, in update order, divided
// between the two paths at the resolved share (tier/plan.hpp: assign_update_split).
void AdamW::Impl::assign_split() {
  const config::Registry& reg = config::cfg();
  std::vector<std::size_t> idx;
  std::vector<std::uint64_t> params;
  tier::UpdateSplitInput in;
  in.state_bytes_per_param = state_bytes_per_param(state_type);
  for (std::size_t r = 0; r < regions.size(); ++r) {
    const Impl::RegionState& rs = regions[r];
    if (rs.path != Path::gpu_link || rs.st[0].host == nullptr || rs.st[1].host == nullptr ||
        rs.st[2].host == nullptr) {
      continue;
    }
    idx.push_back(r);
    params.push_back(rs.desc.n);
    const bool grad_host = rs.desc.grad != nullptr && !detail::is_device_memory(rs.desc.grad);
    (grad_host ? in.params_grad_host : in.params_grad_hbm) += rs.desc.n;
  }
  const double requested = opts.cpu_share ? *opts.cpu_share : reg.get_float(config::Key::GHT_OPT_CPU_SHARE);
  // The cost model's best share needs the link numbers (measured or the link kind's profile).
  const tier::LinkNumbers numbers = requested == -1 ? tier::resolve_link_numbers() : tier::LinkNumbers{};
  const double share = tier::resolve_update_cpu_share(requested, in, numbers);
  split_share = share;
  const std::vector<bool> on_cpu = tier::assign_update_split(params, share);
  for (std::size_t i = 0; i < idx.size(); ++i) {
    if (on_cpu[i]) regions[idx[i]].path = Path::cpu;
  }
}

}  // namespace ght::optimizer
