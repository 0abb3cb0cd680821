// The run directory guards: one lock holder at a time (the second is told the holder's pid),
// the lock is released with its holder, a previous run is recognised and cleared, run ids differ.
#include "trainer/run_dir.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

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
