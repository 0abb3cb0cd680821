// The run directory guards: one lock holder at a time (the second is told the holder's pid),
// the lock is released with its holder, a previous run is recognised and cleared, run ids differ.
#include "trainer/run_dir.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;

namespace {

TEST(RunDirLock, SecondHolderIsRefusedWithTheFirstOnesPid) {
  ght::test::TempDir tmp("ght_rundir_test");
  const std::string run = tmp / "run";
  std::optional<RunDirLock> first;
  first.emplace(run);
  EXPECT_TRUE(fs::exists(run + "/.lock"));
  EXPECT_EQ(ght::test::read_bytes(run + "/.lock"), std::to_string(::getpid()) + "\n");
  const std::string msg = ght::test::error_of<ght::logic_error>([&] { RunDirLock second(run); });
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
  EXPECT_NE(msg.find(run), std::string::npos) << msg;
  first.reset();
  RunDirLock again(run);  // released with its holder
  EXPECT_EQ(again.path(), run + "/.lock");
}

TEST(RunDir, HoldsRunAndClearRun) {
  ght::test::TempDir tmp("ght_rundir_test");
  const std::string run = tmp / "run";
  EXPECT_FALSE(holds_run(run));  // missing
  fs::create_directories(run);
  ght::test::write_bytes(run + "/notes.txt", "mine");
  { RunDirLock l(run); }
  EXPECT_FALSE(holds_run(run));  // a lock file and other files are not a run
  ght::test::write_bytes(run + "/log.jsonl", "{}\n");
  EXPECT_TRUE(holds_run(run));
  fs::remove(run + "/log.jsonl");
  fs::create_directories(run + "/ckpt_00000004");
  EXPECT_TRUE(holds_run(run));
  fs::create_directories(run + "/.tmp-ckpt_00000005");
  ght::test::write_bytes(run + "/log.jsonl", "{}\n");
  ght::test::write_bytes(run + "/profile.json", "{}\n");
  clear_run(run);
  EXPECT_FALSE(holds_run(run));
  EXPECT_FALSE(fs::exists(run + "/ckpt_00000004"));
  EXPECT_FALSE(fs::exists(run + "/.tmp-ckpt_00000005"));
  EXPECT_FALSE(fs::exists(run + "/profile.json"));
  EXPECT_TRUE(fs::exists(run + "/notes.txt"));  // not the run's: kept
}

TEST(RunDir, RunIdsDiffer) {
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), std::string("20261201T034512Z-9f3a01c2").size()) << a;
}

}  // namespace

namespace {

// Two runs that start together: the second finds the lock taken before the first has written its
// pid (held open here by the pause hook), and still names the first one's pid, never "unknown".
TEST(RunDirLock, SecondRunStartingTogetherNamesTheFirstOnesPid) {
  ght::test::TempDir tmp("ght_rundir_test");
  const std::string run = tmp / "run";
  std::string second_error;
  std::thread second;
  set_run_lock_pause_for_testing([&] {
    set_run_lock_pause_for_testing({});  // the second run does not pause
    second = std::thread([&] {
      second_error = ght::test::error_of<ght::logic_error>([&] { RunDirLock lock(run); });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the second reads meanwhile
  });
  {
    RunDirLock first(run);
    second.join();
  }
  set_run_lock_pause_for_testing({});
  EXPECT_CONTAINS(second_error, "pid " + std::to_string(::getpid()) + ",");
  EXPECT_EQ(second_error.find("unknown"), std::string::npos) << second_error;
}

// Many unpaused races between two threads: exactly one wins each time, the other names its pid.
TEST(RunDirLock, RacingRunsAlwaysNameTheHolder) {
  ght::test::TempDir tmp("ght_rundir_test");
  for (int i = 0; i < 50; ++i) {
    const std::string run = tmp / ("run" + std::to_string(i));
    std::atomic<int> ready{0};
    std::string errors[2];
    std::optional<RunDirLock> locks[2];
    auto race = [&](int k) {
      ++ready;
      while (ready.load() < 2) {
      }
      try {
        locks[k].emplace(run);
      } catch (const ght::logic_error& e) {
        errors[k] = e.what();
      }
    };
    std::thread a(race, 0), b(race, 1);
    a.join();
    b.join();
    ASSERT_NE(locks[0].has_value(), locks[1].has_value()) << errors[0] << errors[1];
    const std::string& msg = errors[locks[0] ? 1 : 0];
    ASSERT_NE(msg.find("pid " + std::to_string(::getpid()) + ","), std::string::npos) << msg;
  }
}

}  // namespace
