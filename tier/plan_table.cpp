// Plan::format_table: the plan as a table for people (ght plan).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "tier/cost_model.hpp"
#include "tier/plan.hpp"
#include "tier/plan_detail.hpp"

namespace ght::tier {

using detail::gib;
using detail::is_state;

namespace {

std::string num(double v, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

std::string gb(double bytes) {
  if (!std::isfinite(bytes)) return "inf";
  return num(bytes / 1e9, 1) + " GB";
}

std::string secs(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s != 0 && s < 0.01) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
    return buf;
  }
  return num(s, 3) + " s";
}

// Parameters whose fp32 master lives on the host, by where their gradient is: the gradient
// region of the same group, layer and expert (the trainer's regions come in such sets); a master
// without one counts as having its gradient in HBM.
UpdateSplitInput host_state_params(const std::vector<Region>& regions,
                                   const std::vector<Decision>& decisions) {
  UpdateSplitInput in;
  double state_bytes = 0;  // master, m and v bytes of the host-state parameters
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    if (is_state(r.cls) && decisions[i].tier == TierKind::host) {
      state_bytes += static_cast<double>(r.host_bytes.value_or(r.bytes));
    }
  }
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& m = regions[i];
    if (m.cls != TensorClass::master || decisions[i].tier != TierKind::host) continue;
    const std::uint64_t params = m.host_bytes.value_or(m.bytes) / kMasterBytesPerParam;
    bool grad_on_host = false;
    for (std::size_t j = 0; j < regions.size(); ++j) {
      const Region& g = regions[j];
      if (g.cls == TensorClass::grad && g.group_name() == m.group_name() && g.layer == m.layer &&
          g.expert == m.expert) {
        grad_on_host = decisions[j].tier == TierKind::host;
      }
    }
    (grad_on_host ? in.params_grad_host : in.params_grad_hbm) += params;
  }
  // The regions' own bytes: 12 per parameter, 8 with bf16 m and v, 6.03 with q8 (GHT_OPT_STATE).
  const auto n = static_cast<double>(in.params_grad_host + in.params_grad_hbm);
  if (n > 0) in.state_bytes_per_param = state_bytes / n;
  return in;
}

}  // namespace

std::string Plan::format_table(bool explain) const {
  std::ostringstream os;
  const PlanOptions& o = options_;
  const Prediction& p = prediction_;
  os << "plan: " << regions_.size() << " regions, policy " << to_string(o.policy) << ", link "
     << o.link.name << " (" << to_string(o.link.kind) << ", " << o.link.source << ")\n";
  if (!o.place.empty()) {
    if (o.place_origin.empty()) {
      os << "rules: GHT_PLACE=" << o.place << "\n";
    } else {
      os << "rules: " << o.place << " (from " << o.place_origin << ")\n";
    }
  }
  os << "budgets: HBM " << gib(o.budgets.hbm) << "  [" << o.budgets.hbm_origin << "]\n"
     << "         host " << gib(o.budgets.host) << "  [" << o.budgets.host_origin << "]\n\n";

  struct Row {
    std::size_t group_rank = 0;
    int cls_rank = 0, tier_rank = 0, mode_rank = 0;
    std::string group, cls, tier, mode;
    std::size_t count = 0;
    std::uint64_t bytes = 0;
    std::map<std::string, std::size_t> reasons;
    double gain_lo = std::numeric_limits<double>::infinity(), gain_hi = 0;
  };
  std::vector<Row> rows;
  std::map<std::string, std::size_t> row_of;
  std::map<std::string, std::size_t> group_rank;  // groups in order of first appearance
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    const Decision& d = decisions_[i];
    const std::string key = std::string(r.group_name()) + "|" + std::string(to_string(r.cls)) + "|" +
                            std::string(to_string(d.tier)) + "|" + std::string(to_string(d.mode));
    auto [it, fresh] = row_of.try_emplace(key, rows.size());
    if (fresh) {
      Row row;
      row.group_rank = group_rank.try_emplace(std::string(r.group_name()), group_rank.size()).first->second;
      row.cls_rank = static_cast<int>(r.cls);
      row.tier_rank = static_cast<int>(d.tier);
      row.mode_rank = static_cast<int>(d.mode);
      row.group = std::string(r.group_name());
      row.cls = std::string(to_string(r.cls));
      row.tier = std::string(to_string(d.tier));
      row.mode = d.mode == Mode::none ? std::string("-") : std::string(to_string(d.mode));
      rows.push_back(std::move(row));
    }
    Row& row = rows[it->second];
    ++row.count;
    row.bytes += d.mode == Mode::recompute ? r.recompute_bytes.value_or(r.bytes) : r.bytes_on(d.tier);
    ++row.reasons[d.reason];
    if (d.gain_ms_per_gib > 0) {
      row.gain_lo = std::min(row.gain_lo, d.gain_ms_per_gib);
      row.gain_hi = std::max(row.gain_hi, d.gain_ms_per_gib);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.group_rank, a.cls_rank, a.tier_rank, a.mode_rank) <
           std::tie(b.group_rank, b.cls_rank, b.tier_rank, b.mode_rank);
  });
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %-10s %-5s %-10s %8s %14s\n", "group", "class", "tier",
                "mode", "regions", "bytes");
  os << line;
  for (const Row& row : rows) {
    std::snprintf(line, sizeof line, "%-14s %-10s %-5s %-10s %8zu %14s\n", row.group.c_str(),
                  row.cls.c_str(), row.tier.c_str(), row.mode.c_str(), row.count,
                  gib(row.bytes).c_str());
    os << line;
    if (explain) {
      for (const auto& [reason, n] : row.reasons) {
        os << "    why: " << reason;
        if (row.reasons.size() > 1) os << " (" << n << " regions)";
        os << "\n";
      }
      if (row.gain_hi > 0) {
        os << "         in HBM it saves " << num(row.gain_lo, 3);
        if (row.gain_hi > row.gain_lo) os << "-" << num(row.gain_hi, 3);
        os << " ms of link, host-memory or recompute work per step per GiB\n";
      }
    }
  }
  auto pct = [](std::uint64_t a, std::uint64_t b) {
    return b == 0 ? std::string("-") : num(100.0 * static_cast<double>(a) / static_cast<double>(b), 1) + "%";
  };
  os << "\ntotals: HBM " << gib(p.hbm_bytes) << " of " << gib(o.budgets.hbm) << " ("
     << pct(p.hbm_bytes, o.budgets.hbm) << ")   host " << gib(p.host_bytes) << " of "
     << gib(o.budgets.host) << " (" << pct(p.host_bytes, o.budgets.host) << ")\n";
  os << "modes:  grad " << mode_summary(TensorClass::grad) << "   activation "
     << mode_summary(TensorClass::activation) << "\n";
  if (o.stream_staging_bytes > 0 && o.link.kind != LinkKind::none &&
      mode_summary(TensorClass::grad) != "accumulate" && mode_summary(TensorClass::grad) != "-") {
    os << "        (gradient stream staging " << gib(o.stream_staging_bytes)
       << " counted in host memory)\n";
  }
  char flops[32];
  std::snprintf(flops, sizeof flops, "%.3g", o.step_flops);
  char head_flops[32];
  std::snprintf(head_flops, sizeof head_flops, "%.3g", o.head_flops);
  os << "\nper step: compute " << secs(p.compute_seconds) << " (" << flops << " FLOP at "
     << num(o.assumed_tflops, 0) << " TFLOP/s, GHT_ASSUMED_TFLOPS; LM head " << head_flops << " FLOP at "
     << num(o.head_tflops, 0) << " TFLOP/s, GHT_ASSUMED_HEAD_TFLOPS): forward " << secs(p.forward_seconds)
     << ", backward " << secs(p.compute_seconds - p.forward_seconds) << " (the layers "
     << num(o.backward_ratio, 2) << "x the forward, GHT_ASSUMED_BWD_RATIO, + gradient accumulation "
     << secs(p.accumulate_seconds) << ", + LM head " << secs(p.head_seconds) << ")\n";
  if (o.fp8_saved_seconds != 0) {
    os << "  FP8 GEMMs     forward " << secs(o.fp8_saved_seconds) << " less (GHT_FP8, at GHT_ASSUMED_FP8_GEMM); "
       << gib(o.fp8_hbm_bytes) << " of FP8 copies in HBM\n";
  }
  os << "  link H2D      " << gb(p.h2d_bytes) << "  " << secs(p.h2d_seconds) << "\n"
     << "  link D2H      " << gb(p.d2h_bytes) << "  " << secs(p.d2h_seconds) << "\n"
     << "  link both     " << secs(p.link_seconds) << " sharing the link (optimizer alone "
     << secs(p.optimizer_link_seconds) << ")\n"
     << "  host memory   " << gb(p.host_traffic_bytes) << "  " << secs(p.host_seconds) << "\n";
  const UpdateSplitInput state = host_state_params(regions_, decisions_);
  if (o.link.kind != LinkKind::none && state.params_grad_hbm + state.params_grad_host > 0) {
    // A prediction only: the optimizer runs one path per region (cost_model.hpp).
    const UpdateSplit u = predict_update_split(state, o.link);
    const double n = static_cast<double>(state.params_grad_hbm + state.params_grad_host);
    const double bytes = adamw_bytes_per_param(kHostGradBytes, state.state_bytes_per_param);
    os << "  update split  " << num(n / 1e9, 2) << "B host-state params: all over the link "
       << secs(u.all_link_seconds) << ", all on the host cores " << secs(u.all_cpu_seconds)
       << ", best " << num(100 * u.cpu_fraction, 1) << "% on the host cores " << secs(u.seconds)
       << " (limit " << u.limit << ")\n"
       << "                (prediction; CPU AdamW at host triad " << num(o.link.host_triad_bps / 1e9, 0)
       << " GB/s / " << num(bytes, 0) << " B = " << num(o.link.host_triad_bps / bytes / 1e9, 1)
       << " Gparam/s, memory-bound;\n"
       << "                triad from " << host_triad_origin(o.link) << ";\n"
       << "                host memory shared with the link, not in the step above; GHT_OPTIMIZER=split runs\n"
       << "                both paths at once at this share, GHT_OPT_CPU_SHARE forces another)\n";
    if (o.speculation_hbm_bytes > 0) {
      os << "  undo arena    " << gib(o.speculation_hbm_bytes)
         << " in HBM (GHT_OPT_SPECULATE): updates start during the last backward, in the window below\n";
    }
  }
  os << "  recompute     " << secs(p.recompute_seconds) << "\n";
  if (p.hbm_pass_seconds > 0) {
    os << "  HBM update    " << secs(p.hbm_pass_seconds) << " (state in HBM, at " << num(o.link.hbm_bps / 1e12, 2)
       << " TB/s: not hidden)\n";
  }
  os << "  window        " << secs(p.window_seconds) << " of compute to hide transfers behind\n"
     << "  exposed       " << secs(p.exposed_seconds) << "   predicted step " << secs(p.step_seconds)
     << "\n";
  if (explain && !notes_.empty()) {
    os << "\nnotes:\n";
    for (const auto& n : notes_) os << "  " << n << "\n";
  }
  return os.str();
}

}  // namespace ght::tier
