#include "trainer/metrics_log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/log.hpp"

namespace ght::trainer {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

constexpr const char* kClearLine = "\r\033[K";

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>((s / 60) % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string format_count(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt("%.2fG", v / 1e9);
  if (a >= 1e6) return fmt("%.2fM", v / 1e6);
  if (a >= 1e3) return fmt("%.1fk", v / 1e3);
  return fmt("%.0f", v);
}

std::string format_step_line(const StepRecord& r, std::int64_t total_steps, double eta_s) {
  char head[64];
  if (total_steps > 0) {
    const int w = static_cast<int>(std::to_string(total_steps).size());
    std::snprintf(head, sizeof head, "step %*lld/%lld", w, static_cast<long long>(r.step),
                  static_cast<long long>(total_steps));
  } else {
    std::snprintf(head, sizeof head, "step %6lld", static_cast<long long>(r.step));
  }
  std::string s = head;
  s += " | loss " + fmt("%.4f", r.loss);
  s += " | aux " + fmt("%.4f", r.aux_loss);
  s += " | gnorm " + fmt("%.3f", r.grad_norm);
  s += " | lr " + fmt("%.2e", r.lr);
  s += " | " + format_count(r.tokens_per_s) + " tok/s";
  if (r.mfu) {
    s += " | mfu " + fmt("%.1f%%", *r.mfu * 100.0);
    if (r.mfu_seed) s += " (seed " + fmt("%.1f%%", *r.mfu_seed * 100.0) + ")";
  }
  if (r.link_gb_h2d) s += " | h2d " + fmt("%.2f GB", *r.link_gb_h2d);
  if (r.link_gb_d2h) s += " | d2h " + fmt("%.2f GB", *r.link_gb_d2h);
  if (r.skipped_steps > 0) s += " | skipped " + std::to_string(r.skipped_steps);
  s += " | " + format_duration(r.elapsed_s) + " elapsed";
  if (eta_s >= 0) s += " | ETA " + format_duration(eta_s);
  return s;
}

nlohmann::ordered_json step_json(const StepRecord& r) {
  nlohmann::ordered_json j = {{"type", "step"},
                              {"step", r.step},
                              {"loss", r.loss},
                              {"aux_loss", r.aux_loss},
                              {"grad_norm", r.grad_norm},
                              {"lr", r.lr},
                              {"tokens_per_s", r.tokens_per_s},
                              {"elapsed_s", r.elapsed_s},
                              {"skipped_steps", r.skipped_steps}};
  if (r.mfu) j["mfu"] = *r.mfu;
  if (r.mfu_seed) j["mfu_seed"] = *r.mfu_seed;
  if (r.link_gb_h2d) j["link_gb_h2d"] = *r.link_gb_h2d;
  if (r.link_gb_d2h) j["link_gb_d2h"] = *r.link_gb_d2h;
  return j;
}

std::string render_bar(double fraction, int width) {
  if (!std::isfinite(fraction)) fraction = 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::floor(fraction * width + 1e-9));
  std::string s = "[";
  s.append(static_cast<std::size_t>(filled), '#');
  s.append(static_cast<std::size_t>(width - filled), '.');
  s += "] " + fmt("%5.1f%%", fraction * 100.0);
  return s;
}

// ---- JSONL --------------------------------------------------------------------------------------

JsonlWriter::JsonlWriter(const std::string& path, bool append) : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (f_ == nullptr) throw io_error(path + ": cannot open metrics log: " + std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void JsonlWriter::write(const nlohmann::ordered_json& j) {
  // NaN/Inf become null: JSON has no spelling for them, and a diverged loss must not break the log.
  const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  if (std::fputs(line.c_str(), f_) < 0 || std::fflush(f_) != 0) {
    throw io_error(path_ + ": cannot write metrics log: " + std::strerror(errno));
  }
}

// ---- logger -------------------------------------------------------------------------------------

MetricsLogger::MetricsLogger(MetricsLogOptions opt) : opt_(std::move(opt)) {
  out_ = opt_.console != nullptr ? opt_.console : &std::cout;
  if (opt_.console_every < 1) opt_.console_every = 1;
  if (opt_.progress_every <= 0) opt_.progress_every = std::max<std::int64_t>(1, opt_.total_steps / 20);
  ProgressMode mode = opt_.progress;
  if (mode == ProgressMode::automatic) {
    mode = (out_ == &std::cout && ::isatty(STDOUT_FILENO) != 0) ? ProgressMode::bar : ProgressMode::lines;
  }
  opt_.progress = opt_.total_steps > 0 && !opt_.quiet ? mode : ProgressMode::off;
  bar_ = opt_.progress == ProgressMode::bar;
  if (!opt_.jsonl_path.empty()) jsonl_.emplace(opt_.jsonl_path, /*append=*/true);
}

MetricsLogger::~MetricsLogger() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; the bar is cosmetic
  }
}

double MetricsLogger::eta_s(const StepRecord& r) const {
  if (opt_.total_steps <= 0 || first_step_ < 0 || r.step <= first_step_) return -1;
  const double per_step = (r.elapsed_s - first_elapsed_) / static_cast<double>(r.step - first_step_);
  return per_step * static_cast<double>(std::max<std::int64_t>(0, opt_.total_steps - r.step));
}

void MetricsLogger::draw_bar(const StepRecord& r, double eta) {
  const double frac = static_cast<double>(r.step) / static_cast<double>(opt_.total_steps);
  *out_ << render_bar(frac) << " " << r.step << "/" << opt_.total_steps << " | "
        << format_duration(r.elapsed_s) << " elapsed | ETA " << format_duration(eta);
}

void MetricsLogger::log_step(const StepRecord& r) {
  if (first_step_ < 0) {
    first_step_ = r.step;
    first_elapsed_ = r.elapsed_s;
  }
  write_jsonl(step_json(r));
  if (opt_.quiet) return;
  const double eta = eta_s(r);
  const bool last = opt_.total_steps > 0 && r.step >= opt_.total_steps;
  const bool line = last || r.step % opt_.console_every == 0 || r.step == first_step_;
  if (bar_) {
    *out_ << kClearLine;
    if (line) *out_ << format_step_line(r, opt_.total_steps, eta) << "\n";
    draw_bar(r, eta);
    bar_shown_ = true;
    out_->flush();
    return;
  }
  if (line) *out_ << format_step_line(r, opt_.total_steps, eta) << "\n";
  if (opt_.progress == ProgressMode::lines && (r.step % opt_.progress_every == 0 || last)) {
    *out_ << "progress ";
    draw_bar(r, eta);
    *out_ << "\n";
  }
  out_->flush();
}

void MetricsLogger::log_eval(std::int64_t step, double eval_loss, double elapsed_s) {
  write_jsonl({{"type", "eval"}, {"step", step}, {"eval_loss", eval_loss}, {"elapsed_s", elapsed_s}});
  print("eval step " + std::to_string(step) + " | eval loss " + fmt("%.4f", eval_loss) + " | " +
        format_duration(elapsed_s) + " elapsed");
}

void MetricsLogger::log_event(const nlohmann::ordered_json& j) { write_jsonl(j); }

void MetricsLogger::write_jsonl(const nlohmann::ordered_json& j) {
  if (!jsonl_) return;
  if (opt_.run_id.empty()) {
    jsonl_->write(j);
    return;
  }
  nlohmann::ordered_json t = j;
  t["run_id"] = opt_.run_id;
  jsonl_->write(t);
}

void MetricsLogger::print(std::string_view line) {
  if (opt_.quiet || !log::enabled(log::Level::info)) return;
  if (bar_shown_) {
    // The bar stays on the last line: erase it, print, and let the next step redraw it.
    *out_ << kClearLine;
    bar_shown_ = false;
  }
  *out_ << line << "\n";
  out_->flush();
}

void MetricsLogger::finish() {
  if (bar_shown_) {
    *out_ << kClearLine;
    out_->flush();
    bar_shown_ = false;
  }
}

// ---- ProgressBar --------------------------------------------------------------------------------

ProgressBar::ProgressBar(std::string label, std::int64_t total, bool bytes, std::FILE* out)
    : label_(std::move(label)), total_(total), bytes_(bytes), out_(out) {
  tty_ = out_ != nullptr && ::isatty(::fileno(out_)) != 0;
  start_ = now_s();
}

std::string ProgressBar::line(std::int64_t done) const {
  const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const double el = now_s() - start_;
  const double rate = el > 0 ? static_cast<double>(done) / el : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : -1;
  auto amount = [&](double v) {
    return bytes_ ? config::format_bytes(static_cast<std::uint64_t>(std::max(0.0, v))) : format_count(v);
  };
  return label_ + " " + render_bar(frac, 24) + " " + amount(static_cast<double>(done)) + " / " +
         amount(static_cast<double>(total_)) + " | " + amount(rate) + "/s | ETA " + format_duration(eta);
}

void ProgressBar::update(std::int64_t done) {
  if (out_ == nullptr || finished_) return;
  if (tty_) {
    const double t = now_s();
    if (last_draw_ >= 0 && t - last_draw_ < 0.1) return;
    last_draw_ = t;
    std::fprintf(out_, "%s%s", kClearLine, line(done).c_str());
    std::fflush(out_);
    return;
  }
  const int decile = total_ > 0 ? static_cast<int>(10 * done / total_) : 10;
  if (decile == last_decile_) return;
  last_decile_ = decile;
  std::fprintf(out_, "%s\n", line(done).c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (out_ == nullptr || finished_) return;
  finished_ = true;
  if (tty_) {
    std::fprintf(out_, "%s%s\n", kClearLine, line(total_).c_str());
  } else if (last_decile_ != 10) {
    std::fprintf(out_, "%s\n", line(total_).c_str());
  }
  std::fflush(out_);
}

}  // namespace ght::trainer
