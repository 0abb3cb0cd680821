// SIGTERM / SIGINT set the stop flag that the training loop polls.
#include "trainer/signals.hpp"

#include <gtest/gtest.h>

#include <csignal>

using namespace ght::trainer;

TEST(Signals, TermAndIntRequestAStop) {
  install_stop_handlers();
  reset_stop_request();
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop_signal(), 0);
  std::raise(SIGTERM);  // handled: the process keeps running
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGTERM);
  reset_stop_request();
  std::raise(SIGINT);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGINT);
  reset_stop_request();
  uninstall_stop_handlers();
}

TEST(SignalsDeathTest, SecondSignalTerminates) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        std::raise(SIGTERM);  // first: sets the flag
        std::raise(SIGTERM);  // second: default action
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGTERM), "");
}
