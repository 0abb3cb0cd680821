#pragma once
/**
 * @file run_dir.hpp
 * @brief Guards around a training run's output directory: an exclusive lock for the run's
 * lifetime, detection of a previous run's output, and a per-invocation run id.
 */
#include <functional>
#include <string>

namespace ght::trainer {

/**
 * @brief An exclusive flock(2) on `<run_dir>/.lock`, which holds the owner's pid while it is
 * held. The kernel drops the lock when the process dies, so a crashed run never leaves a stale
 * lock behind (the file stays; only the flock counts).
 */
class RunDirLock {
 public:
  /// Creates run_dir if needed.
  /// @throws ght::logic_error naming the directory and the holder's pid when another process (or
  ///         another RunDirLock in this one) holds it; ght::io_error when the file cannot be made
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

/// Tests: call f in every RunDirLock constructor after it takes the lock and before it writes its
/// pid (an empty function turns this off), to hold open the moment two runs race for the lock.
void set_run_lock_pause_for_testing(std::function<void()> f);

/// True when run_dir holds a previous run's output: a `ckpt_*` directory or log.jsonl.
[[nodiscard]] bool holds_run(const std::string& run_dir);

/// Remove a previous run's output from run_dir: its `ckpt_*` (and leftover `.tmp-`/`.old-`)
/// directories, log.jsonl, profile.json and config.json. Other files are left alone.
void clear_run(const std::string& run_dir);

/// A new id for one invocation: UTC time and 32 random bits, e.g. "20261201T034512Z-9f3a01c2".
[[nodiscard]] std::string new_run_id();

}  // namespace ght::trainer
