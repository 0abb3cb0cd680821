#pragma once
/**
 * @file schedule.hpp
 * @brief Learning-rate schedules: linear warmup, then cosine, linear, WSD or constant.
 *
 * `step` is the 0-based index of the optimizer step about to be taken; total_steps steps are
 * run (0 .. total_steps-1).
 *   warmup (step < W):   lr · (step + 1) / W            (step 0 already moves the weights)
 *   after warmup, with p = (step - W) / (total - W) in [0, 1]:
 *     cosine    min_lr + (lr - min_lr) · (1 + cos(pi · p)) / 2
 *     linear    lr - (lr - min_lr) · p
 *     constant  lr
 *     wsd       warmup-stable-decay: lr until the last D = round(decay_fraction · total) steps,
 *               then linear to min_lr: lr - (lr - min_lr) · (step - (total - D)) / D
 *   step >= total_steps: min_lr (constant: lr).
 */
#include <cstdint>
#include <string>
#include <string_view>

namespace ght::trainer {

enum class ScheduleKind { cosine, linear, wsd, constant };
[[nodiscard]] std::string_view to_string(ScheduleKind k) noexcept;
/// @throws ght::config_error listing the valid names
[[nodiscard]] ScheduleKind parse_schedule_kind(std::string_view s);

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::cosine;
  double lr = 3e-4;                ///< peak learning rate
  double min_lr = 3e-5;            ///< final learning rate
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1000;
  double decay_fraction = 0.2;     ///< wsd: share of total_steps spent decaying

  /// @throws ght::config_error naming the field when a value is out of range
  void validate() const;
};

/// @brief The learning rate for optimizer step `step` (0-based). Does not validate.
[[nodiscard]] double lr_at(const ScheduleConfig& s, std::int64_t step) noexcept;

}  // namespace ght::trainer
