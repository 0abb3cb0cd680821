#include "trainer/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <vector>

#include "tier/error.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

RunDirLock::RunDirLock(const std::string& run_dir) : path_((fs::path(run_dir) / ".lock").string()) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw io_error("run directory " + run_dir + ": cannot create it: " + ec.message());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(path_ + ": cannot open the run lock: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw io_error(path_ + ": cannot lock: " + std::strerror(err));
    std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw logic_error("run directory " + run_dir + " is in use by another training run (pid " +
                      (pid.empty() ? std::string("unknown") : pid) + ", lock " + path_ +
                      "); wait for it to finish or use another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw io_error(path_ + ": cannot write the pid: " + std::strerror(err));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock; the file stays (unlinking it would race)
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
