// ght::log: the level filters (info hidden at warn, debug shown only at debug), where each level
// goes (info: stdout; warn/error/debug: stderr with a prefix), level parsing, and whole lines
// from many threads.
#include "tier/log.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/expect.hpp"
#include "tier/error.hpp"

namespace {

using ght::log::Level;

// Restores the level a test changed.
struct LevelGuard {
  Level saved = ght::log::level();
  ~LevelGuard() { ght::log::set_level(saved); }
};

struct Captured {
  std::string out, err;
};

template <class F>
Captured capture(F&& f) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  f();
  Captured c;
  c.out = testing::internal::GetCapturedStdout();
  c.err = testing::internal::GetCapturedStderr();
  return c;
}

void say_all() {
  ght::log::error("e-msg");
  ght::log::warn("w-msg");
  ght::log::info("i-msg");
  ght::log::debug("d-msg");
}

TEST(Log, WarnHidesInfoAndDebug) {
  LevelGuard g;
  ght::log::set_level(Level::warn);
  const Captured c = capture(say_all);
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(c.err, "ght: error: e-msg\nght: warning: w-msg\n");
  EXPECT_FALSE(ght::log::enabled(Level::info));
}

TEST(Log, InfoGoesToStdoutDebugOnlyAtDebug) {
  LevelGuard g;
  ght::log::set_level(Level::info);
  Captured c = capture(say_all);
  EXPECT_EQ(c.out, "i-msg\n");
  EXPECT_EQ(c.err, "ght: error: e-msg\nght: warning: w-msg\n");
  ght::log::set_level(Level::debug);
  c = capture(say_all);
  EXPECT_EQ(c.out, "i-msg\n");
  EXPECT_EQ(c.err, "ght: error: e-msg\nght: warning: w-msg\nght: debug: d-msg\n");
  ght::log::set_level(Level::error);
  c = capture(say_all);
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(c.err, "ght: error: e-msg\n");
}

TEST(Log, ParsesLevelsAndRejectsOthers) {
  EXPECT_EQ(ght::log::parse_level("error"), Level::error);
  EXPECT_EQ(ght::log::parse_level("WARN"), Level::warn);
  EXPECT_EQ(ght::log::parse_level("info"), Level::info);
  EXPECT_EQ(ght::log::parse_level("Debug"), Level::debug);
  const std::string msg = ght::test::error_of<ght::config_error>([] { (void)ght::log::parse_level("loud"); });
  EXPECT_NE(msg.find("GHT_LOG_LEVEL"), std::string::npos) << msg;
}

TEST(Log, LinesFromManyThreadsStayWhole) {
  LevelGuard g;
  ght::log::set_level(Level::info);
  const std::string line(200, 'x');
  const Captured c = capture([&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t) {
      ts.emplace_back([&] {
        for (int i = 0; i < 50; ++i) ght::log::info(line);
      });
    }
    for (auto& t : ts) t.join();
  });
  std::string expected;
  for (int i = 0; i < 400; ++i) expected += line + "\n";
  EXPECT_EQ(c.out, expected);
}

}  // namespace
