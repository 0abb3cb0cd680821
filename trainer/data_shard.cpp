// Shard files: reading and validating one (header, size, tokens), reading one whole for the
// loader, noticing that one changed while a run uses it, and writing one (trainer/data.hpp).
#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <utility>

#include "tier/error.hpp"
#include "trainer/detail/data_shard.hpp"
#include "trainer/file_io.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

namespace detail {

void io_fail(const std::string& path, const std::string& what) { throw io_error(path + ": " + what); }

std::int64_t file_size_or_fail(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    io_fail(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) io_fail(path, "not a regular file");
  return static_cast<std::int64_t>(st.st_size);
}

std::size_t pread_full(int fd, void* dst, std::size_t bytes, std::int64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail(path, std::string("read failed: ") + std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

Fd::Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (fd < 0) io_fail(path, std::string("cannot open: ") + std::strerror(errno));
}

std::int64_t shard_bytes(const ShardInfo& info) noexcept {
  return static_cast<std::int64_t>(kShardHeaderBytes) + info.tokens * static_cast<std::int64_t>(token_bytes(info.dtype));
}

FileStamp stamp_of_shard(const ShardInfo& expected) {
  const std::int64_t want = shard_bytes(expected);
  const std::string tokens = std::to_string(expected.tokens) + " " + std::string(to_string(expected.dtype)) +
                             " tokens and the header";
  const std::string way_out =
      "restore the file, or re-run `ght prep` to rebuild the dataset and start a new run on it";
  struct stat st {};
  if (::stat(expected.path.c_str(), &st) != 0) {
    io_fail(expected.path, "shard the run is reading is gone (" + std::string(std::strerror(errno)) +
                               "; expected " + std::to_string(want) + " bytes: " + tokens + "): " + way_out);
  }
  FileStamp s;
  s.size = static_cast<std::int64_t>(st.st_size);
  s.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  s.inode = static_cast<std::uint64_t>(st.st_ino);
  s.device = static_cast<std::uint64_t>(st.st_dev);
  if (!S_ISREG(st.st_mode) || s.size != want) {
    io_fail(expected.path, "shard changed while the run was reading it: expected " + std::to_string(want) +
                               " bytes (" + tokens + "), now " +
                               (S_ISREG(st.st_mode) ? std::to_string(s.size) + " bytes" : "not a regular file") +
                               " (truncated or rewritten?): " + way_out);
  }
  return s;
}

namespace {

// Range check of a token array; names the file, the token's index and its value.
template <class T>
void check_tokens(const T* tok, std::size_t n, std::int64_t vocab, const std::string& path,
                  std::int64_t first_index = 0) {
  if (vocab <= 0) return;
  const auto limit = static_cast<std::uint64_t>(vocab);
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<std::uint64_t>(tok[i]) >= limit) [[unlikely]] {
      io_fail(path, "token " + std::to_string(first_index + static_cast<std::int64_t>(i)) +
                        " has id " + std::to_string(static_cast<std::uint64_t>(tok[i])) +
                        ", outside the vocabulary (ids must be < " + std::to_string(vocab) + ")");
    }
  }
}

}  // namespace

LoadedShard::LoadedShard(const ShardInfo& info) : info_(info), stamp_(stamp_of_shard(info)) {
  Fd f(info.path);
  const auto bytes = static_cast<std::size_t>(shard_bytes(info));
  data_.resize(bytes);
  const std::size_t got = pread_full(f.fd, data_.data(), bytes, 0, info.path);
  if (got != bytes) {
    io_fail(info.path, "shard is shorter than its header says (" + std::to_string(info.tokens) + " " +
                           std::string(to_string(info.dtype)) + " tokens, " + std::to_string(bytes) +
                           " bytes with the header; read " + std::to_string(got) +
                           "): was it truncated or rewritten while in use? Restore the file, or re-run "
                           "`ght prep` and start a new run");
  }
}

void LoadedShard::validate(int vocab) const {
  const unsigned char* p = data_.data() + kShardHeaderBytes;
  const auto n = static_cast<std::size_t>(info_.tokens);
  // The body starts at byte 1024 of a vector's (new-aligned) storage: aligned for both widths.
  if (info_.dtype == TokenDtype::u16) {
    check_tokens(reinterpret_cast<const std::uint16_t*>(p), n, vocab, info_.path);
  } else {
    check_tokens(reinterpret_cast<const std::uint32_t*>(p), n, vocab, info_.path);
  }
}

}  // namespace detail

using detail::Fd;
using detail::file_size_or_fail;
using detail::io_fail;
using detail::LoadedShard;
using detail::pread_full;

// ---- shard reading ------------------------------------------------------------------------------

ShardInfo read_shard_info(const std::string& path) {
  const std::int64_t size = file_size_or_fail(path);
  Fd f(path);
  std::array<std::int32_t, kShardHeaderInts> h{};
  const std::size_t got = pread_full(f.fd, h.data(), kShardHeaderBytes, 0, path);
  if (got < kShardHeaderBytes) {
    io_fail(path, "truncated shard header: file has " + std::to_string(size) +
                      " bytes, the header alone needs " + std::to_string(kShardHeaderBytes));
  }
  ShardInfo info;
  info.path = path;
  if (h[0] == kShardMagic) {
    if (h[1] == kShardVersionU16) {
      info.dtype = TokenDtype::u16;
    } else if (h[1] == kShardVersionU32) {
      info.dtype = TokenDtype::u32;
    } else {
      io_fail(path, "unsupported shard version " + std::to_string(h[1]) +
                        " (expected 1 = uint16 tokens or 2 = uint32 tokens)");
    }
  } else if (h[0] == kLlmcLlama3Magic) {
    if (h[1] != kLlmcLlama3Version) {
      io_fail(path, "unsupported llm.c Llama-3 shard version " + std::to_string(h[1]) +
                        " (expected 7)");
    }
    info.dtype = TokenDtype::u32;
  } else {
    io_fail(path, "bad magic " + std::to_string(h[0]) + " (expected " +
                      std::to_string(kShardMagic) + "): not an llm.c token shard");
  }
  if (h[2] < 0) io_fail(path, "negative token count " + std::to_string(h[2]) + " in header");
  info.tokens = h[2];
  const std::int64_t want =
      static_cast<std::int64_t>(kShardHeaderBytes) +
      info.tokens * static_cast<std::int64_t>(token_bytes(info.dtype));
  if (size < want) {
    io_fail(path, "truncated: header says " + std::to_string(info.tokens) + " " +
                      std::string(to_string(info.dtype)) + " tokens (" + std::to_string(want) +
                      " bytes with the header), file has " + std::to_string(size) + " bytes");
  }
  if (size > want) {
    io_fail(path, "trailing bytes: header says " + std::to_string(info.tokens) + " " +
                      std::string(to_string(info.dtype)) + " tokens (" + std::to_string(want) +
                      " bytes with the header), file has " + std::to_string(size) + " bytes");
  }
  return info;
}

std::vector<std::uint32_t> read_shard(const std::string& path, int vocab) {
  const ShardInfo info = read_shard_info(path);
  std::vector<std::uint32_t> out(static_cast<std::size_t>(info.tokens));
  if (info.tokens == 0) return out;
  LoadedShard m(info);
  m.validate(vocab);
  for (std::int64_t i = 0; i < info.tokens; ++i) out[static_cast<std::size_t>(i)] = m.at(i);
  return out;
}

// ---- shard writing ------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path, TokenDtype dtype)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), dtype_(dtype) {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail(tmp_path_, std::string("cannot create shard: ") + std::strerror(errno));
  buf_.reserve(1 << 20);
  // Placeholder header; the count is patched in close().
  buf_.resize(kShardHeaderBytes, 0);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void ShardWriter::flush_buffer() {
  std::size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail(tmp_path_, std::string("write failed: ") + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
  buf_.clear();
}

void ShardWriter::append(std::span<const std::uint32_t> tokens) {
  GHT_EXPECTS(fd_ >= 0, "ShardWriter::append after close: " + path_);
  GHT_EXPECTS(count_ + static_cast<std::int64_t>(tokens.size()) <= std::numeric_limits<std::int32_t>::max(),
              "shard " + path_ + " would exceed 2^31-1 tokens (the header count is int32)");
  const std::size_t w = token_bytes(dtype_);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint32_t t = tokens[i];
    if (dtype_ == TokenDtype::u16) {
      GHT_EXPECTS(t <= 0xFFFF, "shard " + path_ + ": token " + std::to_string(t) + " at index " +
                                   std::to_string(count_ + static_cast<std::int64_t>(i)) +
                                   " does not fit uint16 (use uint32 shards)");
      const auto v = static_cast<std::uint16_t>(t);
      const auto* b = reinterpret_cast<const unsigned char*>(&v);
      buf_.insert(buf_.end(), b, b + w);
    } else {
      const auto* b = reinterpret_cast<const unsigned char*>(&t);
      buf_.insert(buf_.end(), b, b + w);
    }
    if (buf_.size() >= (1u << 20)) flush_buffer();
  }
  count_ += static_cast<std::int64_t>(tokens.size());
}

void ShardWriter::close() {
  GHT_EXPECTS(fd_ >= 0, "ShardWriter::close called twice: " + path_);
  flush_buffer();
  std::array<std::int32_t, kShardHeaderInts> h{};
  h[0] = kShardMagic;
  h[1] = dtype_ == TokenDtype::u16 ? kShardVersionU16 : kShardVersionU32;
  h[2] = static_cast<std::int32_t>(count_);
  if (::pwrite(fd_, h.data(), kShardHeaderBytes, 0) != static_cast<ssize_t>(kShardHeaderBytes)) {
    io_fail(tmp_path_, std::string("header write failed: ") + std::strerror(errno));
  }
  if (::fsync(fd_) != 0) io_fail(tmp_path_, std::string("fsync failed: ") + std::strerror(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) io_fail(tmp_path_, std::string("close failed: ") + std::strerror(errno));
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    io_fail(path_, std::string("cannot rename the temporary shard into place: ") +
                       std::strerror(errno));
  }
  fileio::fsync_dir(fs::path(path_).parent_path().string());
}

void write_shard(const std::string& path, std::span<const std::uint32_t> tokens, TokenDtype dtype) {
  ShardWriter w(path, dtype);
  w.append(tokens);
  w.close();
}

}  // namespace ght::trainer
