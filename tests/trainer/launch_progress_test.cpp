// LaunchProgress (trainer/cuda/launch_progress.hpp): the hand-over between the exact-mode update
// thread, which marks regions as their launches are queued, and the training thread, which
// waits for the regions of the unit it is about to queue. No GPU.
#include "trainer/cuda/launch_progress.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ght::trainer {
namespace {

TEST(LaunchProgress, WaitReturnsOnceItsRegionIsLaunchedNotBefore) {
  LaunchProgress p;
  p.start(3);
  std::atomic<int> marked{-1};
  std::atomic<bool> waited{false};
  std::thread consumer([&] {
    EXPECT_TRUE(p.wait(1));
    EXPECT_GE(marked.load(), 1);  // region 1 was marked before the wait returned
    waited = true;
  });
  marked = 0;
  p.launched(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(waited.load());  // region 0 alone does not release a wait for region 1
  marked = 1;
  p.launched(1);
  consumer.join();
  EXPECT_TRUE(waited.load());
  EXPECT_TRUE(p.wait(0));  // already launched: returns at once
  p.end();
}

TEST(LaunchProgress, AnEndWithoutTheRegionReleasesTheWaitAndSaysSo) {
  LaunchProgress p;
  p.start(2);
  std::thread consumer([&] { EXPECT_FALSE(p.wait(1)); });
  p.launched(0);
  p.end();  // e.g. the launch threw: the waiter joins the thread and rethrows its error
  consumer.join();
  EXPECT_TRUE(p.wait(0));
  EXPECT_FALSE(p.wait(1));
}

TEST(LaunchProgress, ANewStartForgetsThePreviousUpdate) {
  LaunchProgress p;
  p.start(2);
  p.launched(0);
  p.launched(1);
  p.end();
  p.start(2);
  std::atomic<bool> waited{false};
  std::thread consumer([&] {
    EXPECT_TRUE(p.wait(0));
    waited = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(waited.load());  // the last update's marks do not count for this one
  p.launched(0);
  consumer.join();
  p.end();
}

TEST(LaunchProgress, NoLaunchInFlightWaitsForNothing) {
  LaunchProgress p;
  EXPECT_FALSE(p.wait(0));  // never started: returns at once (false: nothing was launched)
}

}  // namespace
}  // namespace ght::trainer
