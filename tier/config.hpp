#pragma once
/**
 * @file config.hpp
 * @brief The GHT_* configuration registry.
 *
 * Every option is declared once in tier/config_options.inc. Values are resolved, in increasing
 * precedence: default < config file (GHT_CONFIG=path.toml, table [ght]) < environment < CLI flag.
 * Parsing is strict: unknown GHT_* keys (with a suggestion of the nearest known name), malformed
 * values, trailing garbage, out-of-range values and overflow all throw ght::config_error with a
 * message naming the variable, the value and the accepted forms.
 *
 * Accepted forms:
 *   Bool    1/0, true/false, yes/no, on/off (case-insensitive)
 *   Size    bytes with optional suffix K/M/G/T (x1024), KB/MB/GB/TB (x1000), KiB/MiB/GiB/TiB,
 *           decimals allowed ("1.5T"), or "NN%" of a capacity supplied by the caller; within
 *           the option's "lo:hi" range; empty only for options whose default is empty ("auto")
 *   Int     decimal integer within the option's "lo:hi" range
 *   Float   decimal number within the option's "lo:hi" range
 *   Enum    one of the '|'-separated choices (case-insensitive)
 *   String  any text
 */
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ght::config {

enum class Key {
#define GHT_OPTION(name, type, def, choices, doc, short_doc) name,
#include "tier/config_options.inc"
#undef GHT_OPTION
  kCount
};

enum class Type { Bool, Size, Int, Float, Enum, String };
/// Where a value came from, in increasing precedence. `Plan`: chosen by the plan's search
/// (tier/plan_search.hpp) for an option the user left unset; every user source outranks it.
enum class Source { Default, Plan, File, Env, Flag };

[[nodiscard]] std::string_view to_string(Type t) noexcept;
[[nodiscard]] std::string_view to_string(Source s) noexcept;

/// Static description of one option (from config_options.inc).
struct OptionSpec {
  Key key;
  std::string_view name;
  Type type;
  std::string_view default_text;
  std::string_view choices;  ///< Enum: "a|b|c"; Int/Float/Size: "lo:hi"; else empty
  std::string_view doc;        ///< the whole description (docs/options.md, `ght config --json`)
  std::string_view short_doc;  ///< at most ~90 characters: the DOC column of `ght config`/`ght info`
};

/// All options, in declaration order.
[[nodiscard]] const std::vector<OptionSpec>& options();
/// Lookup by exact (case-insensitive) name; nullptr when unknown.
[[nodiscard]] const OptionSpec* find_option(std::string_view name);
/// The nearest known option name by edit distance (for "did you mean").
[[nodiscard]] std::string_view nearest_option(std::string_view name);

/// A size option's value: absolute bytes, or a fraction of a capacity ("40%").
struct SizeValue {
  std::uint64_t bytes = 0;
  std::optional<double> fraction;  ///< set for "NN%"
  /// Resolve against a capacity; throws config_error if a fraction is given and capacity is 0.
  [[nodiscard]] std::uint64_t resolve(std::uint64_t capacity, std::string_view name = {}) const;
};

// ---- pure parsers (throw config_error naming `name` and `text`) ---------------------------------
[[nodiscard]] bool parse_bool(std::string_view name, std::string_view text);
[[nodiscard]] SizeValue parse_size(std::string_view name, std::string_view text);
/// A size option's value: `range` is "lo:hi" in size syntax (empty: any size); the empty text is
/// accepted only when `allow_empty` (options whose empty value means "auto"). Percentages are
/// accepted only where lo is 0 (they resolve against a capacity later).
[[nodiscard]] SizeValue parse_size(std::string_view name, std::string_view text,
                                   std::string_view range, bool allow_empty);
[[nodiscard]] std::int64_t parse_int(std::string_view name, std::string_view text,
                                     std::string_view range = {});
[[nodiscard]] double parse_float(std::string_view name, std::string_view text,
                                 std::string_view range = {});
[[nodiscard]] std::string parse_enum(std::string_view name, std::string_view text,
                                     std::string_view choices);
/// Levenshtein distance of two names, ASCII letters compared case-insensitively (for "did you
/// mean" suggestions).
[[nodiscard]] std::size_t edit_distance(std::string_view a, std::string_view b);
/// Human-readable byte count, e.g. "95.4 GiB".
[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

/// The resolved configuration. Thread-safe for reads after load().
class Registry {
 public:
  /// Resolve from defaults, GHT_CONFIG file, the given environment (nullptr = process environ).
  /// Throws config_error on any unknown key or bad value, in any source.
  void load(char** envp = nullptr);
  /// Set from a CLI flag (highest precedence). Validates immediately.
  void set_flag(std::string_view name, std::string_view value);
  /// Set a value the plan's search chose for an option the user left unset (source Plan). A
  /// value from any user source is kept; returns whether `value` took effect. Validates it.
  bool set_planned(std::string_view name, std::string_view value);
  /// Set a value for planning a candidate that changes a user's setting (source Plan), whatever
  /// the option's source: only for a copy of the registry that is restored afterwards (the
  /// search lists the plans that would fit without the user's pins). Validates it.
  void force_planned(std::string_view name, std::string_view value);
  /// Set from a config-file value (used by load(); exposed for tests).
  void load_file(const std::string& path);

  [[nodiscard]] bool get_bool(Key k) const;
  [[nodiscard]] SizeValue get_size(Key k) const;
  [[nodiscard]] std::int64_t get_int(Key k) const;
  [[nodiscard]] double get_float(Key k) const;
  [[nodiscard]] std::string get_string(Key k) const;  ///< also for Enum (lower-case choice)
  /// True when the effective value is the empty string (e.g. "auto" budgets).
  [[nodiscard]] bool is_empty(Key k) const;
  [[nodiscard]] Source source(Key k) const;
  [[nodiscard]] std::string text(Key k) const;  ///< effective value as text

  /// Table: name, value, source, default, short doc; one line per option.
  [[nodiscard]] std::string format_table() const;
  /// Array of {name,type,value,source,default,choices,doc,short}.
  [[nodiscard]] std::string format_json() const;
  /// The options reference (docs/options.md): a table with the short docs, then every whole doc.
  [[nodiscard]] std::string format_markdown() const;

  /// The process-wide registry, loaded lazily from the environment on first use.
  static Registry& global();

 private:
  struct Entry {
    std::string text;
    Source source = Source::Default;
  };
  void set(Key k, std::string_view value, Source src);
  std::map<Key, Entry> values_;
};

/// True when GHT_LOG_LEVEL is debug. Never throws and never loads the registry: before the
/// process-wide registry is loaded it reads the environment variable directly (so it is safe to
/// call while the registry itself is being loaded, e.g. from an error path).
[[nodiscard]] bool debug_log_level() noexcept;

/// Shorthand for Registry::global().
inline Registry& cfg() { return Registry::global(); }

}  // namespace ght::config
