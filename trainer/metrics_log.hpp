#pragma once
/**
 * @file metrics_log.hpp
 * @brief Training logs: one console line per step, the same records as JSONL (one object per
 * line, flushed per line, appended so a resumed run continues its file), and a progress bar with
 * ETA: redrawn in place on a terminal, printed as a plain line every N steps otherwise.
 *
 * Console line (fields that are unset are left out):
 *   step   120/2000 | loss 2.4312 | aux 0.0101 | gnorm 0.812 | lr 2.95e-04 | 41.2k tok/s |
 *   mfu 38.2% (seed 41.8%) | h2d 12.40 GB | d2h 3.10 GB | skipped 0 | 1:02 elapsed | ETA 16:20
 * JSONL step record:
 *   {"type":"step","step":120,"loss":2.4312,"aux_loss":0.0101,"grad_norm":0.812,"lr":0.000295,
 *    "tokens_per_s":41200,"elapsed_s":62.1,"skipped_steps":0,"mfu":0.382,"mfu_seed":0.418,...}
 */
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace ght::trainer {

/// One optimizer step's numbers.
struct StepRecord {
  std::int64_t step = 0;  ///< steps completed, counting this one (1-based)
  double loss = 0;        ///< training loss (cross-entropy, nats/token)
  double aux_loss = 0;    ///< router load-balance loss (unweighted)
  double grad_norm = 0;   ///< global gradient norm before clipping
  double lr = 0;
  double tokens_per_s = 0;
  std::optional<double> mfu;          ///< fraction of peak (0..1), GPU runs: the strict count
  std::optional<double> mfu_seed;     ///< the same step under the seed's count (ModelConfig)
  std::optional<double> link_gb_h2d;  ///< GB (1e9 bytes) moved host-to-device this step
  std::optional<double> link_gb_d2h;
  double elapsed_s = 0;               ///< wall time since the run (this process) started
  std::int64_t skipped_steps = 0;     ///< steps skipped by the non-finite guard so far
};

/// "1:02" (m:ss) or "1:02:03" (h:mm:ss); "--:--" for a negative or non-finite value.
[[nodiscard]] std::string format_duration(double seconds);
/// "41.2k", "1.23M", "812"
[[nodiscard]] std::string format_count(double v);
/// The console line for a record; eta_s < 0 leaves the ETA out.
[[nodiscard]] std::string format_step_line(const StepRecord& r, std::int64_t total_steps, double eta_s);
/// The JSONL object for a record.
[[nodiscard]] nlohmann::ordered_json step_json(const StepRecord& r);
/// "[#######.........]  45.0%" of the given width (inner characters).
[[nodiscard]] std::string render_bar(double fraction, int width = 30);

/// Appends JSON objects to a file, one per line, flushed per line.
class JsonlWriter {
 public:
  /// @throws ght::io_error naming the path when it cannot be opened
  explicit JsonlWriter(const std::string& path, bool append = true);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  void write(const nlohmann::ordered_json& j);
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

/// How progress is shown.
enum class ProgressMode {
  automatic,  ///< bar on a terminal (console is std::cout and stdout is a TTY), else lines
  bar,        ///< redraw a bar in place under the step lines (ANSI: \r and erase-line)
  lines,      ///< a plain progress line every `progress_every` steps
  off,
};

struct MetricsLogOptions {
  std::string jsonl_path;            ///< empty: no JSONL
  std::int64_t total_steps = 0;      ///< 0: unknown (no bar, no ETA)
  std::ostream* console = nullptr;   ///< nullptr: std::cout
  bool quiet = false;                ///< no console output at all
  std::int64_t console_every = 1;    ///< a step line every N steps (the last step always)
  ProgressMode progress = ProgressMode::automatic;
  std::int64_t progress_every = 0;   ///< lines mode: every N steps; 0: about 20 lines per run
  std::string run_id = {};           ///< non-empty: added as "run_id" to every JSONL record
};

/// Per-step logging to the console and JSONL, with progress and ETA.
class MetricsLogger {
 public:
  explicit MetricsLogger(MetricsLogOptions opt);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  void log_step(const StepRecord& r);
  /// An eval result: console line and {"type":"eval","step","eval_loss","elapsed_s"}.
  void log_eval(std::int64_t step, double eval_loss, double elapsed_s);
  /// Any other record (e.g. {"type":"config",...}); JSONL only.
  void log_event(const nlohmann::ordered_json& j);
  /// A line of text above the bar (the bar is redrawn after it); an info message, so nothing
  /// below GHT_LOG_LEVEL=info.
  void print(std::string_view line);
  /// Remove the bar (call once at the end of the run).
  void finish();
  /// Seconds left, from the pace since the first logged step; < 0 when unknown.
  [[nodiscard]] double eta_s(const StepRecord& r) const;

 private:
  void draw_bar(const StepRecord& r, double eta);
  void write_jsonl(const nlohmann::ordered_json& j);
  MetricsLogOptions opt_;
  std::ostream* out_ = nullptr;
  bool bar_ = false, bar_shown_ = false;
  std::optional<JsonlWriter> jsonl_;
  std::int64_t first_step_ = -1;
  double first_elapsed_ = 0;
};

/// A bar for work measured in bytes or items (`ght prep`): redrawn in place at most 10 times a
/// second on a terminal, else a line every 10%.
class ProgressBar {
 public:
  ProgressBar(std::string label, std::int64_t total, bool bytes, std::FILE* out = stderr);
  void update(std::int64_t done);
  void finish();

 private:
  std::string line(std::int64_t done) const;
  std::string label_;
  std::int64_t total_;
  bool bytes_, tty_;
  std::FILE* out_;
  double start_ = 0, last_draw_ = -1;
  int last_decile_ = -1;
  bool finished_ = false;
};

}  // namespace ght::trainer
