#include "trainer/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tier/error.hpp"

namespace ght::trainer::fileio {

namespace {
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw io_error(path + ": " + what + ": " + std::strerror(errno));
}
}  // namespace

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3::update(const void* data, std::size_t bytes) noexcept {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}
std::uint64_t Xxh3::digest() const noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

OutFile::OutFile(std::string path, bool hash) : path_(std::move(path)) {
  if (hash) hash_ = std::make_unique<Xxh3>();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, "cannot create file");
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, std::size_t bytes) {
  GHT_EXPECTS(fd_ >= 0, "write to closed file " + path_);
  const auto* p = static_cast<const char*>(data);
  if (hash_) hash_->update(p, bytes);
  std::size_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  bytes_ += bytes;
}

void OutFile::pwrite(const void* data, std::size_t bytes, std::uint64_t offset) {
  GHT_EXPECTS(fd_ >= 0, "write to closed file " + path_);
  const auto* p = static_cast<const char*>(data);
  std::size_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed");
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    left -= static_cast<std::size_t>(n);
  }
}

void OutFile::close() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) fail(path_, "fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close failed");
}

std::uint64_t OutFile::digest() const {
  GHT_EXPECTS(hash_ != nullptr, "OutFile::digest: " + path_ + " was opened without hashing");
  return hash_->digest();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open directory for fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(dir, "directory fsync failed");
}

void atomic_write(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    OutFile f(tmp);
    f.write(content.data(), content.size());
    f.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "cannot rename " + tmp + " into place");
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

namespace {
// Read the whole file in buf-sized pieces, handing each to fn(data, bytes).
template <class Fn>
void read_chunks(const std::string& path, std::vector<char>& buf, Fn&& fn) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open file");
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      errno = e;
      fail(path, "read failed");
    }
    if (n == 0) break;
    fn(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
}
}  // namespace

std::string read_all(const std::string& path) {
  std::string out;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  std::vector<char> buf(1 << 20);
  read_chunks(path, buf, [&](const char* d, std::size_t n) { out.append(d, n); });
  return out;
}

std::uint64_t xxh3_file(const std::string& path, std::uint64_t* size) {
  Xxh3 h;
  std::vector<char> buf(4 << 20);
  std::uint64_t total = 0;
  read_chunks(path, buf, [&](const char* d, std::size_t n) {
    h.update(d, n);
    total += n;
  });
  if (size != nullptr) *size = total;
  return h.digest();
}

std::uint64_t xxh3(const void* data, std::size_t bytes) noexcept { return XXH3_64bits(data, bytes); }

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace ght::trainer::fileio
