// Every GHT_* option states its valid range in the options table and the parser enforces it in
// every input path (env, file, flag): empty sizes are not 0 bytes, GHT_OPT_CHUNK=0 is rejected,
// TOML integers beyond int64 cannot become an 8 EiB budget. Also: GHT_CONFIG naming a directory,
// and user-facing logic errors without source locations unless GHT_LOG_LEVEL=debug.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/registry.hpp"
#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::config {
namespace {

using ght::test::error_of;

using ght::test::Env;

std::string load_error(std::initializer_list<std::string> vars) {
  Env env(vars);
  Registry r;
  return error_of<config_error>([&] { r.load(env.get()); });
}

TEST(ConfigRanges, EverySizeOptionDeclaresARangeAndItsDefaultIsInside) {
  for (const auto& o : options()) {
    if (o.type != Type::Size) continue;
    SCOPED_TRACE(std::string(o.name));
    EXPECT_NE(o.choices.find(':'), std::string_view::npos) << "no lo:hi range";
    EXPECT_NO_THROW((void)parse_size(o.name, o.default_text, o.choices, o.default_text.empty()));
  }
}

TEST(ConfigRanges, EmptySizeIsRejectedWhereItIsNotAuto) {
  for (const char* name : {"GHT_HBM_HEADROOM", "GHT_OPT_CHUNK", "GHT_STAGING_BYTES", "GHT_HOST_HEADROOM",
                           "GHT_OPT_SPECULATE_HOST"}) {
    SCOPED_TRACE(name);
    const std::string msg = load_error({std::string(name) + "="});
    EXPECT_CONTAINS(msg, name);
    EXPECT_CONTAINS(msg, "empty value");
  }
}

TEST(ConfigRanges, EmptyBudgetKeepsItsAutoMeaning) {
  Env env({"GHT_HBM_BUDGET=", "GHT_HOST_BUDGET=", "GHT_OPT_SPECULATE="});
  Registry r;
  r.load(env.get());
  EXPECT_TRUE(r.is_empty(Key::GHT_HBM_BUDGET));
  EXPECT_TRUE(r.is_empty(Key::GHT_HOST_BUDGET));
  EXPECT_TRUE(r.is_empty(Key::GHT_OPT_SPECULATE));  // auto: ght train sizes the undo arena
  EXPECT_EQ(r.get_size(Key::GHT_HBM_BUDGET).bytes, 0u);
}

TEST(ConfigRanges, OptChunkZeroAndTinyAreRejectedWithTheRange) {
  for (const char* v : {"0", "1", "255", "32KiB"}) {
    SCOPED_TRACE(v);
    const std::string msg = load_error({std::string("GHT_OPT_CHUNK=") + v});
    EXPECT_CONTAINS(msg, std::string("GHT_OPT_CHUNK=") + v);
    EXPECT_CONTAINS(msg, "out of range");
    EXPECT_CONTAINS(msg, "[64KiB, 16GiB]");
  }
  Env ok({"GHT_OPT_CHUNK=64KiB"});
  Registry r;
  r.load(ok.get());
  EXPECT_EQ(r.get_size(Key::GHT_OPT_CHUNK).bytes, 64u << 10);
}

TEST(ConfigRanges, PercentageRejectedWhereTheRangeStartsAboveZero) {
  EXPECT_CONTAINS(load_error({"GHT_OPT_CHUNK=10%"}), "percentage");
  Env ok({"GHT_HBM_BUDGET=80%"});
  Registry r;
  EXPECT_NO_THROW(r.load(ok.get()));
}

TEST(ConfigRanges, FileIntegerBeyondInt64IsNotAnExabyteBudget) {
  ght::test::TempDir dir("ght_config_ranges");
  const std::string path = dir / "ght.toml";
  std::ofstream(path) << "[ght]\nhost_budget = 99999999999999999999\n";
  Registry r;
  const std::string msg = error_of<config_error>([&] { r.load_file(path); });
  EXPECT_CONTAINS(msg, "GHT_HOST_BUDGET");
  EXPECT_CONTAINS(msg, "out of range");
  EXPECT_CONTAINS(msg, "[0, 1024T]");
  EXPECT_CONTAINS(msg, path);
}

TEST(ConfigRanges, FlagOutOfRangeIsRejected) {
  Registry r;
  const std::string msg = error_of<config_error>([&] { r.set_flag("GHT_STAGING_BYTES", "0"); });
  EXPECT_CONTAINS(msg, "GHT_STAGING_BYTES=0");
  EXPECT_CONTAINS(msg, "[64KiB, 64GiB]");
  EXPECT_CONTAINS(load_error({"GHT_HBM_BUDGET=2000T"}), "out of range");
}

TEST(ConfigRanges, MarkdownStatesSizeRanges) {
  const std::string md = Registry().format_markdown();
  EXPECT_CONTAINS(md, "| `GHT_OPT_CHUNK` | size [64KiB, 16GiB] |");
  EXPECT_CONTAINS(md, "| `GHT_HBM_BUDGET` | size [0, 1024T] or empty |");
}

TEST(ConfigFile, ADirectoryIsNamedAsSuch) {
  ght::test::TempDir dir("ght_config_dir");
  const std::string msg = load_error({"GHT_CONFIG=" + dir.str()});
  EXPECT_CONTAINS(msg, dir.str());
  EXPECT_CONTAINS(msg, "is a directory");
}

TEST(ErrorMessages, NoSourceLocationUnlessDebug) {
  auto& g = cfg();
  const std::string saved = g.text(Key::GHT_LOG_LEVEL);
  g.set_flag("GHT_LOG_LEVEL", "info");
  const std::string plain = error_of<ght::logic_error>([] { GHT_FAIL("bad key 'x'"); });
  EXPECT_EQ(plain, "bad key 'x'");
  g.set_flag("GHT_LOG_LEVEL", "debug");
  EXPECT_TRUE(debug_log_level());
  const std::string debug = error_of<ght::logic_error>([] { GHT_FAIL("bad key 'x'"); });
  EXPECT_CONTAINS(debug, "bad key 'x' (");
  EXPECT_CONTAINS(debug, "config_ranges_test.cpp:");
  g.set_flag("GHT_LOG_LEVEL", saved);
}

}  // namespace
}  // namespace ght::config
