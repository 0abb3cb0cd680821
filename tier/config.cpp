#include "tier/config.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <toml.hpp>
#include <utility>

#include "tier/error.hpp"

extern char** environ;

namespace ght::config {

namespace {

// ---- small text helpers -----------------------------------------------------------------------

char to_lower_ascii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
char to_upper_ascii(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c; }

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), to_lower_ascii);
  return r;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (to_lower_ascii(a[i]) != to_lower_ascii(b[i])) return false;
  }
  return true;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Surrounding blanks are forgiven (a quoted "1G " in a shell script is not a real mistake); any
// other stray character is rejected by the parsers.
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

[[noreturn]] void fail(std::string_view name, std::string_view text, std::string_view what,
                       std::string_view accepted) {
  std::string msg;
  msg.append(name).append("=").append(text).append(": ").append(what);
  if (!accepted.empty()) msg.append(" (accepted: ").append(accepted).append(")");
  throw config_error(msg);
}

constexpr std::string_view kBoolForms = "1/0, true/false, yes/no, on/off";
constexpr std::string_view kSizeForms =
    "bytes with optional suffix K/M/G/T, KB/MB/GB/TB, KiB/MiB/GiB/TiB, decimals like 1.5T, or NN%";

// "; did you mean X?" when X is plausibly a typo of `name`, else a pointer to the full list.
std::string suggestion(std::string_view name, bool short_form) {
  const std::string_view best = nearest_option(name);
  const std::string_view probe = short_form ? best.substr(4) : best;
  const std::size_t d = edit_distance(name, probe);
  if (!best.empty() && d <= std::max<std::size_t>(2, name.size() / 3)) {
    return "; did you mean " + (short_form ? lower(probe) : std::string(best)) + "?";
  }
  return "; `ght config` lists every option";
}

// Splits a "lo:hi" range; an ill-formed range in config_options.inc is a programming error.
std::pair<std::string_view, std::string_view> split_range(std::string_view range) {
  const auto colon = range.find(':');
  GHT_EXPECTS(colon != std::string_view::npos, "ill-formed option range '" + std::string(range) + "'");
  return {range.substr(0, colon), range.substr(colon + 1)};
}

std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// ---- the option table --------------------------------------------------------------------------

const std::string_view kTypeNames[] = {"bool", "size", "int", "float", "enum", "string"};
const std::string_view kSourceNames[] = {"default", "plan", "file", "env", "flag"};

std::string describe_type(const OptionSpec& o) {
  switch (o.type) {
    case Type::Enum: return "enum: " + std::string(o.choices);
    case Type::Int:
    case Type::Float: {
      if (o.choices.empty()) return std::string(to_string(o.type));
      const auto [lo, hi] = split_range(o.choices);
      return std::string(to_string(o.type)) + " [" + std::string(lo) + ", " + std::string(hi) + "]";
    }
    case Type::Size: {
      std::string d(to_string(o.type));
      if (!o.choices.empty()) {
        const auto [lo, hi] = split_range(o.choices);
        d += " [" + std::string(lo) + ", " + std::string(hi) + "]";
      }
      if (o.default_text.empty()) d += " or empty";
      return d;
    }
    default: return std::string(to_string(o.type));
  }
}

std::string display(std::string_view text) { return text.empty() ? std::string("\"\"") : std::string(text); }

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (to_upper_ascii(a[i - 1]) == to_upper_ascii(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string_view to_string(Type t) noexcept { return kTypeNames[static_cast<int>(t)]; }
std::string_view to_string(Source s) noexcept { return kSourceNames[static_cast<int>(s)]; }

const std::vector<OptionSpec>& options() {
  static const std::vector<OptionSpec> table = {
#define GHT_OPTION(name, type, def, choices, doc, short_doc) \
  OptionSpec{Key::name, #name, Type::type, def, choices, doc, short_doc},
#include "tier/config_options.inc"
#undef GHT_OPTION
  };
  return table;
}

const OptionSpec* find_option(std::string_view name) {
  for (const auto& o : options()) {
    if (iequals(o.name, name)) return &o;
  }
  return nullptr;
}

std::string_view nearest_option(std::string_view name) {
  std::string_view best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  // Compare like with like: a short TOML key ("hbm_budgt") against the short option names.
  const bool short_form = !(name.size() >= 4 && iequals(name.substr(0, 4), "GHT_"));
  for (const auto& o : options()) {
    const std::size_t d = edit_distance(name, short_form ? o.name.substr(4) : o.name);
    if (d < best_d) {
      best_d = d;
      best = o.name;
    }
  }
  return best;
}

// ---- parsers -----------------------------------------------------------------------------------

std::uint64_t SizeValue::resolve(std::uint64_t capacity, std::string_view name) const {
  if (!fraction) return bytes;
  const std::string who = name.empty() ? std::string("size") : std::string(name);
  if (capacity == 0) {
    throw config_error(who + "=" + shortest(*fraction * 100.0) +
                       "%: a percentage needs a known capacity, but the capacity is 0 (unknown)");
  }
  // Computed in long double and clamped: fraction <= 1, but a capacity near 2^64 rounds up in
  // floating point and converting an out-of-range value back to an integer would be undefined.
  const long double r = static_cast<long double>(*fraction) * static_cast<long double>(capacity);
  if (!(r < static_cast<long double>(capacity))) return capacity;
  return r <= 0 ? 0 : static_cast<std::uint64_t>(r);
}

bool parse_bool(std::string_view name, std::string_view text) {
  const std::string v = lower(trim(text));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  fail(name, text, v.empty() ? "empty value, expected a boolean" : "not a boolean", kBoolForms);
}

SizeValue parse_size(std::string_view name, std::string_view text) {
  const std::string_view s = trim(text);
  if (s.empty()) return SizeValue{};  // "auto": the caller checks Registry::is_empty()
  if (s.front() == '-') fail(name, text, "negative size", kSizeForms);
  std::size_t i = 0;
  if (s.front() == '+') ++i;
  // Mantissa: digits [ '.' digits ]; at least one digit overall.
  const std::size_t int_begin = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  const std::string_view int_digits = s.substr(int_begin, i - int_begin);
  std::string_view frac_digits;
  if (i < s.size() && s[i] == '.') {
    const std::size_t fb = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    frac_digits = s.substr(fb, i - fb);
  }
  if (int_digits.empty() && frac_digits.empty()) fail(name, text, "not a size", kSizeForms);
  std::size_t j = i;
  while (j < s.size() && is_space(s[j])) ++j;
  const std::string suffix = lower(s.substr(j));

  if (suffix == "%") {
    const std::string num(s.substr(int_begin, i - int_begin));
    double pct = 0;
    const auto r = std::from_chars(num.data(), num.data() + num.size(), pct);
    if (r.ec != std::errc() || r.ptr != num.data() + num.size() || !std::isfinite(pct)) {
      fail(name, text, "not a percentage", "NN% with 0 < NN <= 100");
    }
    if (!(pct > 0.0 && pct <= 100.0)) {
      fail(name, text, "percentage out of range", "NN% with 0 < NN <= 100");
    }
    SizeValue v;
    v.fraction = pct / 100.0;
    return v;
  }

  std::uint64_t mult = 0;
  static const std::pair<std::string_view, std::uint64_t> kSuffixes[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ULL << 10},
      {"m", 1ULL << 20},
      {"g", 1ULL << 30},
      {"t", 1ULL << 40},
      {"kib", 1ULL << 10},
      {"mib", 1ULL << 20},
      {"gib", 1ULL << 30},
      {"tib", 1ULL << 40},
      {"kb", 1000ULL},
      {"mb", 1000ULL * 1000},
      {"gb", 1000ULL * 1000 * 1000},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
  };
  for (const auto& [sfx, m] : kSuffixes) {
    if (suffix == sfx) mult = m;
  }
  if (mult == 0) fail(name, text, "not a size", kSizeForms);

  // Integer part, exactly, with overflow detection.
  std::uint64_t whole = 0;
  for (const char c : int_digits) {
    if (__builtin_mul_overflow(whole, std::uint64_t{10}, &whole) ||
        __builtin_add_overflow(whole, static_cast<std::uint64_t>(c - '0'), &whole)) {
      fail(name, text, "size overflows 2^64-1 bytes", kSizeForms);
    }
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, mult, &bytes)) {
    fail(name, text, "size overflows 2^64-1 bytes", kSizeForms);
  }
  // Fractional part: digits beyond 18 are below a byte even at TiB scale, so they are dropped;
  // the product fits in 128 bits (10^18 * 2^40 < 2^100).
  const std::string_view fd = frac_digits.substr(0, std::min<std::size_t>(frac_digits.size(), 18));
  unsigned __int128 num = 0, den = 1;
  for (const char c : fd) {
    num = num * 10 + static_cast<unsigned>(c - '0');
    den *= 10;
  }
  const unsigned __int128 frac_scaled = num * mult;
  if (mult == 1 && frac_scaled != 0) {
    fail(name, text, "fractional bytes", kSizeForms);
  }
  const auto frac_bytes = static_cast<std::uint64_t>(frac_scaled / den);  // floor; < mult
  if (__builtin_add_overflow(bytes, frac_bytes, &bytes)) {
    fail(name, text, "size overflows 2^64-1 bytes", kSizeForms);
  }
  SizeValue v;
  v.bytes = bytes;
  return v;
}

SizeValue parse_size(std::string_view name, std::string_view text, std::string_view range,
                     bool allow_empty) {
  std::string accepted(kSizeForms);
  std::uint64_t lo = 0, hi = std::numeric_limits<std::uint64_t>::max();
  if (!range.empty()) {
    const auto [lo_s, hi_s] = split_range(range);
    // The bounds are sizes themselves ("64KiB:16GiB"); an ill-formed one is a bug in the table.
    try {
      lo = parse_size("range", lo_s).bytes;
      hi = parse_size("range", hi_s).bytes;
    } catch (const config_error&) {
      GHT_FAIL("ill-formed size range '" + std::string(range) + "'");
    }
    GHT_EXPECTS(lo <= hi, "ill-formed size range '" + std::string(range) + "'");
    accepted = "a size in [" + std::string(lo_s) + ", " + std::string(hi_s) + "]";
    if (lo == 0) accepted += " or NN%";
  }
  if (trim(text).empty()) {
    if (allow_empty) return SizeValue{};
    fail(name, text, "empty value, expected a size", accepted);
  }
  const SizeValue v = parse_size(name, text);
  // A budget or a headroom of a few bytes, written without a unit, is a forgotten unit: "10"
  // meant 10G. 0 (none) and values with a unit ("512B", "10K") stay as written.
  const std::string_view digits = trim(text);
  const bool budget = name.ends_with("_BUDGET") || name.ends_with("_HEADROOM");
  if (budget && !v.fraction && v.bytes > 0 && v.bytes < (1ULL << 20) &&
      std::all_of(digits.begin(), digits.end(), is_digit)) {
    const std::string n(digits);
    throw config_error(std::string(name) + "=" + n + ": " + n +
                       " bytes is almost certainly missing a unit; write " + n + "G (GiB), " + n + "GB, or " + n +
                       "B for bytes");
  }
  // A percentage is checked when it is resolved against a capacity (a fraction of 0 < f <= 1).
  if (!v.fraction && (v.bytes < lo || v.bytes > hi)) {
    fail(name, text, "out of range (" + format_bytes(v.bytes) + ")", accepted);
  }
  if (v.fraction && lo > 0) {
    fail(name, text, "a percentage is not accepted here", accepted);
  }
  return v;
}

// The bounds of an option's "lo,hi" range text into lo and hi; false (bounds untouched) for an
// empty range. An ill-formed range is a bug in config_options.inc.
template <class T>
bool parse_range(std::string_view range, const char* kind, T& lo, T& hi) {
  if (range.empty()) return false;
  const auto [lo_s, hi_s] = split_range(range);
  const auto r1 = std::from_chars(lo_s.data(), lo_s.data() + lo_s.size(), lo);
  const auto r2 = std::from_chars(hi_s.data(), hi_s.data() + hi_s.size(), hi);
  GHT_EXPECTS(r1.ec == std::errc() && r1.ptr == lo_s.data() + lo_s.size() && r2.ec == std::errc() &&
                  r2.ptr == hi_s.data() + hi_s.size() && lo <= hi,
              std::string("ill-formed ") + kind + " range '" + std::string(range) + "'");
  return true;
}

std::int64_t parse_int(std::string_view name, std::string_view text, std::string_view range) {
  std::string accepted = "decimal integer";
  std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  if (parse_range(range, "integer", lo, hi)) {
    accepted += " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  std::string_view s = trim(text);
  if (s.empty()) fail(name, text, "empty value, expected an integer", accepted);
  // from_chars takes only '-'; a leading '+' is accepted here, but not "+-1".
  if (s.front() == '+') {
    s.remove_prefix(1);
    if (s.empty() || !is_digit(s.front())) fail(name, text, "not an integer", accepted);
  }
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec == std::errc::result_out_of_range) fail(name, text, "integer overflows int64", accepted);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) fail(name, text, "not an integer", accepted);
  if (v < lo || v > hi) fail(name, text, "out of range", accepted);
  return v;
}

double parse_float(std::string_view name, std::string_view text, std::string_view range) {
  std::string accepted = "decimal number";
  double lo = -std::numeric_limits<double>::max();
  double hi = std::numeric_limits<double>::max();
  if (parse_range(range, "float", lo, hi)) {
    const auto [lo_s, hi_s] = split_range(range);
    accepted += " in [" + std::string(lo_s) + ", " + std::string(hi_s) + "]";
  }
  std::string_view s = trim(text);
  if (s.empty()) fail(name, text, "empty value, expected a number", accepted);
  // from_chars takes only '-'; a leading '+' is accepted here, but not "+-1".
  if (s.front() == '+') {
    s.remove_prefix(1);
    if (s.empty() || !(is_digit(s.front()) || s.front() == '.')) fail(name, text, "not a number", accepted);
  }
  // from_chars would accept "inf"/"nan"; only decimal digits, '.', sign and exponent pass.
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return is_digit(c) || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E';
  });
  if (!plain) fail(name, text, "not a number", accepted);
  double v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (r.ec == std::errc::result_out_of_range) fail(name, text, "number out of double range", accepted);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) fail(name, text, "not a number", accepted);
  if (!std::isfinite(v)) fail(name, text, "not a finite number", accepted);
  if (v < lo || v > hi) fail(name, text, "out of range", accepted);
  return v;
}

std::string parse_enum(std::string_view name, std::string_view text, std::string_view choices) {
  const std::string_view s = trim(text);
  std::string_view rest = choices;
  while (true) {
    const auto bar = rest.find('|');
    const std::string_view choice = rest.substr(0, bar);
    if (!s.empty() && iequals(choice, s)) return lower(choice);
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  fail(name, text, s.empty() ? "empty value, expected one of the choices" : "not a valid choice",
       choices);
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

// ---- Registry ----------------------------------------------------------------------------------

namespace {

// Validates `text` as a value of option `o`; throws config_error naming the option.
void validate(const OptionSpec& o, std::string_view text) {
  switch (o.type) {
    case Type::Bool: (void)parse_bool(o.name, text); break;
    case Type::Size: (void)parse_size(o.name, text, o.choices, o.default_text.empty()); break;
    case Type::Int: (void)parse_int(o.name, text, o.choices); break;
    case Type::Float: (void)parse_float(o.name, text, o.choices); break;
    case Type::Enum: (void)parse_enum(o.name, text, o.choices); break;
    case Type::String: break;
  }
}

const OptionSpec& spec(Key k) {
  const auto i = static_cast<std::size_t>(k);
  GHT_EXPECTS(i < options().size(), "invalid configuration key");
  return options()[i];
}

void expect_type(const OptionSpec& o, std::initializer_list<Type> types) {
  const bool ok = std::find(types.begin(), types.end(), o.type) != types.end();
  GHT_EXPECTS(ok, std::string(o.name) + " is of type " + std::string(to_string(o.type)) +
                      ", read with the wrong getter");
}

// The effective (text, source) of `k`: a Registry that was never loaded reads as all defaults.
template <class Map>
std::pair<std::string, Source> lookup(const Map& values, Key k) {
  const auto it = values.find(k);
  if (it == values.end()) return {std::string(spec(k).default_text), Source::Default};
  return {it->second.text, it->second.source};
}

std::string toml_scalar_text(const toml::value& v, const std::string& file, const std::string& key) {
  switch (v.type()) {
    case toml::value_t::string: return v.as_string().str;
    case toml::value_t::integer: return std::to_string(v.as_integer());
    case toml::value_t::floating: return shortest(v.as_floating());
    case toml::value_t::boolean: return v.as_boolean() ? "true" : "false";
    default:
      throw config_error("config file " + file + ": [ght] " + key +
                         " must be a string, integer, float or boolean");
  }
}

}  // namespace

void Registry::set(Key k, std::string_view value, Source src) {
  const OptionSpec& o = spec(k);
  validate(o, value);
  const auto it = values_.find(k);
  // A lower-precedence source never overwrites a higher one (e.g. a file named by a later
  // --set GHT_CONFIG must not undo environment values).
  if (it != values_.end() && it->second.source > src) return;
  values_[k] = Entry{std::string(value), src};
}

void Registry::load(char** envp) {
  if (envp == nullptr) envp = environ;
  // Resolve into a scratch registry and commit only on success, so a failed load leaves `*this`
  // untouched and a later call can retry.
  Registry next;
  for (const auto& o : options()) {
    try {
      next.set(o.key, o.default_text, Source::Default);
    } catch (const config_error& e) {
      throw config_error(std::string("built-in default of ") + e.what());
    }
  }
  // Collect GHT_* variables first: unknown names are reported before any value is looked at.
  std::vector<std::pair<const OptionSpec*, std::string>> env;
  for (char** p = envp; p != nullptr && *p != nullptr; ++p) {
    const std::string_view kv(*p);
    if (kv.substr(0, 4) != "GHT_") continue;
    const auto eq = kv.find('=');
    const std::string_view name = kv.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : kv.substr(eq + 1);
    const OptionSpec* o = find_option(name);
    if (o == nullptr) {
      throw config_error("unknown configuration variable " + std::string(kv) + suggestion(name, false));
    }
    env.emplace_back(o, std::string(value));
  }
  std::string config_path;
  for (const auto& [o, value] : env) {
    if (o->key == Key::GHT_CONFIG) config_path = value;
  }
  if (!config_path.empty()) next.load_file(config_path);
  for (const auto& [o, value] : env) next.set(o->key, value, Source::Env);
  values_ = std::move(next.values_);
}

void Registry::load_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw config_error("config file " + path + " (GHT_CONFIG): is a directory, expected a TOML file");
  }
  toml::value data;
  try {
    data = toml::parse(path);
  } catch (const std::exception& e) {
    throw config_error("config file " + path + " (GHT_CONFIG): cannot parse: " + e.what());
  }
  if (!data.is_table()) return;
  const auto& top = data.as_table();
  // Options written outside [ght] would be silently ignored; catch that common slip.
  for (const auto& [key, v] : top) {
    if (key != "ght" && !v.is_table() &&
        (find_option(key) != nullptr || find_option("GHT_" + key) != nullptr)) {
      throw config_error("config file " + path + ": option '" + key +
                         "' must be inside the [ght] table");
    }
  }
  const auto it = top.find("ght");
  if (it == top.end()) return;
  if (!it->second.is_table()) throw config_error("config file " + path + ": 'ght' must be a table");

  std::vector<std::pair<const OptionSpec*, std::string>> parsed;
  std::set<Key> seen;
  for (const auto& [key, v] : it->second.as_table()) {
    const bool full = key.size() >= 4 && iequals(std::string_view(key).substr(0, 4), "GHT_");
    const OptionSpec* o = full ? find_option(key) : find_option("GHT_" + key);
    if (o == nullptr) {
      throw config_error("unknown configuration key '" + key + "' in [ght] of config file " + path +
                         suggestion(key, !full));
    }
    if (o->key == Key::GHT_CONFIG) {
      throw config_error("config file " + path + ": GHT_CONFIG cannot be set inside a config file");
    }
    if (!seen.insert(o->key).second) {
      throw config_error("config file " + path + ": " + std::string(o->name) +
                         " is set twice in [ght] (full and short name)");
    }
    parsed.emplace_back(o, toml_scalar_text(v, path, key));
  }
  // Validate everything before changing anything.
  for (const auto& [o, text] : parsed) {
    try {
      validate(*o, text);
    } catch (const config_error& e) {
      throw config_error(std::string(e.what()) + " [in config file " + path + "]");
    }
  }
  // A newly named file replaces the values of the previous one.
  for (auto& [k, e] : values_) {
    if (e.source == Source::File) e = Entry{std::string(spec(k).default_text), Source::Default};
  }
  for (const auto& [o, text] : parsed) set(o->key, text, Source::File);
}

bool Registry::set_planned(std::string_view name, std::string_view value) {
  const OptionSpec* o = find_option(name);
  GHT_EXPECTS(o != nullptr, "the plan chose a value for an unknown option " + std::string(name));
  if (source(o->key) > Source::Plan) return false;
  set(o->key, value, Source::Plan);
  return true;
}

void Registry::force_planned(std::string_view name, std::string_view value) {
  const OptionSpec* o = find_option(name);
  GHT_EXPECTS(o != nullptr, "the plan set an unknown option " + std::string(name));
  validate(*o, value);
  values_[o->key] = Entry{std::string(value), Source::Plan};
}

void Registry::set_flag(std::string_view name, std::string_view value) {
  const OptionSpec* o = find_option(name);
  if (o == nullptr) {
    throw config_error("unknown configuration variable " + std::string(name) + "=" + std::string(value) +
                       " (from --set)" + suggestion(name, false));
  }
  const auto saved = values_;  // a bad --set GHT_CONFIG=file must leave everything as it was
  try {
    set(o->key, value, Source::Flag);
    if (o->key == Key::GHT_CONFIG && !value.empty()) load_file(std::string(value));
  } catch (const config_error& e) {
    values_ = saved;
    throw config_error(std::string(e.what()) + " [from --set]");
  }
}

bool Registry::get_bool(Key k) const {
  const OptionSpec& o = spec(k);
  expect_type(o, {Type::Bool});
  return parse_bool(o.name, lookup(values_, k).first);
}

SizeValue Registry::get_size(Key k) const {
  const OptionSpec& o = spec(k);
  expect_type(o, {Type::Size});
  return parse_size(o.name, lookup(values_, k).first, o.choices, o.default_text.empty());
}

std::int64_t Registry::get_int(Key k) const {
  const OptionSpec& o = spec(k);
  expect_type(o, {Type::Int});
  return parse_int(o.name, lookup(values_, k).first, o.choices);
}

double Registry::get_float(Key k) const {
  const OptionSpec& o = spec(k);
  expect_type(o, {Type::Float});
  return parse_float(o.name, lookup(values_, k).first, o.choices);
}

std::string Registry::get_string(Key k) const {
  const OptionSpec& o = spec(k);
  expect_type(o, {Type::String, Type::Enum});
  const std::string t = lookup(values_, k).first;
  return o.type == Type::Enum ? parse_enum(o.name, t, o.choices) : t;
}

bool Registry::is_empty(Key k) const { return trim(lookup(values_, k).first).empty(); }
Source Registry::source(Key k) const { return lookup(values_, k).second; }
std::string Registry::text(Key k) const { return lookup(values_, k).first; }

std::string Registry::format_table() const {
  struct Row {
    std::string name, value, source, def, doc;
  };
  std::vector<Row> rows;
  rows.push_back({"NAME", "VALUE", "SOURCE", "DEFAULT", "DOC"});
  for (const auto& o : options()) {
    const auto [t, src] = lookup(values_, o.key);
    rows.push_back({std::string(o.name), display(t), std::string(to_string(src)), display(o.default_text),
                    std::string(o.short_doc)});
  }
  std::size_t w[4] = {0, 0, 0, 0};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.value.size());
    w[2] = std::max(w[2], r.source.size());
    w[3] = std::max(w[3], r.def.size());
  }
  std::string out;
  for (const auto& r : rows) {
    for (const auto& [cell, width] : {std::pair{&r.name, w[0]}, std::pair{&r.value, w[1]},
                                      std::pair{&r.source, w[2]}, std::pair{&r.def, w[3]}}) {
      out += *cell;
      out.append(width - cell->size() + 2, ' ');
    }
    out += r.doc;
    out += '\n';
  }
  return out;
}

std::string Registry::format_json() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& o : options()) {
    const auto [t, src] = lookup(values_, o.key);
    arr.push_back({{"name", o.name},
                   {"type", to_string(o.type)},
                   {"value", t},
                   {"source", to_string(src)},
                   {"default", o.default_text},
                   {"choices", o.choices},
                   {"doc", o.doc},
                   {"short", o.short_doc}});
  }
  return arr.dump(2) + "\n";
}

std::string Registry::format_markdown() const {
  // '|' inside a cell would split it; GitHub markdown takes "\|" as a literal bar.
  const auto esc = [](std::string_view s) {
    std::string r;
    for (const char c : s) {
      if (c == '|') r += '\\';
      r += c;
    }
    return r;
  };
  // The table holds the short docs, so that a row fits a screen; the whole docs follow as a list.
  std::string out = "| name | type | default | description |\n|---|---|---|---|\n";
  for (const auto& o : options()) {
    out += "| `" + std::string(o.name) + "` | " + esc(describe_type(o)) + " | " +
           (o.default_text.empty() ? std::string("*(empty)*") : "`" + esc(o.default_text) + "`") +
           " | " + esc(o.short_doc) + " |\n";
  }
  out += "\nIn full:\n\n";
  for (const auto& o : options()) out += "- `" + std::string(o.name) + "`: " + std::string(o.doc) + "\n";
  return out;
}

namespace {
std::atomic<bool> g_global_loaded{false};
}  // namespace

bool debug_log_level() noexcept {
  try {
    if (g_global_loaded.load(std::memory_order_acquire)) {
      return Registry::global().get_string(Key::GHT_LOG_LEVEL) == "debug";
    }
    const char* env = std::getenv("GHT_LOG_LEVEL");
    return env != nullptr && iequals(trim(env), "debug");
  } catch (...) {
    return false;
  }
}

Registry& Registry::global() {
  static Registry registry;
  static std::mutex mu;
  std::atomic<bool>& loaded = g_global_loaded;
  if (!loaded.load(std::memory_order_acquire)) {
    const std::lock_guard<std::mutex> lock(mu);
    if (!loaded.load(std::memory_order_relaxed)) {
      registry.load();  // throws on a bad environment; the next call tries again
      loaded.store(true, std::memory_order_release);
    }
  }
  return registry;
}

}  // namespace ght::config
