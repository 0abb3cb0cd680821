#include "trainer/run_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "tier/error.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

namespace {

std::function<void()>& lock_pause() {
  static std::function<void()> f;
  return f;
}

// The pid in a lock file: its digits up to the first newline (a longer pid written before may
// still follow until the holder truncates the file); nullopt while the file holds none.
std::optional<long> read_lock_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::nullopt;
  char* end = nullptr;
  const long pid = std::strtol(buf, &end, 10);
  if (end == buf || pid <= 0 || (*end != '\n' && *end != '\0')) return std::nullopt;
  return pid;
}

bool process_exists(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

}  // namespace

void set_run_lock_pause_for_testing(std::function<void()> f) { lock_pause() = std::move(f); }

// The holder writes its pid after it takes the flock, so a second run that starts at the same
// moment can find the file empty, or holding the pid of a run that ended before. It retries, for
// at most 2 s, until it holds the lock itself (the holder went away) or reads the pid of a live
// process.
RunDirLock::RunDirLock(const std::string& run_dir) : path_((fs::path(run_dir) / ".lock").string()) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw io_error("run directory " + run_dir + ": cannot create it: " + ec.message());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(path_ + ": cannot open the run lock: " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::optional<long> pid;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(std::exchange(fd_, -1));
      throw io_error(path_ + ": cannot lock: " + std::strerror(err));
    }
    pid = read_lock_pid(fd_);
    if ((pid && process_exists(*pid)) || std::chrono::steady_clock::now() >= deadline) {
      ::close(std::exchange(fd_, -1));
      throw logic_error("run directory " + run_dir + " is in use by another training run (pid " +
                        (pid ? std::to_string(*pid) : std::string("unknown")) + ", lock " + path_ +
                        "); wait for it to finish or use another --out");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (const std::function<void()> pause = lock_pause()) pause();
  // The pid first, then the length: the file never reads empty while this run holds it.
  const std::string mine = std::to_string(::getpid()) + "\n";
  if (::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()) ||
      ::ftruncate(fd_, static_cast<off_t>(mine.size())) != 0) {
    const int err = errno;
    ::close(std::exchange(fd_, -1));
    throw io_error(path_ + ": cannot write the pid: " + std::strerror(err));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  // Emptied while still held, so the next run never reads this pid as its holder's; the file
  // stays (unlinking it would race), and closing releases the flock.
  if (::ftruncate(fd_, 0) != 0) {
    // A destructor has no one to tell: the next run then reads this pid, finds it gone, and
    // takes the lock as from any ended run.
  }
  ::close(fd_);
}

namespace {
bool run_entry(const std::string& name) {
  return name.starts_with("ckpt_") || name.starts_with(".tmp-ckpt_") || name.starts_with(".old-ckpt_");
}
}  // namespace

bool holds_run(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return false;
  if (fs::exists(fs::path(run_dir) / "log.jsonl", ec)) return true;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (e.path().filename().string().starts_with("ckpt_") && e.is_directory(ec)) return true;
  }
  return false;
}

void clear_run(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return;
  std::vector<fs::path> doomed;  // collected first: removing while iterating is unspecified
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (run_entry(e.path().filename().string()) && e.is_directory(ec)) doomed.push_back(e.path());
  }
  for (const char* f : {"log.jsonl", "profile.json", "config.json"}) doomed.push_back(fs::path(run_dir) / f);
  for (const auto& p : doomed) {
    fs::remove_all(p, ec);
    if (ec) throw io_error(p.string() + ": cannot remove it (--overwrite): " + ec.message());
  }
}

std::string new_run_id() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "-%08x", static_cast<unsigned>(rd()));
  return std::string(buf) + tail;
}

}  // namespace ght::trainer
