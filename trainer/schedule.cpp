#include "trainer/schedule.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numbers>

#include "tier/error.hpp"

namespace ght::trainer {

std::string_view to_string(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::linear: return "linear";
    case ScheduleKind::wsd: return "wsd";
    case ScheduleKind::constant: return "constant";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view s) {
  std::string l(s);
  for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto k : {ScheduleKind::cosine, ScheduleKind::linear, ScheduleKind::wsd, ScheduleKind::constant}) {
    if (l == to_string(k)) return k;
  }
  throw config_error("unknown schedule '" + std::string(s) + "'; valid: cosine, linear, wsd, constant");
}

void ScheduleConfig::validate() const {
  auto bad = [](const std::string& what) { throw config_error("schedule: " + what); };
  if (!(lr > 0) || !std::isfinite(lr)) bad("lr must be > 0, got " + std::to_string(lr));
  if (!(min_lr >= 0) || min_lr > lr) {
    bad("min_lr must be in [0, lr = " + std::to_string(lr) + "], got " + std::to_string(min_lr));
  }
  if (total_steps <= 0) bad("total_steps must be > 0, got " + std::to_string(total_steps));
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    bad("warmup_steps must be in [0, total_steps = " + std::to_string(total_steps) + "], got " +
        std::to_string(warmup_steps));
  }
  if (!(decay_fraction >= 0 && decay_fraction <= 1)) {
    bad("decay_fraction must be in [0, 1], got " + std::to_string(decay_fraction));
  }
  if (kind == ScheduleKind::wsd) {
    const auto d = static_cast<std::int64_t>(std::llround(decay_fraction * static_cast<double>(total_steps)));
    if (warmup_steps > total_steps - d) {
      bad("wsd: warmup_steps (" + std::to_string(warmup_steps) + ") overlaps the decay phase (last " +
          std::to_string(d) + " of " + std::to_string(total_steps) + " steps)");
    }
  }
}

double lr_at(const ScheduleConfig& s, std::int64_t step) noexcept {
  if (step < 0) step = 0;
  if (step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (s.kind == ScheduleKind::constant) return s.lr;
  if (step >= s.total_steps) return s.min_lr;
  const double span = static_cast<double>(s.total_steps - s.warmup_steps);
  const double p = span > 0 ? std::clamp(static_cast<double>(step - s.warmup_steps) / span, 0.0, 1.0) : 1.0;
  switch (s.kind) {
    case ScheduleKind::cosine:
      return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    case ScheduleKind::linear:
      return s.lr - (s.lr - s.min_lr) * p;
    case ScheduleKind::wsd: {
      const auto d = static_cast<std::int64_t>(std::llround(s.decay_fraction * static_cast<double>(s.total_steps)));
      const std::int64_t decay_start = s.total_steps - d;
      if (d <= 0 || step < decay_start) return s.lr;
      return s.lr - (s.lr - s.min_lr) * static_cast<double>(step - decay_start) / static_cast<double>(d);
    }
    case ScheduleKind::constant:
      break;
  }
  return s.lr;
}

}  // namespace ght::trainer
