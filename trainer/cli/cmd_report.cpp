// `ght report RUN [RUN...] [--out FILE.html]`: one self-contained HTML page (inline SVG, inline
// CSS, no scripts, no network) that overlays the runs' curves with a legend:
//   - training and eval loss, gradient norm, learning rate;
//   - tokens/s and MFU over steps;
//   - the per-phase step breakdown (forward, backward, exposed optimizer, other) from "profile"
//     records in log.jsonl, or <run>/profile.json: medians as a stacked bar per run, and a table;
//   - bytes per memory tier over steps, from step records: numeric `<tier>_bytes` fields, or a
//     `mem` / `memory` object of name -> bytes (or name -> {"current": bytes}, or the statistics
//     adaptor's {"all", "tiers": {...}} JSON).
// A RUN is a run directory (holding log.jsonl) or a log.jsonl file. Fields a run lacks are left
// out of its charts; a chart no run has data for says so instead of drawing empty axes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tier/error.hpp"
#include "trainer/cli/command.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- formatting ---------------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// Text for HTML element content and attribute values.
std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

enum class Unit { plain, count, percent, bytes, ms };

/// A tick or table value: `step` is the tick spacing (0 for a single value), so labels carry as
/// many decimals as the spacing needs and no more.
std::string format_value(double v, Unit u, double step = 0) {
  const auto decimals = [](double s) {
    if (s <= 0 || !std::isfinite(s)) return 3;
    return std::clamp(static_cast<int>(std::ceil(-std::log10(s) - 1e-9)), 0, 6);
  };
  const auto scaled = [&](double div, const char* suffix) {
    char b[64];
    if (step > 0) {
      std::snprintf(b, sizeof b, "%.*f%s", decimals(step / div), v / div, suffix);
    } else {
      std::snprintf(b, sizeof b, "%.4g%s", v / div, suffix);  // a single value: 4 significant digits
    }
    return std::string(b);
  };
  const double a = std::fabs(v);
  switch (u) {
    case Unit::percent: return scaled(0.01, "%");
    case Unit::bytes:
      if (a >= 1024.0 * 1024 * 1024) return scaled(1024.0 * 1024 * 1024, " GiB");
      if (a >= 1024.0 * 1024) return scaled(1024.0 * 1024, " MiB");
      if (a >= 1024.0) return scaled(1024.0, " KiB");
      return fmt("%.0f B", v);
    case Unit::count:
      if (a >= 1e9) return scaled(1e9, "G");
      if (a >= 1e6) return scaled(1e6, "M");
      if (a >= 1e3) return scaled(1e3, "k");
      return scaled(1, "");
    case Unit::ms: return scaled(1, " ms");
    case Unit::plain:
      if (v != 0 && (a < 1e-3 || a >= 1e6)) return fmt("%.2e", v);
      return scaled(1, "");
  }
  return fmt("%g", v);
}

// ---- reading runs -------------------------------------------------------------------------------

using Curve = std::map<double, double>;  // step -> value; a later record for a step wins (resume)

struct Run {
  std::string label;
  std::string path;                      // the log.jsonl read
  std::map<std::string, Curve> curves;   // "loss", "eval_loss", "tokens_per_s", "mfu", ...
  std::map<std::string, Curve> memory;   // tier name -> bytes per step
  std::map<double, json> profile;        // step -> profile record
  std::string model;                     // from the config record, when there is one
  std::string mfu_formula, seed_formula;  // the strict count and the seed's
  std::size_t records = 0, bad_lines = 0;
};

std::optional<double> number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;  // null: a NaN or Inf logged
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

/// Series from a `mem` / `memory` object: name -> bytes, name -> {"current"|"bytes"|"used": bytes},
/// or nested groups. The statistics adaptor's JSON ({"all": {...}, "tiers": {"hbm": {...}},
/// "classes": {...}}) gives "all" and one series per tier; per-class series are left out (too
/// many charts for what they tell).
void read_memory_object(const json& o, const std::string& prefix, double step,
                        std::map<std::string, Curve>& out, int depth) {
  for (const auto& [name, v] : o.items()) {
    if (name == "classes") continue;
    const std::string full = prefix.empty() || prefix == "tiers" ? name : prefix + "." + name;
    std::optional<double> b;
    if (v.is_number()) {
      b = v.get<double>();
    } else if (v.is_object()) {
      for (const char* inner : {"current", "bytes", "used"}) {
        if ((b = number(v, inner))) break;
      }
      if (!b && depth < 2) read_memory_object(v, full, step, out, depth + 1);
    }
    if (b && std::isfinite(*b)) out[full][step] = *b;
  }
}

/// Bytes per memory tier from a step record: `<name>_bytes` numbers, and `mem` / `memory`
/// objects (read_memory_object).
void read_memory(const json& r, double step, std::map<std::string, Curve>& out) {
  for (const auto& [k, v] : r.items()) {
    constexpr std::string_view suffix = "_bytes";
    if (v.is_number() && k.size() > suffix.size() && k.ends_with(suffix)) {
      const double b = v.get<double>();
      if (std::isfinite(b)) out[k.substr(0, k.size() - suffix.size())][step] = b;
    }
  }
  for (const char* key : {"mem", "memory"}) {
    const auto it = r.find(key);
    if (it != r.end() && it->is_object()) read_memory_object(*it, "", step, out, 0);
  }
}

Run read_run(const std::string& arg) {
  Run run;
  fs::path p(arg);
  fs::path dir = p;
  if (fs::is_directory(p)) {
    p /= "log.jsonl";
  } else {
    dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  }
  std::ifstream in(p);
  // A run directory with only profile.json (a benchmark that kept the breakdown, not the log)
  // still gives the throughput, MFU, breakdown and memory charts.
  const fs::path prof = dir / "profile.json";
  if (!in && !fs::exists(prof)) {
    throw ght::io_error(p.string() + ": cannot open (a RUN is a run directory, with log.jsonl or profile.json, or its log.jsonl)");
  }
  run.path = in ? p.string() : prof.string();
  run.label = fs::weakly_canonical(dir).filename().string();
  if (run.label.empty()) run.label = dir.string();

  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A run killed mid-write can leave a torn last line; skip what does not parse.
    if (r.is_discarded() || !r.is_object()) {
      ++run.bad_lines;
      continue;
    }
    ++run.records;
    const std::string type = r.value("type", "");
    const std::optional<double> step = number(r, "step");
    if (type == "step" && step) {
      for (const char* k : {"loss", "grad_norm", "lr", "tokens_per_s", "mfu", "mfu_seed"}) {
        if (const auto v = number(r, k)) run.curves[k][*step] = *v;
      }
      read_memory(r, *step, run.memory);
    } else if (type == "eval" && step) {
      if (const auto v = number(r, "eval_loss")) run.curves["eval_loss"][*step] = *v;
    } else if (type == "profile" && step) {
      run.profile[*step] = r;
      read_memory(r, *step, run.memory);
    } else if (type == "memory" && step) {
      read_memory(r, *step, run.memory);
    } else if (type == "config") {
      const auto c = r.find("config");
      if (c != r.end() && c->is_object()) {
        const auto m = c->find("model");
        if (m != c->end() && m->is_string()) run.model = m->get<std::string>();
        if (m != c->end() && m->is_object() && m->contains("name") && (*m)["name"].is_string()) {
          run.model = (*m)["name"].get<std::string>();
        }
        const auto t = c->find("train");
        if (!run.model.empty() && t != c->end() && t->is_object() && t->contains("backend") &&
            (*t)["backend"].is_string()) {
          run.model += " (" + (*t)["backend"].get<std::string>() + ")";
        }
      }
    } else if (type == "mfu_formula" && r.contains("formula") && r["formula"].is_string()) {
      run.mfu_formula = r["formula"].get<std::string>();
      if (r.contains("seed_formula") && r["seed_formula"].is_string()) {
        run.seed_formula = r["seed_formula"].get<std::string>();
      }
    }
  }
  // profile.json holds the first N steps' breakdowns; log.jsonl's own profile records win, and
  // so do its step records' throughput and MFU.
  if (fs::exists(prof)) {
    std::ifstream pin(prof);
    const json pj = json::parse(pin, nullptr, false);
    const bool log_memory = !run.memory.empty();
    if (!pj.is_discarded() && pj.contains("steps") && pj["steps"].is_array()) {
      for (const json& s : pj["steps"]) {
        const auto st = s.is_object() ? number(s, "step") : std::nullopt;
        if (!st) continue;
        run.profile.emplace(*st, s);
        for (const char* k : {"tokens_per_s", "mfu", "mfu_seed"}) {
          if (const auto v = number(s, k)) run.curves[k].emplace(*st, *v);
        }
        if (!log_memory) read_memory(s, *st, run.memory);
      }
    }
    if (run.mfu_formula.empty() && pj.is_object() && pj.contains("formula") && pj["formula"].is_string()) {
      run.mfu_formula = pj["formula"].get<std::string>();
    }
    if (run.seed_formula.empty() && pj.is_object() && pj.contains("seed_formula") && pj["seed_formula"].is_string()) {
      run.seed_formula = pj["seed_formula"].get<std::string>();
    }
  }
  return run;
}

// ---- SVG line charts ----------------------------------------------------------------------------

// Tableau 10: distinguishable, and readable for the common colour-vision deficiencies.
constexpr std::array<const char*, 10> kColors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* color_of(std::size_t run) { return kColors[run % kColors.size()]; }

struct Line {
  std::size_t run;  // index, for colour and legend
  std::vector<std::pair<double, double>> pts;
};

struct Chart {
  std::string id, title, y_label;
  Unit unit = Unit::plain;
  bool zero_based = false;  // y axis from 0 (rates, bytes), not from the data's minimum
  std::vector<Line> lines;
};

/// Round numbers for an axis from lo to hi: spacing 1, 2 or 5 times a power of ten.
std::vector<double> nice_ticks(double lo, double hi, int target, double* step_out) {
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  *step_out = step;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

/// At most `max_points`, as means of equal runs of points: a 100k-step run stays a small file.
std::vector<std::pair<double, double>> thin(const Curve& c, std::size_t max_points) {
  std::vector<std::pair<double, double>> pts(c.begin(), c.end());
  if (pts.size() <= max_points) return pts;
  std::vector<std::pair<double, double>> out;
  const double per = static_cast<double>(pts.size()) / static_cast<double>(max_points);
  for (std::size_t b = 0; b < max_points; ++b) {
    const auto i0 = static_cast<std::size_t>(static_cast<double>(b) * per);
    const auto i1 = std::max(i0 + 1, static_cast<std::size_t>(static_cast<double>(b + 1) * per));
    double x = 0, y = 0;
    for (std::size_t i = i0; i < i1; ++i) {
      x += pts[i].first;
      y += pts[i].second;
    }
    out.emplace_back(x / static_cast<double>(i1 - i0), y / static_cast<double>(i1 - i0));
  }
  return out;
}

std::string line_chart_svg(const Chart& c, const std::vector<Run>& runs) {
  constexpr double W = 760, H = 330, L = 78, R = 20, T = 34, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Line& l : c.lines) {
    for (const auto& [x, y] : l.pts) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (c.zero_based) y0 = std::min(y0, 0.0), y1 = std::max(y1, 0.0);
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) {
    const double d = y0 != 0 ? std::fabs(y0) * 0.1 : 1.0;
    y0 -= d, y1 += d;
  } else {
    const double pad = (y1 - y0) * 0.05;
    y1 += pad;
    if (!(c.zero_based && y0 >= 0)) y0 -= pad;
  }
  // Coordinates to a tenth of a pixel: a smaller file, and the same picture.
  const auto sx = [&](double x) { return std::round((L + (x - x0) / (x1 - x0) * pw) * 10) / 10; };
  const auto sy = [&](double y) { return std::round((T + ph - (y - y0) / (y1 - y0) * ph) * 10) / 10; };

  // Legend rows under the x-axis label, wrapped by an estimate of the text width.
  std::vector<std::vector<std::size_t>> rows(1);
  double used = 0;
  for (const Line& l : c.lines) {
    const double w = 28 + 7.0 * static_cast<double>(runs[l.run].label.size());
    if (used + w > pw && !rows.back().empty()) rows.emplace_back(), used = 0;
    rows.back().push_back(l.run);
    used += w;
  }
  const double height = H + 18.0 * static_cast<double>(rows.size());

  std::ostringstream s;
  s << "<svg class=\"line-chart\" data-chart=\"" << esc(c.id) << "\" width=\"" << W << "\" height=\""
    << height << "\" viewBox=\"0 0 " << W << " " << height << "\" role=\"img\">\n";
  s << "<title>" << esc(c.title) << "</title>\n";
  s << "<text class=\"chart-title\" x=\"" << L << "\" y=\"20\">" << esc(c.title) << "</text>\n";
  s << "<rect class=\"plot\" x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph << "\"/>\n";
  double step = 0;
  // Byte axes tick at round numbers of one binary unit (0, 2, 4 GiB), not of bytes (2e9 B is
  // 1.86 GiB, which a "2 GiB" label would misstate).
  double unit_div = 1;
  const char* unit_name = "";
  if (c.unit == Unit::bytes) {
    const double top = std::max(std::fabs(y0), std::fabs(y1));
    for (const auto& [div, name] : {std::pair{1024.0 * 1024 * 1024, "GiB"}, std::pair{1024.0 * 1024, "MiB"},
                                    std::pair{1024.0, "KiB"}, std::pair{1.0, "B"}}) {
      unit_div = div, unit_name = name;
      if (top >= div) break;
    }
  }
  for (double t : nice_ticks(y0 / unit_div, y1 / unit_div, 5, &step)) {
    const double v = t * unit_div;
    const double y = sy(v);
    const std::string label = c.unit == Unit::bytes
                                  ? format_value(t, Unit::plain, step) + " " + unit_name
                                  : format_value(v, c.unit, step);
    s << "<line class=\"grid\" x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << L + pw << "\" y2=\"" << y << "\"/>";
    s << "<text class=\"tick\" x=\"" << L - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << esc(label)
      << "</text>\n";
  }
  for (double v : nice_ticks(x0, x1, 8, &step)) {
    if (step < 1 && std::fabs(v - std::round(v)) > 1e-9) continue;  // steps are whole numbers
    const double x = sx(v);
    s << "<line class=\"grid\" x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << T + ph << "\"/>";
    s << "<text class=\"tick\" x=\"" << x << "\" y=\"" << T + ph + 16 << "\" text-anchor=\"middle\">"
      << esc(format_value(v, Unit::count, std::max(step, 1.0))) << "</text>\n";
  }
  s << "<text class=\"axis-label\" x=\"" << L + pw / 2 << "\" y=\"" << T + ph + 36
    << "\" text-anchor=\"middle\">step</text>\n";
  s << "<text class=\"axis-label\" transform=\"translate(16 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << esc(c.y_label) << "</text>\n";
  for (const Line& l : c.lines) {
    const char* col = color_of(l.run);
    s << "<polyline class=\"series\" data-run=\"" << esc(runs[l.run].label) << "\" stroke=\"" << col
      << "\" points=\"";
    for (const auto& [x, y] : l.pts) s << fmt("%.1f", sx(x)) << "," << fmt("%.1f", sy(y)) << " ";
    s << "\"><title>" << esc(runs[l.run].label) << "</title></polyline>\n";
    // Few points (eval losses, short runs): mark them, a lone point draws no line.
    if (l.pts.size() <= 40) {
      for (const auto& [x, y] : l.pts) {
        s << "<circle class=\"marker\" cx=\"" << fmt("%.1f", sx(x)) << "\" cy=\"" << fmt("%.1f", sy(y))
          << "\" r=\"2.5\" fill=\"" << col << "\"><title>" << esc(runs[l.run].label) << ": step "
          << fmt("%.0f", x) << ", " << esc(format_value(y, c.unit)) << "</title></circle>";
      }
      s << "\n";
    }
  }
  s << "<g class=\"legend\">";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    double x = L;
    const double y = H + 18.0 * static_cast<double>(r) - 4;
    for (std::size_t run : rows[r]) {
      s << "<line x1=\"" << x << "\" y1=\"" << y - 4 << "\" x2=\"" << x + 18 << "\" y2=\"" << y - 4
        << "\" stroke=\"" << color_of(run) << "\" stroke-width=\"3\"/>";
      s << "<text x=\"" << x + 22 << "\" y=\"" << y << "\">" << esc(runs[run].label) << "</text>";
      x += 28 + 7.0 * static_cast<double>(runs[run].label.size());
    }
  }
  s << "</g>\n</svg>\n";
  return s.str();
}

/// A chart's figure: the SVG, or a note when no run has the data.
std::string figure(const Chart& c, const std::vector<Run>& runs, const std::string& missing) {
  std::string s = "<figure class=\"chart\" id=\"" + esc(c.id) + "\">\n";
  if (c.lines.empty()) {
    s += "<h3>" + esc(c.title) + "</h3>\n<p class=\"note\">" + esc(missing) + "</p>\n";
  } else {
    s += line_chart_svg(c, runs);
    std::string absent;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const bool has = std::any_of(c.lines.begin(), c.lines.end(), [&](const Line& l) { return l.run == r; });
      if (!has) absent += (absent.empty() ? "" : ", ") + runs[r].label;
    }
    if (!absent.empty()) s += "<figcaption class=\"note\">No data in: " + esc(absent) + "</figcaption>\n";
  }
  return s + "</figure>\n";
}

Chart curve_chart(const std::vector<Run>& runs, const std::string& key, std::string title,
                  std::string y_label, Unit unit, bool zero_based) {
  Chart c{key, std::move(title), std::move(y_label), unit, zero_based, {}};
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto it = runs[r].curves.find(key);
    if (it != runs[r].curves.end() && !it->second.empty()) c.lines.push_back({r, thin(it->second, 1500)});
  }
  return c;
}

// ---- step breakdown -----------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// Median of every numeric *_ms field over a run's profiled steps, leaving out the first step
/// (warm-up: allocation, autotuning) when there are others; the plan's predicted phases as
/// "predicted <field>".
std::map<std::string, double> phase_medians(const Run& run) {
  std::map<std::string, std::vector<double>> vals;
  bool first = true;
  for (const auto& [step, rec] : run.profile) {
    if (first && run.profile.size() > 1) {
      first = false;
      continue;
    }
    first = false;
    for (const auto& [k, v] : rec.items()) {
      if (k.ends_with("_ms") && v.is_number() && std::isfinite(v.get<double>())) vals[k].push_back(v.get<double>());
    }
    // The plan's prediction of each phase, beside the measured one (ght train's "predicted").
    if (const auto p = rec.find("predicted"); p != rec.end() && p->is_object()) {
      for (const auto& [k, v] : p->items()) {
        if (k.ends_with("_ms") && v.is_number() && std::isfinite(v.get<double>())) {
          vals["predicted " + k].push_back(v.get<double>());
        }
      }
    }
  }
  std::map<std::string, double> m;
  for (auto& [k, v] : vals) m[k] = median(std::move(v));
  return m;
}

std::string breakdown_section(const std::vector<Run>& runs) {
  std::vector<std::map<std::string, double>> med;
  std::vector<std::string> keys;  // every *_ms field in any run, the stacked phases first
  const std::vector<std::string> phases = {"forward_ms", "backward_ms", "opt_exposed_ms"};
  bool any = false;
  for (const Run& r : runs) {
    med.push_back(phase_medians(r));
    any = any || !med.back().empty();
    for (const auto& [k, v] : med.back()) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
  }
  std::string s = "<section id=\"breakdown\">\n<h2>Step breakdown</h2>\n";
  if (!any) {
    return s + "<p class=\"note\">No \"profile\" records in log.jsonl and no profile.json in these runs "
               "(the CUDA trainer writes them).</p>\n</section>\n";
  }
  std::sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    const auto ia = std::find(phases.begin(), phases.end(), a), ib = std::find(phases.begin(), phases.end(), b);
    if (ia != ib) return ia < ib;
    return a < b;
  });
  s += "<p>Medians over profiled steps, the first (warm-up) step left out. The bar stacks forward, "
       "backward, exposed optimizer time (stall + gap) and the rest of the step's wall time.</p>\n";

  // Stacked bars: one per run with profile data, on one time axis.
  const std::vector<std::pair<std::string, const char*>> parts = {
      {"forward", "#4e79a7"}, {"backward", "#f28e2b"}, {"opt exposed", "#e15759"}, {"other", "#bab0ac"}};
  std::vector<std::pair<std::size_t, std::array<double, 4>>> bars;
  double longest = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto get = [&](const char* k) {
      const auto it = med[r].find(k);
      return it == med[r].end() || !std::isfinite(it->second) ? 0.0 : std::max(0.0, it->second);
    };
    std::array<double, 4> v = {get("forward_ms"), get("backward_ms"), get("opt_exposed_ms"), 0};
    const double wall = get("wall_ms");
    v[3] = std::max(0.0, wall - v[0] - v[1] - v[2]);
    const double total = v[0] + v[1] + v[2] + v[3];
    if (total <= 0) continue;
    bars.push_back({r, v});
    longest = std::max(longest, total);
  }
  if (!bars.empty()) {
    constexpr double W = 760, L = 160, R = 30, bar_h = 22, gap = 10, T = 34;
    const double pw = W - L - R;
    const double height = T + static_cast<double>(bars.size()) * (bar_h + gap) + 60;
    std::ostringstream g;
    g << "<figure class=\"chart\" id=\"breakdown-bars\">\n<svg class=\"bar-chart\" data-chart=\"breakdown\" width=\""
      << W << "\" height=\"" << height << "\" viewBox=\"0 0 " << W << " " << height << "\" role=\"img\">\n"
      << "<title>Step breakdown (median ms)</title>\n<text class=\"chart-title\" x=\"" << L
      << "\" y=\"20\">Step breakdown (median ms per step)</text>\n";
    double step = 0;
    const auto ticks = nice_ticks(0, longest * 1.02, 6, &step);
    const double xmax = std::max(longest * 1.02, ticks.empty() ? 1.0 : ticks.back());
    const double axis_y = T + static_cast<double>(bars.size()) * (bar_h + gap);
    for (double v : ticks) {
      const double x = L + v / xmax * pw;
      g << "<line class=\"grid\" x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << axis_y << "\"/>"
        << "<text class=\"tick\" x=\"" << x << "\" y=\"" << axis_y + 16 << "\" text-anchor=\"middle\">"
        << esc(format_value(v, Unit::ms, step)) << "</text>\n";
    }
    for (std::size_t i = 0; i < bars.size(); ++i) {
      const auto& [r, v] = bars[i];
      const double y = T + static_cast<double>(i) * (bar_h + gap);
      g << "<text class=\"tick\" x=\"" << L - 8 << "\" y=\"" << y + bar_h / 2 + 4 << "\" text-anchor=\"end\">"
        << esc(runs[r].label) << "</text>";
      double x = L;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const double w = v[p] / xmax * pw;
        if (w <= 0) continue;
        g << "<rect class=\"segment\" data-run=\"" << esc(runs[r].label) << "\" data-phase=\"" << parts[p].first
          << "\" x=\"" << fmt("%.1f", x) << "\" y=\"" << y << "\" width=\"" << fmt("%.1f", w) << "\" height=\""
          << bar_h << "\" fill=\"" << parts[p].second << "\"><title>" << esc(runs[r].label) << ": "
          << parts[p].first << " " << fmt("%.2f", v[p]) << " ms</title></rect>";
        x += w;
      }
      g << "\n";
    }
    g << "<g class=\"legend\">";
    double x = L;
    for (const auto& [name, col] : parts) {
      g << "<rect x=\"" << x << "\" y=\"" << axis_y + 30 << "\" width=\"14\" height=\"10\" fill=\"" << col
        << "\"/><text x=\"" << x + 18 << "\" y=\"" << axis_y + 39 << "\">" << name << "</text>";
      x += 30 + 7.0 * static_cast<double>(name.size());
    }
    g << "</g>\n</svg>\n</figure>\n";
    s += g.str();
  }

  s += "<table class=\"breakdown\">\n<tr><th>run</th><th>profiled steps</th>";
  for (const std::string& k : keys) s += "<th>" + esc(k) + "</th>";
  s += "</tr>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    s += "<tr><td>" + esc(runs[r].label) + "</td><td>" + std::to_string(runs[r].profile.size()) + "</td>";
    for (const std::string& k : keys) {
      const auto it = med[r].find(k);
      s += "<td>" + (it == med[r].end() || !std::isfinite(it->second) ? std::string("&ndash;") : fmt("%.2f", it->second)) +
           "</td>";
    }
    s += "</tr>\n";
  }
  return s + "</table>\n</section>\n";
}

// ---- the page -----------------------------------------------------------------------------------

constexpr const char* kStyle = R"(body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1600px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:14px}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #e3e3e3;padding:6px;background:#fff}
svg text{font-size:11px;fill:#333}svg .chart-title{font-size:13px;font-weight:600}
svg .plot{fill:none;stroke:#999}svg .grid{stroke:#eee}svg .series{fill:none;stroke-width:1.6}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.note{color:#777;font-size:12px}code{font-size:12px}
)";

std::string summary_table(const std::vector<Run>& runs) {
  std::string s =
      "<table class=\"runs\">\n<tr><th>run</th><th>log</th><th>model</th><th>steps</th><th>last loss</th>"
      "<th>best eval loss</th><th>median tokens/s</th><th>median MFU</th><th>median MFU (seed's count)</th></tr>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    const auto curve = [&](const char* k) -> const Curve* {
      const auto it = run.curves.find(k);
      return it == run.curves.end() || it->second.empty() ? nullptr : &it->second;
    };
    const auto med = [&](const char* k, Unit u) {
      const Curve* c = curve(k);
      if (c == nullptr) return std::string("&ndash;");
      std::vector<double> v;
      for (const auto& [x, y] : *c) v.push_back(y);
      return esc(format_value(median(v), u));
    };
    std::string best = "&ndash;";
    if (const Curve* e = curve("eval_loss")) {
      double b = INFINITY;
      for (const auto& [x, y] : *e) b = std::min(b, y);
      best = fmt("%.4f", b);
    }
    const Curve* loss = curve("loss");
    s += "<tr><td><span style=\"color:" + std::string(color_of(r)) + "\">&#9632;</span> " + esc(run.label) +
         "</td><td><code>" + esc(run.path) + "</code></td><td>" + (run.model.empty() ? "&ndash;" : esc(run.model)) +
         "</td><td>" + (loss ? fmt("%.0f", loss->rbegin()->first) : "&ndash;") + "</td><td>" +
         (loss ? fmt("%.4f", loss->rbegin()->second) : "&ndash;") + "</td><td>" + best + "</td><td>" +
         med("tokens_per_s", Unit::count) + "</td><td>" + med("mfu", Unit::percent) + "</td><td>" +
         med("mfu_seed", Unit::percent) + "</td></tr>\n";
  }
  return s + "</table>\n";
}

std::string render(const std::vector<Run>& runs) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>ght report: ";
  for (std::size_t r = 0; r < runs.size(); ++r) s += (r ? ", " : "") + esc(runs[r].label);
  s += "</title>\n<style>\n" + std::string(kStyle) + "</style>\n</head>\n<body>\n<h1>ght report</h1>\n";
  s += summary_table(runs);
  for (const Run& r : runs) {
    if (r.bad_lines > 0) {
      s += "<p class=\"note\">" + esc(r.path) + ": " + std::to_string(r.bad_lines) +
           " line(s) that are not JSON objects were skipped (a torn last line of a killed run?).</p>\n";
    }
    if (!r.mfu_formula.empty()) s += "<p class=\"note\">" + esc(r.label) + " MFU: " + esc(r.mfu_formula) + "</p>\n";
    if (!r.seed_formula.empty()) s += "<p class=\"note\">" + esc(r.label) + ": " + esc(r.seed_formula) + "</p>\n";
  }

  s += "<section id=\"training\">\n<h2>Training</h2>\n<div class=\"charts\">\n";
  s += figure(curve_chart(runs, "loss", "Training loss", "loss (nats/token)", Unit::plain, false), runs,
              "No step records with a loss.");
  s += figure(curve_chart(runs, "eval_loss", "Eval loss", "eval loss (nats/token)", Unit::plain, false), runs,
              "No eval records (train.eval_every = 0?).");
  s += figure(curve_chart(runs, "grad_norm", "Gradient norm", "global grad norm", Unit::plain, true), runs,
              "No gradient norms logged.");
  s += figure(curve_chart(runs, "lr", "Learning rate", "lr", Unit::plain, true), runs, "No learning rates logged.");
  s += "</div>\n</section>\n";

  s += "<section id=\"speed\">\n<h2>Speed</h2>\n<div class=\"charts\">\n";
  s += figure(curve_chart(runs, "tokens_per_s", "Tokens/s", "tokens/s", Unit::count, true), runs,
              "No tokens/s logged.");
  s += figure(curve_chart(runs, "mfu", "MFU", "MFU (% of 989.4 TFLOP/s)", Unit::percent, true), runs,
              "No MFU in these runs (the CPU backend does not report it).");
  s += "</div>\n</section>\n";

  s += breakdown_section(runs);

  s += "<section id=\"memory\">\n<h2>Memory per tier</h2>\n";
  std::vector<std::string> tiers;
  for (const Run& r : runs) {
    for (const auto& [name, c] : r.memory) {
      if (std::find(tiers.begin(), tiers.end(), name) == tiers.end()) tiers.push_back(name);
    }
  }
  if (tiers.empty()) {
    s += "<p class=\"note\">No per-tier bytes in these runs' step records (fields <code>&lt;tier&gt;_bytes</code>, or a "
         "<code>mem</code> / <code>memory</code> object of name &rarr; bytes).</p>\n";
  } else {
    s += "<div class=\"charts\">\n";
    for (const std::string& t : tiers) {
      Chart c{"mem-" + t, "Memory: " + t, t + " bytes", Unit::bytes, true, {}};
      for (std::size_t r = 0; r < runs.size(); ++r) {
        const auto it = runs[r].memory.find(t);
        if (it != runs[r].memory.end() && !it->second.empty()) c.lines.push_back({r, thin(it->second, 1500)});
      }
      s += figure(c, runs, "");
    }
    s += "</div>\n";
  }
  s += "</section>\n";
  s += "<p class=\"note\">Written by <code>ght report</code>. Resumed runs append to log.jsonl; for a step logged "
       "twice the later record is shown. Curves longer than 1500 points are drawn as means of equal runs of steps.</p>\n";
  return s + "</body>\n</html>\n";
}

// ---- the command --------------------------------------------------------------------------------

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out = "report.html";
};

void setup(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  auto* c = app.add_subcommand(
      "report", "Write one self-contained HTML page (inline SVG, no network) comparing training runs: "
                "loss, eval, tokens/s, MFU, step breakdown, memory per tier");
  c->add_option("RUN", args->runs, "Run directories (holding log.jsonl), or log.jsonl files")->required();
  c->add_option("--out,-o", args->out, "The HTML file to write")->capture_default_str();
  c->callback([args] {
    std::vector<Run> runs;
    for (const std::string& r : args->runs) runs.push_back(read_run(r));
    // Two runs named alike (a/run, b/run) get their paths as labels, so the legend tells them apart.
    for (std::size_t i = 0; i < runs.size(); ++i) {
      for (std::size_t j = 0; j < runs.size(); ++j) {
        if (i != j && runs[i].label == runs[j].label) {
          runs[i].label = fs::path(args->runs[i]).string();
          break;
        }
      }
    }
    for (const Run& r : runs) {
      if (r.curves.empty() && r.profile.empty() && r.memory.empty()) {
        std::fprintf(stderr, "ght report: warning: %s has no step, eval or profile records\n", r.path.c_str());
      }
    }
    const std::string html = render(runs);
    const fs::path out(args->out);
    if (out.has_parent_path()) fs::create_directories(out.parent_path());
    {
      std::ofstream f(out, std::ios::binary | std::ios::trunc);
      if (!f) throw ght::io_error(args->out + ": cannot open for writing");
      f.write(html.data(), static_cast<std::streamsize>(html.size()));
      if (!f) throw ght::io_error(args->out + ": write failed");
    }
    std::printf("wrote %s (%zu run%s, %zu bytes)\n", args->out.c_str(), runs.size(), runs.size() == 1 ? "" : "s",
                html.size());
  });
}

}  // namespace

GHT_REGISTER_COMMAND(report, setup);
