#include "tier/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace ght::tier {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// Zero bytes never cost anything, even over a missing link (avoids 0/0).
double seconds_for(double bytes, double bps) {
  if (bytes <= 0) return 0;
  return bps > 0 ? bytes / bps : kInf;
}
}  // namespace

double link_time(const LinkNumbers& link, double h2d_seconds, double d2h_seconds,
                 double h2d_bytes, double d2h_bytes) {
  double t = std::max(h2d_seconds, d2h_seconds);
  if (h2d_bytes > 0 && d2h_bytes > 0) {
    // Without a measured both-ways figure, assume the directions do not overlap at all.
    t = link.bidir_bps > 0 ? std::max(t, (h2d_bytes + d2h_bytes) / link.bidir_bps)
                           : h2d_seconds + d2h_seconds;
  }
  return t;
}

OptimizerLinkPrediction predict_optimizer_link(std::uint64_t params, double grad_bytes_per_param,
                                               const LinkNumbers& link, double state_bytes_per_param) {
  GHT_EXPECTS(grad_bytes_per_param >= 0 && std::isfinite(grad_bytes_per_param),
              "predict_optimizer_link: grad_bytes_per_param must be >= 0, got " +
                  std::to_string(grad_bytes_per_param));
  GHT_EXPECTS(state_bytes_per_param > 0 && std::isfinite(state_bytes_per_param),
              "predict_optimizer_link: state_bytes_per_param must be > 0, got " +
                  std::to_string(state_bytes_per_param));
  OptimizerLinkPrediction p;
  const double n = static_cast<double>(params);
  p.read_bytes = n * (state_bytes_per_param + grad_bytes_per_param);  // (+ grad from the host)
  p.write_bytes = n * state_bytes_per_param;  // written back in place
  p.read_seconds = seconds_for(p.read_bytes, link.kernel_read_bps);
  p.write_seconds = seconds_for(p.write_bytes, link.kernel_write_bps);
  p.seconds = link_time(link, p.read_seconds, p.write_seconds, p.read_bytes, p.write_bytes);
  return p;
}

double predict_optimizer_link_seconds(std::uint64_t params, double grad_bytes_per_param,
                                      const LinkNumbers& link) {
  return predict_optimizer_link(params, grad_bytes_per_param, link).seconds;
}

namespace {

/// One resource's time across the split: (1 - f)·all_link + f·all_cpu.
struct Line {
  const char* name;
  double all_link, all_cpu;
  [[nodiscard]] double at(double f) const {  // the ends exactly, so 0·inf never happens
    if (f <= 0) return all_link;
    if (f >= 1) return all_cpu;
    return (1 - f) * all_link + f * all_cpu;
  }
};

}  // namespace

namespace {

/// The three resources of the split (cost_model.hpp), each as a line in f.
struct SplitLines {
  Line lines[3];
};

SplitLines split_lines(const UpdateSplitInput& in, const LinkNumbers& link) {
  GHT_EXPECTS(in.cpu_params_per_s >= 0 && in.host_bps >= 0,
              "predict_update_split: rates must be >= 0");
  const double nh = static_cast<double>(in.params_grad_hbm);
  const double ns = static_cast<double>(in.params_grad_host);
  const double host_bps = in.host_bps > 0 ? in.host_bps : link.host_triad_bps;
  const double sb = in.state_bytes_per_param;
  const double cpu_host_bytes = adamw_bytes_per_param(kHostGradBytes, sb);
  const double rate = in.cpu_params_per_s > 0 ? in.cpu_params_per_s
                                              : (host_bps > 0 ? host_bps / cpu_host_bytes : 0);

  // gpu_link: the kernel's traffic, all of it host DRAM traffic too.
  const OptimizerLinkPrediction gh = predict_optimizer_link(in.params_grad_hbm, 0, link, sb);
  const OptimizerLinkPrediction gs = predict_optimizer_link(in.params_grad_host, kHostGradBytes, link, sb);
  // cpu: gradient down (only where it is in HBM) and weight up, by memcpy through staging.
  const double down = nh * kHostGradBytes, up = (nh + ns) * kUpdateWeightBytes;
  const double cpu_link = link_time(link, seconds_for(up, link.h2d_bps),
                                    seconds_for(down, link.d2h_bps), up, down);
  const double n = nh + ns;
  return SplitLines{{
      {"link", gh.seconds + gs.seconds, cpu_link},
      {"cpu", 0, n > 0 ? seconds_for(n, rate) : 0},
      // An unknown host-memory bandwidth is not charged (unlike a missing link or CPU rate,
      // it does not make a path impossible).
      {"host memory",
       host_bps > 0 ? (gh.read_bytes + gh.write_bytes + gs.read_bytes + gs.write_bytes) / host_bps : 0,
       host_bps > 0 ? (n * cpu_host_bytes + up + down) / host_bps : 0},
  }};
}

double split_total(const SplitLines& s, double f) {
  double t = 0;
  for (const Line& l : s.lines) t = std::max(t, l.at(f));
  return t;
}

UpdateSplit split_at(const SplitLines& s, double f) {
  UpdateSplit r;
  r.cpu_fraction = f;
  r.all_link_seconds = split_total(s, 0);
  r.all_cpu_seconds = split_total(s, 1);
  r.seconds = split_total(s, f);
  r.link_seconds = s.lines[0].at(f);
  r.cpu_seconds = s.lines[1].at(f);
  r.memory_seconds = s.lines[2].at(f);
  for (const Line& l : s.lines) {
    // Crossing points are computed, so "at the maximum" allows for the last bits of rounding.
    if (l.at(f) >= r.seconds * (1 - 1e-9) && r.seconds > 0) {
      r.limit += (r.limit.empty() ? "" : " = ") + std::string(l.name);
    }
  }
  return r;
}

}  // namespace

UpdateSplit predict_update_split(const UpdateSplitInput& in, const LinkNumbers& link) {
  const SplitLines s = split_lines(in, link);
  std::vector<double> candidates{0.0, 1.0};
  for (std::size_t i = 0; i < std::size(s.lines); ++i) {
    for (std::size_t j = i + 1; j < std::size(s.lines); ++j) {
      const double dx = s.lines[j].all_link - s.lines[i].all_link;
      const double den = dx - (s.lines[j].all_cpu - s.lines[i].all_cpu);
      if (std::isfinite(dx) && std::isfinite(den) && den != 0) {
        candidates.push_back(std::clamp(dx / den, 0.0, 1.0));
      }
    }
  }
  std::sort(candidates.begin(), candidates.end());
  double best_f = 0, best = split_total(s, 0);
  for (double f : candidates) {  // ascending, strictly better only: ties keep the smaller f
    const double t = split_total(s, f);
    if (t < best) {
      best = t;
      best_f = f;
    }
  }
  return split_at(s, best_f);
}

UpdateSplit evaluate_update_split(const UpdateSplitInput& in, const LinkNumbers& link, double cpu_fraction) {
  GHT_EXPECTS(cpu_fraction >= 0 && cpu_fraction <= 1,
              "evaluate_update_split: the CPU share must be in [0, 1], got " + std::to_string(cpu_fraction));
  return split_at(split_lines(in, link), cpu_fraction);
}

double resolve_update_cpu_share(double requested, const UpdateSplitInput& in, const LinkNumbers& link) {
  if (requested >= 0 && requested <= 1) return requested;
  if (requested == -1) return predict_update_split(in, link).cpu_fraction;
  throw config_error("GHT_OPT_CPU_SHARE=" + std::to_string(requested) +
                     ": the share of host-state parameters on the cpu path is -1 (the cost model's best) or "
                     "a number in [0, 1]");
}

Mode default_mode(const Region& r, TierKind t) {
  if (r.cls == TensorClass::activation) return t == TierKind::hbm ? Mode::keep : Mode::offload;
  if (r.cls == TensorClass::grad) return t == TierKind::hbm ? Mode::accumulate : Mode::stream;
  if (r.recompute_bytes && t == TierKind::hbm) return Mode::keep;
  return Mode::none;
}

std::vector<Placement> placements(const Region& r) {
  std::vector<Placement> out;
  if (r.host_allowed) out.push_back({TierKind::host, default_mode(r, TierKind::host)});
  if (r.hbm_allowed && r.recompute_bytes) out.push_back({TierKind::hbm, Mode::recompute});
  if (r.hbm_allowed) out.push_back({TierKind::hbm, default_mode(r, TierKind::hbm)});
  return out;
}

std::uint64_t hbm_bytes(const Region& r, Placement p) {
  if (p.tier != TierKind::hbm) return r.hbm_bytes_on_host;
  return p.mode == Mode::recompute ? r.recompute_bytes.value_or(r.bytes) : r.bytes;
}

std::uint64_t host_bytes(const Region& r, Placement p) {
  return p.tier == TierKind::host ? r.host_bytes.value_or(r.bytes) : 0;
}

const std::vector<Access>& accesses_on(const Region& r, TierKind t) {
  return (t == TierKind::host && r.host_access) ? *r.host_access : r.access;
}

double routing_factor(const Region& r, const Access& a) {
  if (r.expert < 0 || a.routing_tokens <= 0) return 1.0;
  const double f = std::clamp(r.routing_frequency, 0.0, 1.0);
  if (f >= 1.0) return 1.0;
  // 1 - (1-f)^n, computed without cancellation for small f.
  return -std::expm1(a.routing_tokens * std::log1p(-f));
}

Load::Bucket& Load::at(int index) {
  auto it = std::lower_bound(parts.begin(), parts.end(), index,
                             [](const std::pair<int, Bucket>& p, int i) { return p.first < i; });
  if (it == parts.end() || it->first != index) it = parts.insert(it, {index, Bucket{}});
  return it->second;
}

double backward_exposed_seconds(const Region& r, const Access& a, const LinkNumbers& link) {
  if (a.backward_exposed <= 0 || a.backward_hbm_bytes <= 0 || link.hbm_bps <= 0) return 0.0;
  return a.times_per_step * routing_factor(r, a) * a.backward_hbm_bytes * a.backward_exposed / link.hbm_bps;
}

double hbm_accumulate_seconds(const std::vector<Region>& regions, const LinkNumbers& link) {
  double s = 0;
  for (const Region& r : regions) {
    for (const Access& a : r.access) s += backward_exposed_seconds(r, a, link);
  }
  return s;
}

void Load::add(const Load& o, double sign) {
  for (const auto& [index, x] : o.parts) {
    Bucket& b = at(index);
    b.h2d_bytes += sign * x.h2d_bytes;
    b.d2h_bytes += sign * x.d2h_bytes;
    b.h2d_s += sign * x.h2d_s;
    b.d2h_s += sign * x.d2h_s;
    b.host_bytes += sign * x.host_bytes;
    b.host_s += sign * x.host_s;
    b.hbm_s += sign * x.hbm_s;
    b.accumulate_s += sign * x.accumulate_s;
  }
  recompute_flops += sign * o.recompute_flops;
}

CostModel::CostModel(LinkNumbers link, double step_flops, double assumed_tflops,
                     const std::vector<Region>& regions, double head_seconds)
    : link_(std::move(link)), step_flops_(step_flops), flops_per_second_(assumed_tflops * 1e12),
      head_seconds_(head_seconds) {
  GHT_EXPECTS(step_flops >= 0 && std::isfinite(step_flops),
              "cost model: step FLOPs must be >= 0, got " + std::to_string(step_flops));
  GHT_EXPECTS(assumed_tflops > 0 && std::isfinite(assumed_tflops),
              "cost model: assumed TFLOP/s must be > 0, got " + std::to_string(assumed_tflops));
  GHT_EXPECTS(head_seconds >= 0 && std::isfinite(head_seconds),
              "cost model: the LM head's seconds must be >= 0, got " + std::to_string(head_seconds));
  windows_.push_back(0.0);
  auto collect = [&](const std::vector<Access>& list) {
    for (const Access& a : list) {
      if (a.overlappable) windows_.push_back(a.window_fraction);
    }
  };
  for (const Region& r : regions) {
    collect(r.access);
    if (r.host_access) collect(*r.host_access);
  }
  std::sort(windows_.begin(), windows_.end());
  windows_.erase(std::unique(windows_.begin(), windows_.end()), windows_.end());
}

int CostModel::window_index(const Access& a) const {
  const double f = a.overlappable ? a.window_fraction : 0.0;
  const auto it = std::lower_bound(windows_.begin(), windows_.end(), f);
  GHT_EXPECTS(it != windows_.end() && *it == f,
              "cost model: window fraction " + std::to_string(f) +
                  " was not among the regions the model was built for");
  return static_cast<int>(it - windows_.begin());
}

Load CostModel::zero() const {
  // Dense: every window present, so adding into it never reallocates.
  Load l;
  l.parts.reserve(windows_.size());
  for (std::size_t k = 0; k < windows_.size(); ++k) l.parts.push_back({static_cast<int>(k), Load::Bucket{}});
  return l;
}

Load CostModel::load(const Region& r, Placement p, std::string_view only_what) const {
  Load l;
  for (const Access& a : accesses_on(r, p.tier)) {
    if (!only_what.empty() && a.what != only_what) continue;
    const double k = a.times_per_step * routing_factor(r, a);
    Load::Bucket& b = l.at(window_index(a));
    b.accumulate_s += backward_exposed_seconds(r, a, link_);
    if (p.tier == TierKind::hbm) {
      // The GPU works on it in place; only CPU accesses cross the link (memcpy).
      const double down = k * a.cpu_read_bytes, up = k * a.cpu_write_bytes;
      b.d2h_bytes += down;
      b.d2h_s += seconds_for(down, link_.d2h_bps);
      b.h2d_bytes += up;
      b.h2d_s += seconds_for(up, link_.h2d_bps);
      if (a.hbm_pass && link_.hbm_bps > 0) {
        const double share = a.hbm_pass_share * link_.hbm_bps;
        const double rate = a.hbm_pass_bps > 0 ? std::min(share, a.hbm_pass_bps) : share;
        b.hbm_s += k * (a.gpu_read_bytes + a.gpu_write_bytes) / rate;
      }
    } else {
      const double up = k * a.gpu_read_bytes, down = k * a.gpu_write_bytes;
      const bool kernel = a.gpu_path == GpuPath::kernel;
      b.h2d_bytes += up;
      b.h2d_s += seconds_for(up, kernel ? link_.kernel_read_bps : link_.h2d_bps);
      b.d2h_bytes += down;
      b.d2h_s += seconds_for(down, kernel ? link_.kernel_write_bps : link_.d2h_bps);
      const double host = k * (a.cpu_read_bytes + a.cpu_write_bytes);
      b.host_bytes += host;
      b.host_s += seconds_for(host, link_.host_triad_bps);
    }
  }
  if (p.mode == Mode::recompute && only_what.empty()) l.recompute_flops = r.recompute_flops;
  return l;
}

StepTime CostModel::evaluate(const Load& total) const {
  StepTime t;
  for (const auto& part : total.parts) t.accumulate_seconds += part.second.accumulate_s;
  t.accumulate_seconds = std::max(0.0, t.accumulate_seconds);
  t.compute_seconds = step_flops_ / flops_per_second_ + head_seconds_ + t.accumulate_seconds;
  t.recompute_seconds = std::max(0.0, total.recompute_flops) / flops_per_second_;
  t.window_seconds = t.compute_seconds + t.recompute_seconds;
  Load::Bucket cum;
  // Windows a load does not use add no work, and a later window hides more: checking the
  // windows it uses is enough for the maximum.
  for (const auto& [k, b] : total.parts) {
    cum.h2d_bytes += b.h2d_bytes;
    cum.d2h_bytes += b.d2h_bytes;
    cum.h2d_s += b.h2d_s;
    cum.d2h_s += b.d2h_s;
    cum.host_bytes += b.host_bytes;
    cum.host_s += b.host_s;
    cum.hbm_s += b.hbm_s;
    const double hide = windows_[k] * t.window_seconds;
    const double lt = link_time(link_, cum.h2d_s, cum.d2h_s, cum.h2d_bytes, cum.d2h_bytes);
    t.exposed_link = std::max(t.exposed_link, lt - hide);
    t.exposed_host = std::max(t.exposed_host, cum.host_s - hide);
  }
  t.h2d_bytes = cum.h2d_bytes;
  t.d2h_bytes = cum.d2h_bytes;
  t.h2d_seconds = cum.h2d_s;
  t.d2h_seconds = cum.d2h_s;
  t.link_seconds = link_time(link_, cum.h2d_s, cum.d2h_s, cum.h2d_bytes, cum.d2h_bytes);
  t.host_bytes = cum.host_bytes;
  t.host_seconds = cum.host_s;
  t.hbm_pass_seconds = std::max(0.0, cum.hbm_s);
  t.exposed_seconds = t.recompute_seconds + std::max(t.exposed_link, t.exposed_host);
  t.step_seconds = t.compute_seconds + t.exposed_seconds;
  return t;
}

double CostModel::total_seconds(const Load& l) const {
  double s = l.recompute_flops / flops_per_second_;
  for (const auto& [k, b] : l.parts) s += b.h2d_s + b.d2h_s + b.host_s;
  return s;
}

double CostModel::serial_seconds(const Load& l) const {
  double s = l.recompute_flops / flops_per_second_;
  if (!l.parts.empty() && l.parts.front().first == 0) {
    const auto& b = l.parts.front().second;
    s += b.h2d_s + b.d2h_s + b.host_s;
  }
  return s;
}

double CostModel::unhidable_seconds(const Load& l) const {
  double s = l.recompute_flops / flops_per_second_;
  for (const auto& [k, b] : l.parts) {
    const double w = 1.0 - windows_[k];
    if (w > 0) s += w * (b.h2d_s + b.d2h_s + b.host_s);
  }
  return s;
}

}  // namespace ght::tier
