// Tests for the GHT_* configuration registry (tier/config.*).
#include "common/registry.hpp"
#include "tier/config.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "tier/error.hpp"

namespace ght::config {
namespace {

constexpr std::uint64_t KiB = 1ULL << 10, MiB = 1ULL << 20, GiB = 1ULL << 30, TiB = 1ULL << 40;

// Expects `fn` to throw config_error whose message contains every string in `needles`.
template <class Fn>
void expect_config_error(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected ght::config_error";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
    }
  }
}

// pre + s + post. Built with += because GCC 12 raises a false -Wrestrict on
// `const char* + std::string&&` at -O3.
std::string wrap(std::string_view pre, std::string_view s, std::string_view post) {
  std::string r(pre);
  r += s;
  r += post;
  return r;
}

using ght::test::Env;

// A TOML file in the temp directory, removed at scope exit.
class TempToml {
 public:
  explicit TempToml(const std::string& body) {
    path_ = (std::filesystem::temp_directory_path() /
             ("ght_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".toml"))
                .string();
    std::ofstream(path_) << body;
  }
  ~TempToml() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// ---- option table ------------------------------------------------------------------------------

TEST(ConfigOptions, TableMatchesKeysAndNamesAreUnique) {
  const auto& opts = options();
  ASSERT_EQ(opts.size(), static_cast<std::size_t>(Key::kCount));
  for (std::size_t i = 0; i < opts.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(opts[i].key), i);
    EXPECT_EQ(opts[i].name.substr(0, 4), "GHT_") << opts[i].name;
    EXPECT_FALSE(opts[i].doc.empty()) << opts[i].name;
  }
}

// `ght config` and `ght info` print the short doc on one line per option; the whole doc lives in
// docs/options.md. A short doc must say something and fit a terminal line next to the columns.
TEST(ConfigOptions, EveryShortDocIsNonEmptyAndShort) {
  for (const auto& o : options()) {
    EXPECT_FALSE(o.short_doc.empty()) << o.name;
    EXPECT_LE(o.short_doc.size(), 100u) << o.name << ": " << o.short_doc;
    EXPECT_LE(o.short_doc.size(), o.doc.size()) << o.name << ": the short doc is longer than the doc";
  }
}

TEST(ConfigOptions, EveryDeclaredDefaultParses) {
  for (const auto& o : options()) {
    SCOPED_TRACE(std::string(o.name));
    switch (o.type) {
      case Type::Bool: EXPECT_NO_THROW((void)parse_bool(o.name, o.default_text)); break;
      case Type::Size: EXPECT_NO_THROW((void)parse_size(o.name, o.default_text)); break;
      case Type::Int: EXPECT_NO_THROW((void)parse_int(o.name, o.default_text, o.choices)); break;
      case Type::Float: EXPECT_NO_THROW((void)parse_float(o.name, o.default_text, o.choices)); break;
      case Type::Enum: EXPECT_NO_THROW((void)parse_enum(o.name, o.default_text, o.choices)); break;
      case Type::String: EXPECT_TRUE(o.choices.empty()); break;
    }
    if (o.type == Type::Int || o.type == Type::Float) {
      EXPECT_NE(o.choices.find(':'), std::string_view::npos);
    }
    if (o.type == Type::Enum) {
      EXPECT_FALSE(o.choices.empty());
    }
  }
}

TEST(ConfigOptions, FindIsCaseInsensitive) {
  const OptionSpec* o = find_option("ght_hbm_budget");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->key, Key::GHT_HBM_BUDGET);
  EXPECT_EQ(find_option("GHT_HBM_BUDGET"), o);
  EXPECT_EQ(find_option("GHT_HBM_BUDGT"), nullptr);
  EXPECT_EQ(find_option(""), nullptr);
}

TEST(ConfigOptions, NearestOption) {
  EXPECT_EQ(nearest_option("GHT_HBM_BUDGT"), "GHT_HBM_BUDGET");
  EXPECT_EQ(nearest_option("GHT_HOST_BUDGE"), "GHT_HOST_BUDGET");
  EXPECT_EQ(nearest_option("ght_polcy"), "GHT_POLICY");
  EXPECT_EQ(nearest_option("hbm_headrom"), "GHT_HBM_HEADROOM");  // short TOML form
}

// ---- Bool --------------------------------------------------------------------------------------

TEST(ConfigParse, BoolAcceptedForms) {
  for (const char* t : {"1", "true", "TRUE", "Yes", "on", "ON", " on "}) EXPECT_TRUE(parse_bool("GHT_SPILL", t)) << t;
  for (const char* t : {"0", "false", "False", "no", "NO", "off", "Off"}) EXPECT_FALSE(parse_bool("GHT_SPILL", t)) << t;
}

TEST(ConfigParse, BoolRejects) {
  for (const char* t : {"", "2", "yess", "enable", "on1", "t", "-1"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_bool("GHT_SPILL", t); },
                        {"GHT_SPILL=" + std::string(t) + ":", "true/false"});
  }
}

// ---- Size --------------------------------------------------------------------------------------

TEST(ConfigParse, SizeAcceptedForms) {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"512", 512},
      {"512B", 512},
      {"512b", 512},
      {"4K", 4 * KiB},
      {"4k", 4 * KiB},
      {"4KiB", 4 * KiB},
      {"4kib", 4 * KiB},
      {"4KB", 4000},
      {"4kb", 4000},
      {"3M", 3 * MiB},
      {"3MiB", 3 * MiB},
      {"3MB", 3000000},
      {"2G", 2 * GiB},
      {"2GiB", 2 * GiB},
      {"2gb", 2000000000ULL},
      {"7T", 7 * TiB},
      {"7TiB", 7 * TiB},
      {"7TB", 7000000000000ULL},
      {"1.5T", TiB + TiB / 2},
      {"1.5GB", 1500000000ULL},
      {"0.5K", 512},
      {".25M", MiB / 4},
      {"2.", 2},
      {"1.1K", 1126},  // 1126.4 bytes round down
      {"12 GiB", 12 * GiB},
      {" 8M ", 8 * MiB},
      {"+5K", 5 * KiB},
      {"18446744073709551615", std::numeric_limits<std::uint64_t>::max()},
      {"16777215T", 16777215ULL * TiB},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const SizeValue v = parse_size("GHT_OPT_CHUNK", c.text);
    EXPECT_EQ(v.bytes, c.bytes);
    EXPECT_FALSE(v.fraction.has_value());
  }
}

TEST(ConfigParse, SizeEmptyMeansAuto) {
  const SizeValue v = parse_size("GHT_HBM_BUDGET", "");
  EXPECT_EQ(v.bytes, 0u);
  EXPECT_FALSE(v.fraction.has_value());
}

TEST(ConfigParse, SizePercentResolves) {
  const SizeValue v = parse_size("GHT_HBM_BUDGET", "40%");
  ASSERT_TRUE(v.fraction.has_value());
  EXPECT_DOUBLE_EQ(*v.fraction, 0.40);
  EXPECT_EQ(v.resolve(100 * GiB), 40 * GiB);
  EXPECT_EQ(v.resolve(1000), 400u);
  EXPECT_EQ(parse_size("X", "100%").resolve(12345), 12345u);
  EXPECT_EQ(parse_size("X", "12.5 %").resolve(800), 100u);
  EXPECT_EQ(parse_size("X", "0.001%").resolve(1000000), 10u);
  // 100% of the largest capacity must not overflow when converted back from floating point.
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(parse_size("X", "100%").resolve(max), max);
  // An absolute size ignores the capacity.
  EXPECT_EQ(parse_size("X", "3G").resolve(7), 3 * GiB);
  EXPECT_EQ(parse_size("X", "3G").resolve(0), 3 * GiB);
}

TEST(ConfigParse, SizePercentNeedsCapacity) {
  const SizeValue v = parse_size("GHT_HBM_BUDGET", "40%");
  expect_config_error([&] { (void)v.resolve(0, "GHT_HBM_BUDGET"); }, {"GHT_HBM_BUDGET", "40%", "capacity"});
}

TEST(ConfigParse, SizeRejects) {
  const char* bad[] = {"12Q", "1G5", "1GG", "G", "1.2.3G", "1 2G", "0x10", "1e3", "4PiB", "4Ki",
                       "1GiBx", "%", "abc", ".", "1G%", "++1", "1,5G", "1_000"};
  for (const char* t : bad) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_size("GHT_HBM_BUDGET", t); },
                        {"GHT_HBM_BUDGET=" + std::string(t) + ":", "accepted:"});
  }
  expect_config_error([] { (void)parse_size("GHT_HBM_BUDGET", "12Q"); },
                      {"GHT_HBM_BUDGET=12Q: not a size (accepted: bytes with optional suffix K/M/G/T, "
                       "KB/MB/GB/TB, KiB/MiB/GiB/TiB, decimals like 1.5T, or NN%)"});
}

TEST(ConfigParse, SizeRejectsNegative) {
  for (const char* t : {"-1", "-1G", "-0", "-40%"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_size("GHT_OPT_CHUNK", t); }, {"GHT_OPT_CHUNK=", t, "negative"});
  }
}

TEST(ConfigParse, SizeRejectsFractionalBytes) {
  expect_config_error([] { (void)parse_size("GHT_OPT_CHUNK", "1.5"); }, {"GHT_OPT_CHUNK=1.5", "fractional"});
  expect_config_error([] { (void)parse_size("GHT_OPT_CHUNK", "1.5B"); }, {"fractional"});
  EXPECT_EQ(parse_size("GHT_OPT_CHUNK", "3.000").bytes, 3u);
}

TEST(ConfigParse, SizeOverflow) {
  for (const char* t : {"18446744073709551616", "99999999999999999999999", "16777216T", "16777216TiB",
                        "18446744073709551615K", "18446744073709552TB"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_size("GHT_HOST_BUDGET", t); }, {"GHT_HOST_BUDGET=", t, "overflow"});
  }
}

TEST(ConfigParse, SizePercentRange) {
  for (const char* t : {"0%", "0.0%", "100.5%", "101%", "1000%"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_size("GHT_HOST_HEADROOM", t); },
                        {"GHT_HOST_HEADROOM=", t, "0 < NN <= 100"});
  }
}

// ---- Int ---------------------------------------------------------------------------------------

TEST(ConfigParse, IntAcceptedForms) {
  EXPECT_EQ(parse_int("GHT_DEVICE", "0", "0:1024"), 0);
  EXPECT_EQ(parse_int("GHT_DEVICE", "7", "0:1024"), 7);
  EXPECT_EQ(parse_int("GHT_DEVICE", "+7", "0:1024"), 7);
  EXPECT_EQ(parse_int("GHT_DEVICE", " 0012 ", "0:1024"), 12);
  EXPECT_EQ(parse_int("GHT_DEVICE", "1024", "0:1024"), 1024);
  EXPECT_EQ(parse_int("GHT_HOST_NUMA", "-1", "-1:1023"), -1);
  EXPECT_EQ(parse_int("X", "-9223372036854775808"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(parse_int("X", "9223372036854775807"), std::numeric_limits<std::int64_t>::max());
}

TEST(ConfigParse, IntRejects) {
  for (const char* t : {"", "1.0", "1e3", "0x10", "abc", "7a", "--1", "+-1", "+", "-", "1 2", "١"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_int("GHT_DEVICE", t, "0:1024"); },
                        {"GHT_DEVICE=" + std::string(t) + ":", "integer in [0, 1024]"});
  }
}

TEST(ConfigParse, IntRange) {
  for (const char* t : {"-1", "1025", "100000"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_int("GHT_DEVICE", t, "0:1024"); },
                        {"GHT_DEVICE=" + std::string(t) + ": out of range", "[0, 1024]"});
  }
  expect_config_error([] { (void)parse_int("GHT_HOST_NUMA", "-2", "-1:1023"); }, {"out of range", "[-1, 1023]"});
}

TEST(ConfigParse, IntOverflow) {
  for (const char* t : {"9223372036854775808", "-9223372036854775809", "99999999999999999999999"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_int("GHT_CPU_THREADS", t, "0:4096"); },
                        {"GHT_CPU_THREADS=" + std::string(t) + ":", "overflow"});
  }
}

// ---- Float -------------------------------------------------------------------------------------

TEST(ConfigParse, FloatAcceptedForms) {
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", "8", "0.5:60"), 8.0);
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", "0.5", "0.5:60"), 0.5);
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", ".75", "0.5:60"), 0.75);
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", "2.5e1", "0.5:60"), 25.0);
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", "+1.25", "0.5:60"), 1.25);
  EXPECT_DOUBLE_EQ(parse_float("GHT_PROBE_SECONDS", "60", "0.5:60"), 60.0);
  EXPECT_DOUBLE_EQ(parse_float("X", "-3.5"), -3.5);
  EXPECT_DOUBLE_EQ(parse_float("X", "1E-3"), 1e-3);
}

TEST(ConfigParse, FloatRejects) {
  for (const char* t : {"", "nan", "NaN", "inf", "-inf", "infinity", "0x1p3", "1.5s", "1..5", "e3", "abc",
                        "+-1", "1,5"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_float("GHT_PROBE_SECONDS", t, "0.5:60"); },
                        {"GHT_PROBE_SECONDS=" + std::string(t) + ":", "number in [0.5, 60]"});
  }
}

TEST(ConfigParse, FloatRangeAndOverflow) {
  for (const char* t : {"0.49", "60.01", "-1", "1e300"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_float("GHT_PROBE_SECONDS", t, "0.5:60"); },
                        {"GHT_PROBE_SECONDS=" + std::string(t) + ": out of range"});
  }
  expect_config_error([] { (void)parse_float("GHT_ASSUMED_TFLOPS", "1e400", "1:100000"); },
                      {"GHT_ASSUMED_TFLOPS=1e400", "double range"});
}

// ---- Enum --------------------------------------------------------------------------------------

TEST(ConfigParse, EnumAcceptedForms) {
  EXPECT_EQ(parse_enum("GHT_POLICY", "static", "static|greedy|auto"), "static");
  EXPECT_EQ(parse_enum("GHT_POLICY", "GREEDY", "static|greedy|auto"), "greedy");
  EXPECT_EQ(parse_enum("GHT_POLICY", " Auto ", "static|greedy|auto"), "auto");
  EXPECT_EQ(parse_enum("GHT_OPTIMIZER", "gpu_link", "auto|gpu_link|cpu|device"), "gpu_link");
}

TEST(ConfigParse, EnumRejects) {
  for (const char* t : {"", "greed", "greedy|auto", "static,greedy", "|"}) {
    SCOPED_TRACE(t);
    expect_config_error([&] { (void)parse_enum("GHT_POLICY", t, "static|greedy|auto"); },
                        {"GHT_POLICY=" + std::string(t) + ":", "static|greedy|auto"});
  }
}

// Random text over the characters the parsers care about: each parser returns or throws
// config_error, never anything else (and, under the sanitizer presets, never reaches UB).
TEST(ConfigParse, RandomTextIsAcceptedOrRejectedCleanly) {
  std::mt19937 rng(20240520);
  const std::string alphabet = "0123456789.+-eE%KMGTBkmgtbiI xQn,";
  std::uniform_int_distribution<std::size_t> len(0, 24), pick(0, alphabet.size() - 1);
  int accepted_sizes = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string t(len(rng), ' ');
    for (auto& c : t) c = alphabet[pick(rng)];
    SCOPED_TRACE(t);
    try {
      const SizeValue v = parse_size("S", t);
      ++accepted_sizes;
      if (v.fraction) {
        EXPECT_GT(*v.fraction, 0.0);
        EXPECT_LE(*v.fraction, 1.0);
      }
    } catch (const config_error&) {
    }
    try {
      (void)parse_int("I", t, "-5:5");
    } catch (const config_error&) {
    }
    try {
      EXPECT_TRUE(std::isfinite(parse_float("F", t)));
    } catch (const config_error&) {
    }
    try {
      (void)parse_bool("B", t);
    } catch (const config_error&) {
    }
  }
  EXPECT_GT(accepted_sizes, 0);
}

// An integer with a binary suffix is exactly the integer times the power of 1024, or an overflow.
TEST(ConfigParse, SizeSuffixMatchesMultiplication) {
  std::mt19937_64 rng(7);
  const std::pair<const char*, std::uint64_t> sfx[] = {{"K", KiB}, {"MiB", MiB}, {"g", GiB}, {"TB", 1000000000000ULL}};
  for (int iter = 0; iter < 2000; ++iter) {
    const std::uint64_t n = rng() >> (rng() % 64);
    for (const auto& [s, m] : sfx) {
      const std::string text = std::to_string(n) + s;
      std::uint64_t want = 0;
      if (__builtin_mul_overflow(n, m, &want)) {
        EXPECT_THROW((void)parse_size("S", text), config_error) << text;
      } else {
        EXPECT_EQ(parse_size("S", text).bytes, want) << text;
      }
    }
  }
}

// ---- format_bytes ------------------------------------------------------------------------------

TEST(ConfigFormat, Bytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(64 * MiB), "64.00 MiB");
  EXPECT_EQ(format_bytes(102400000000ULL), "95.37 GiB");
  EXPECT_EQ(format_bytes(3 * TiB), "3.00 TiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<std::uint64_t>::max()), "16.00 EiB");
}

// ---- Registry: sources and precedence --------------------------------------------------------

TEST(ConfigRegistry, UnloadedRegistryReadsDefaults) {
  Registry r;
  EXPECT_EQ(r.get_size(Key::GHT_OPT_CHUNK).bytes, 64 * MiB);
  EXPECT_EQ(r.source(Key::GHT_OPT_CHUNK), Source::Default);
  EXPECT_TRUE(r.is_empty(Key::GHT_HBM_BUDGET));
}

TEST(ConfigRegistry, DefaultsWithEmptyEnvironment) {
  Env env({"PATH=/usr/bin", "HOME=/root", "ght_lower=ignored", "XGHT_FOO=1"});
  Registry r;
  r.load(env.get());
  for (const auto& o : options()) {
    EXPECT_EQ(r.source(o.key), Source::Default) << o.name;
    EXPECT_EQ(r.text(o.key), o.default_text) << o.name;
  }
  EXPECT_TRUE(r.get_bool(Key::GHT_SPILL));
  EXPECT_FALSE(r.get_bool(Key::GHT_TEST_REQUIRE_GPU));
  EXPECT_EQ(r.get_int(Key::GHT_HOST_NUMA), -1);
  EXPECT_DOUBLE_EQ(r.get_float(Key::GHT_PROBE_SECONDS), 8.0);
  EXPECT_EQ(r.get_string(Key::GHT_POLICY), "greedy");
  EXPECT_EQ(r.get_size(Key::GHT_HBM_HEADROOM).bytes, 2 * GiB);
  EXPECT_EQ(r.get_size(Key::GHT_HOST_HEADROOM).resolve(1000), 100u);
  EXPECT_TRUE(r.is_empty(Key::GHT_HBM_BUDGET));
  EXPECT_FALSE(r.is_empty(Key::GHT_HBM_HEADROOM));
}

TEST(ConfigRegistry, EnvironmentOverridesDefault) {
  Env env({"GHT_HBM_BUDGET=40%", "GHT_DEVICE=3", "GHT_POLICY=STATIC", "GHT_SPILL=no", "GHT_PROBE_SECONDS=1.5",
           "GHT_PLACE=master=host,grad=hbm"});
  Registry r;
  r.load(env.get());
  EXPECT_EQ(r.source(Key::GHT_HBM_BUDGET), Source::Env);
  EXPECT_EQ(r.get_size(Key::GHT_HBM_BUDGET).resolve(80 * GiB), 32 * GiB);
  EXPECT_EQ(r.get_int(Key::GHT_DEVICE), 3);
  EXPECT_EQ(r.get_string(Key::GHT_POLICY), "static");
  EXPECT_FALSE(r.get_bool(Key::GHT_SPILL));
  EXPECT_DOUBLE_EQ(r.get_float(Key::GHT_PROBE_SECONDS), 1.5);
  EXPECT_EQ(r.get_string(Key::GHT_PLACE), "master=host,grad=hbm");  // '=' inside the value is kept
  EXPECT_EQ(r.source(Key::GHT_OPT_CHUNK), Source::Default);
}

TEST(ConfigRegistry, UnknownEnvironmentVariableSuggests) {
  Env env({"GHT_HBM_BUDGT=1G"});
  Registry r;
  expect_config_error([&] { r.load(env.get()); },
                      {"unknown configuration variable GHT_HBM_BUDGT=1G; did you mean GHT_HBM_BUDGET?"});
  Env env2({"GHT_POLCY=static"});
  expect_config_error([&] { r.load(env2.get()); }, {"GHT_POLCY=static", "did you mean GHT_POLICY?"});
}

TEST(ConfigRegistry, BadEnvironmentValueNamesVariable) {
  for (const char* kv : {"GHT_HBM_BUDGET=12Q", "GHT_DEVICE=", "GHT_DEVICE=2000", "GHT_SPILL=maybe",
                         "GHT_POLICY=fastest", "GHT_PROBE_SECONDS=nan", "GHT_OPT_CHUNK=-64M",
                         "GHT_CPU_THREADS=99999999999999999999"}) {
    SCOPED_TRACE(kv);
    Env env({kv});
    Registry r;
    expect_config_error([&] { r.load(env.get()); }, {std::string(kv) + ":"});
  }
}

TEST(ConfigRegistry, FailedLoadLeavesRegistryUnchanged) {
  Env good({"GHT_DEVICE=5"});
  Registry r;
  r.load(good.get());
  Env bad({"GHT_DEVICE=6", "GHT_SPILL=maybe"});
  EXPECT_THROW(r.load(bad.get()), config_error);
  EXPECT_EQ(r.get_int(Key::GHT_DEVICE), 5);
  EXPECT_EQ(r.source(Key::GHT_DEVICE), Source::Env);
}

TEST(ConfigRegistry, PrecedenceFileEnvFlag) {
  TempToml file(
      "[ght]\n"
      "GHT_HBM_BUDGET = \"10G\"\n"   // full name, string
      "host_budget = 123456789\n"    // short name, integer
      "opt_chunk = \"1MiB\"\n"
      "probe_seconds = 2.5\n"        // float
      "spill = false\n"              // boolean
      "policy = \"static\"\n"
      "[trainer]\n"                   // other tables belong to other readers
      "lr = 1e-4\n");
  Env env({"GHT_CONFIG=" + file.path(), "GHT_HOST_BUDGET=20G", "GHT_OPT_CHUNK=2MiB"});
  Registry r;
  r.load(env.get());
  EXPECT_EQ(r.source(Key::GHT_CONFIG), Source::Env);
  EXPECT_EQ(r.source(Key::GHT_HBM_BUDGET), Source::File);
  EXPECT_EQ(r.get_size(Key::GHT_HBM_BUDGET).bytes, 10 * GiB);
  EXPECT_EQ(r.source(Key::GHT_HOST_BUDGET), Source::Env);
  EXPECT_EQ(r.get_size(Key::GHT_HOST_BUDGET).bytes, 20 * GiB);
  EXPECT_EQ(r.source(Key::GHT_PROBE_SECONDS), Source::File);
  EXPECT_DOUBLE_EQ(r.get_float(Key::GHT_PROBE_SECONDS), 2.5);
  EXPECT_FALSE(r.get_bool(Key::GHT_SPILL));
  EXPECT_EQ(r.get_string(Key::GHT_POLICY), "static");
  EXPECT_EQ(r.source(Key::GHT_DEVICE), Source::Default);

  r.set_flag("GHT_OPT_CHUNK", "4MiB");
  r.set_flag("ght_hbm_budget", "50%");  // flag names are case-insensitive too
  EXPECT_EQ(r.source(Key::GHT_OPT_CHUNK), Source::Flag);
  EXPECT_EQ(r.get_size(Key::GHT_OPT_CHUNK).bytes, 4 * MiB);
  EXPECT_EQ(r.source(Key::GHT_HBM_BUDGET), Source::Flag);
  EXPECT_EQ(r.get_size(Key::GHT_HBM_BUDGET).resolve(100), 50u);

  // Reloading the file later must not undo higher-precedence values.
  r.load_file(file.path());
  EXPECT_EQ(r.source(Key::GHT_OPT_CHUNK), Source::Flag);
  EXPECT_EQ(r.source(Key::GHT_HOST_BUDGET), Source::Env);
  EXPECT_EQ(r.source(Key::GHT_SPILL), Source::File);
}

TEST(ConfigRegistry, FileIntegerForSizeIsBytes) {
  TempToml file("[ght]\nhost_budget = 123456789\n");
  Registry r;
  r.load_file(file.path());
  EXPECT_EQ(r.get_size(Key::GHT_HOST_BUDGET).bytes, 123456789u);
  EXPECT_EQ(r.source(Key::GHT_HOST_BUDGET), Source::File);
}

TEST(ConfigRegistry, ConfigFileFromFlagReplacesPreviousFile) {
  TempToml a("[ght]\nopt_chunk = \"1MiB\"\ndevice = 2\n");
  TempToml b("[ght]\nopt_chunk = \"8MiB\"\n");
  Env env({"GHT_CONFIG=" + a.path()});
  Registry r;
  r.load(env.get());
  EXPECT_EQ(r.get_int(Key::GHT_DEVICE), 2);
  r.set_flag("GHT_CONFIG", b.path());
  EXPECT_EQ(r.source(Key::GHT_CONFIG), Source::Flag);
  EXPECT_EQ(r.get_size(Key::GHT_OPT_CHUNK).bytes, 8 * MiB);
  EXPECT_EQ(r.source(Key::GHT_DEVICE), Source::Default);  // only file a set it
  EXPECT_EQ(r.get_int(Key::GHT_DEVICE), 0);
}

TEST(ConfigRegistry, UnknownFileKeyNamesFileAndSuggests) {
  TempToml file("[ght]\nhbm_budgt = \"1G\"\n");
  Env env({"GHT_CONFIG=" + file.path()});
  Registry r;
  expect_config_error([&] { r.load(env.get()); }, {file.path(), "hbm_budgt", "did you mean hbm_budget?"});
  TempToml full("[ght]\nGHT_HBM_BUDGT = \"1G\"\n");
  expect_config_error([&] { r.load_file(full.path()); }, {full.path(), "did you mean GHT_HBM_BUDGET?"});
}

TEST(ConfigRegistry, BadFileValueNamesVariableAndFile) {
  TempToml file("[ght]\nhbm_budget = \"12Q\"\n");
  Registry r;
  expect_config_error([&] { r.load_file(file.path()); }, {"GHT_HBM_BUDGET=12Q: not a size", file.path()});
  TempToml arr("[ght]\ndevice = [1, 2]\n");
  expect_config_error([&] { r.load_file(arr.path()); }, {arr.path(), "device"});
  TempToml frac("[ght]\ndevice = 1.5\n");
  expect_config_error([&] { r.load_file(frac.path()); }, {"GHT_DEVICE=1.5", frac.path()});
  // Nothing of a rejected file is applied.
  TempToml half("[ght]\nopt_chunk = \"1MiB\"\nspill = \"maybe\"\n");
  EXPECT_THROW(r.load_file(half.path()), config_error);
  EXPECT_EQ(r.source(Key::GHT_OPT_CHUNK), Source::Default);
}

TEST(ConfigRegistry, FileErrors) {
  Registry r;
  expect_config_error([&] { r.load_file("/nonexistent/ght.toml"); }, {"/nonexistent/ght.toml"});
  TempToml syntax("[ght\nx = \n");
  expect_config_error([&] { r.load_file(syntax.path()); }, {syntax.path()});
  TempToml outside("hbm_budget = \"1G\"\n");
  expect_config_error([&] { r.load_file(outside.path()); }, {outside.path(), "[ght]"});
  TempToml twice("[ght]\nhbm_budget = \"1G\"\nGHT_HBM_BUDGET = \"2G\"\n");
  expect_config_error([&] { r.load_file(twice.path()); }, {twice.path(), "twice"});
  TempToml nested("[ght]\nconfig = \"/x.toml\"\n");
  expect_config_error([&] { r.load_file(nested.path()); }, {"GHT_CONFIG"});
  Env env({"GHT_CONFIG=/nonexistent/ght.toml"});
  expect_config_error([&] { r.load(env.get()); }, {"/nonexistent/ght.toml"});
}

TEST(ConfigRegistry, SetFlagErrors) {
  Registry r;
  expect_config_error([&] { r.set_flag("GHT_HBM_BUDGT", "1G"); }, {"GHT_HBM_BUDGT=1G", "did you mean GHT_HBM_BUDGET?"});
  expect_config_error([&] { r.set_flag("GHT_DEVICE", "x"); }, {"GHT_DEVICE=x: not an integer"});
  EXPECT_EQ(r.source(Key::GHT_DEVICE), Source::Default);
  TempToml bad("[ght]\nspill = \"maybe\"\n");
  expect_config_error([&] { r.set_flag("GHT_CONFIG", bad.path()); }, {"GHT_SPILL=maybe", bad.path(), "--set"});
  EXPECT_EQ(r.source(Key::GHT_CONFIG), Source::Default);
}

TEST(ConfigRegistry, WrongGetterIsALogicError) {
  Registry r;
  EXPECT_THROW((void)r.get_bool(Key::GHT_DEVICE), logic_error);
  EXPECT_THROW((void)r.get_size(Key::GHT_POLICY), logic_error);
  EXPECT_THROW((void)r.get_string(Key::GHT_DEVICE), logic_error);
}

// ---- Registry: output formats ----------------------------------------------------------------

TEST(ConfigRegistry, TableListsEveryOptionWithSource) {
  Env env({"GHT_OPT_CHUNK=32MiB"});
  Registry r;
  r.load(env.get());
  r.set_flag("GHT_DEVICE", "1");
  const std::string t = r.format_table();
  EXPECT_EQ(t.rfind("NAME", 0), 0u);
  for (const char* col : {"VALUE", "SOURCE", "DEFAULT", "DOC"}) EXPECT_NE(t.find(col), std::string::npos);
  for (const auto& o : options()) {
    const auto line_at = t.find(wrap("\n", o.name, " "));
    ASSERT_NE(line_at, std::string::npos) << o.name;
    const std::string line = t.substr(line_at + 1, t.find('\n', line_at + 1) - line_at - 1);
    EXPECT_NE(line.find(o.short_doc), std::string::npos) << line;
    const char* want = o.key == Key::GHT_OPT_CHUNK ? "env" : o.key == Key::GHT_DEVICE ? "flag" : "default";
    EXPECT_NE(line.find(std::string(" ") + want + " "), std::string::npos) << line;
  }
  EXPECT_NE(t.find("32MiB"), std::string::npos);
}

TEST(ConfigRegistry, TableLinesFitATerminal) {
  Env env({"GHT_OPT_CHUNK=32MiB", "GHT_HBM_BUDGET=80%"});
  Registry r;
  r.load(env.get());
  const std::string t = r.format_table();
  std::size_t lines = 0;
  for (std::size_t at = 0, end; (end = t.find('\n', at)) != std::string::npos; at = end + 1, ++lines) {
    EXPECT_LE(end - at, 120u) << t.substr(at, end - at);
  }
  EXPECT_EQ(lines, options().size() + 1);  // the header and one line per option
}

TEST(ConfigRegistry, JsonRoundTrips) {
  Env env({"GHT_SPILL=off"});
  Registry r;
  r.load(env.get());
  const auto j = nlohmann::json::parse(r.format_json());
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), options().size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& o = options()[i];
    EXPECT_EQ(j[i]["name"], std::string(o.name));
    EXPECT_EQ(j[i]["type"], std::string(to_string(o.type)));
    EXPECT_EQ(j[i]["default"], std::string(o.default_text));
    EXPECT_EQ(j[i]["choices"], std::string(o.choices));
    EXPECT_EQ(j[i]["doc"], std::string(o.doc));
    EXPECT_EQ(j[i]["short"], std::string(o.short_doc));
    EXPECT_EQ(j[i]["value"], r.text(o.key));
    EXPECT_EQ(j[i]["source"], std::string(to_string(r.source(o.key))));
  }
  EXPECT_EQ(j[static_cast<std::size_t>(Key::GHT_SPILL)]["source"], "env");
  EXPECT_EQ(j[static_cast<std::size_t>(Key::GHT_SPILL)]["value"], "off");
}

TEST(ConfigRegistry, MarkdownHasOneRowPerOption) {
  Registry r;
  const std::string md = r.format_markdown();
  EXPECT_EQ(md.rfind("| name | type | default | description |\n", 0), 0u);
  std::size_t rows = 0;
  for (std::size_t p = 0; (p = md.find("\n| `GHT_", p)) != std::string::npos; ++p) ++rows;
  EXPECT_EQ(rows, options().size());
  for (const auto& o : options()) {
    // The table row holds the short doc; the list after it the whole doc.
    EXPECT_NE(md.find(wrap("| `", o.name, "` | ")), std::string::npos) << o.name;
    EXPECT_NE(md.find(std::string(" | ") + std::string(o.short_doc) + " |\n"), std::string::npos) << o.name;
    EXPECT_NE(md.find(wrap("\n- `", o.name, "`: ") + std::string(o.doc) + "\n"), std::string::npos) << o.name;
  }
  // A literal '|' in a table cell must be escaped or the row gains columns.
  EXPECT_NE(md.find("| `GHT_LOG_LEVEL` | enum: error\\|warn\\|info\\|debug |"), std::string::npos);
}

// The only test that touches the process-wide registry: a bad environment makes the first call
// throw, and a later call retries once the environment is fixed.
TEST(ConfigRegistry, GlobalLoadsLazilyAndRetries) {
  ASSERT_EQ(::setenv("GHT_HBM_BUDGT", "1G", 1), 0);
  expect_config_error([] { (void)Registry::global(); }, {"GHT_HBM_BUDGT=1G", "did you mean GHT_HBM_BUDGET?"});
  ASSERT_EQ(::unsetenv("GHT_HBM_BUDGT"), 0);
  ASSERT_EQ(::setenv("GHT_OPT_CHUNK", "3MiB", 1), 0);
  Registry& g = Registry::global();
  ASSERT_EQ(::unsetenv("GHT_OPT_CHUNK"), 0);
  EXPECT_EQ(&g, &cfg());
  EXPECT_EQ(g.get_size(Key::GHT_OPT_CHUNK).bytes, 3 * MiB);
  EXPECT_EQ(g.source(Key::GHT_OPT_CHUNK), Source::Env);
}

}  // namespace
}  // namespace ght::config

namespace ght::config {
namespace {

// A budget or headroom under 1 MiB written without a unit is a forgotten unit; with a unit, or 0,
// it stands; other sizes (GHT_HOST_CACHE) are not budgets.
TEST(ConfigParse, BudgetWithoutAUnitUnderOneMiBIsRejected) {
  for (const char* name : {"GHT_HOST_BUDGET", "GHT_HBM_BUDGET", "GHT_HOST_HEADROOM", "GHT_HBM_HEADROOM"}) {
    SCOPED_TRACE(name);
    expect_config_error([&] { (void)parse_size(name, "10", "0:1024T", true); },
                        {std::string(name) + "=10: 10 bytes is almost certainly missing a unit; write 10G (GiB), "
                                             "10GB, or 10B for bytes"});
    expect_config_error([&] { (void)parse_size(name, "1048575", "0:1024T", true); }, {"missing a unit"});
    EXPECT_EQ(parse_size(name, "10B", "0:1024T", true).bytes, 10u);
    EXPECT_EQ(parse_size(name, "10G", "0:1024T", true).bytes, 10 * GiB);
    EXPECT_EQ(parse_size(name, "0", "0:1024T", true).bytes, 0u);
    EXPECT_EQ(parse_size(name, "1048576", "0:1024T", true).bytes, MiB);
  }
  EXPECT_EQ(parse_size("GHT_HOST_CACHE", "10", "0:1024T", true).bytes, 10u);
  Env env({"GHT_HOST_BUDGET=10"});
  Registry r;
  expect_config_error([&] { r.load(env.get()); }, {"GHT_HOST_BUDGET=10: 10 bytes is almost certainly missing a unit"});
}

}  // namespace
}  // namespace ght::config
