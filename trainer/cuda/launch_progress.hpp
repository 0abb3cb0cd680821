/**
 * @file launch_progress.hpp
 * @brief How far an update launched on another host thread has got, region by region.
 *
 * The exact-mode update is launched from a thread of its own (train_cuda.cpp): its dma launches
 * block on a full driver queue for most of the update's time, and on the training thread that
 * kept the next step's first forward from being queued until then. The forward of unit u may be
 * queued once the events of u's regions are recorded: cudaStreamWaitEvent on an event not yet
 * recorded would wait for nothing. The launch thread marks each region as its events are
 * recorded (AdamW::update_all's `launched`), and the training thread waits on the host for the
 * regions it needs. Plain C++ (unit-tested without CUDA).
 */
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

namespace ght::trainer {

class LaunchProgress {
 public:
  /// Before the launch thread starts: no region of `regions` launched yet.
  void start(std::size_t regions) {
    std::lock_guard<std::mutex> lk(m_);
    launched_.assign(regions, 0);
    ended_ = false;
  }
  /// Launch thread: region r's events are recorded.
  void launched(std::size_t r) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (r < launched_.size()) launched_[r] = 1;
    }
    cv_.notify_all();
  }
  /// Launch thread, last (also when it failed): nothing more will be marked.
  void end() {
    {
      std::lock_guard<std::mutex> lk(m_);
      ended_ = true;
    }
    cv_.notify_all();
  }
  /// Blocks until region r is launched or the launch thread has ended; true if r was launched
  /// (false: the thread ended without it, e.g. on an error its future rethrows).
  bool wait(std::size_t r) {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return ended_ || (r < launched_.size() && launched_[r] != 0); });
    return r < launched_.size() && launched_[r] != 0;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<char> launched_;
  bool ended_ = true;  // no launch in flight
};

}  // namespace ght::trainer
