#pragma once
/**
 * @file accuracy_ledger.hpp
 * @brief The accuracy ledger: the measured price of every inexact choice (DESIGN.md, "Exactness
 * belongs to the user").
 *
 * An inexact choice is one option set to a value that changes the numbers a run computes:
 * bf16 or 8-bit m and v (GHT_OPT_STATE), bf16 gradient accumulation (GHT_GRAD_ACCUM), the delayed
 * update (GHT_OPT_DELAY). Its *verdict* compares learning curves of the choice with the exact
 * fp32 run at matched tokens, and records what it was measured at (model, parameters, steps,
 * learning rate), so a reader can judge how far it carries:
 *   - eval_loss_delta: (choice − exact) / exact eval loss at the end; negative is better;
 *   - noise_band: the exact run's own seed-to-seed spread of that figure (max − min over seeds,
 *     relative to their mean);
 *   - extra_tokens: the share of the run's tokens the choice needs beyond the exact run's to reach
 *     the same eval loss: the choice ends where the exact runs' mean curve was at step s, so it
 *     lags by steps / s − 1 (≤ 0 where it ends ahead: its first step at the exact final loss, over
 *     steps, − 1); absent where the curves never meet (bench/trainer/ledger.sh computes it);
 *   - within_noise: |eval_loss_delta| ≤ noise_band, or the choice is better than exact.
 *
 * The ledger is data: tier/accuracy_ledger.json in the repository, built into ght; GHT_PLAN_LEDGER
 * names another file of the same format. The plan reads it through Tolerance (plan_search.hpp).
 */
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ght::tier {

/// One measured price of one inexact choice (see the file comment).
struct Verdict {
  std::string option;  ///< GHT_* name, e.g. "GHT_OPT_STATE"
  std::string value;   ///< its inexact value, e.g. "q8"
  std::string model;   ///< what it was measured on, e.g. "small"
  double params = 0;   ///< that model's parameters
  long long steps = 0;
  double lr = 0;       ///< peak learning rate
  int exact_seeds = 0; ///< seeds of the exact run behind noise_band
  double eval_loss_delta = 0;
  double noise_band = 0;
  std::optional<double> extra_tokens;
  bool within_noise = false;
  std::string measured;  ///< date, YYYY-MM-DD
  std::string source;    ///< the result file with the curves and the command

  /// "q8 m/v: -1.28% eval loss (noise ±1.30%), small (27M), 300 steps, lr 0.002"
  [[nodiscard]] std::string describe() const;
};

class Ledger {
 public:
  Ledger() = default;
  explicit Ledger(std::vector<Verdict> verdicts) : verdicts_(std::move(verdicts)) {}

  /// Parse the ledger's JSON. @throws ght::io_error naming `origin` and the offending field.
  static Ledger parse(const std::string& text, const std::string& origin);
  /// The ledger built into ght (tier/accuracy_ledger.json at build time).
  static const Ledger& builtin();
  /// GHT_PLAN_LEDGER's file when set, else builtin(). @throws ght::io_error for a bad file.
  static Ledger from_config();

  /// The verdict that speaks for `option`=`value`: of those recorded, the one measured on the
  /// largest model, then the longest run; nullptr when there is none.
  [[nodiscard]] const Verdict* find(std::string_view option, std::string_view value) const;
  [[nodiscard]] const std::vector<Verdict>& verdicts() const { return verdicts_; }

 private:
  std::vector<Verdict> verdicts_;
};

}  // namespace ght::tier
