#pragma once
/**
 * @file data_shard.hpp
 * @brief Internals of trainer/data.cpp shared with trainer/data_shard.cpp: file reading helpers,
 * a shard read whole into memory, and the check that a shard file is still the one that was read.
 */
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "trainer/data.hpp"

namespace ght::trainer::detail {

/// @throws ght::io_error "<path>: <what>"
[[noreturn]] void io_fail(const std::string& path, const std::string& what);

/// Size of a regular file. @throws ght::io_error naming the file when it cannot be stat'ed or is
/// not a regular file
[[nodiscard]] std::int64_t file_size_or_fail(const std::string& path);

/// Read exactly `bytes` at `offset`; returns fewer only at end of file. @throws ght::io_error
std::size_t pread_full(int fd, void* dst, std::size_t bytes, std::int64_t offset, const std::string& path);

/// A read-only descriptor closed on scope exit. @throws ght::io_error naming the file
struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path);
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

/// What identifies the contents of a file: a rewrite or a replacement changes one of these.
struct FileStamp {
  std::int64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::uint64_t inode = 0, device = 0;
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

/// Bytes of a valid shard with this header: the header and the tokens.
[[nodiscard]] std::int64_t shard_bytes(const ShardInfo& info) noexcept;

/**
 * @brief The stamp of a shard the loader uses, after checking that its size is still the one
 * its header gave when the loader was built.
 * @throws ght::io_error naming the file, its expected and its current size (or why it cannot be
 *         stat'ed) and the way out: restore the file, or re-run `ght prep` and start a new run
 */
[[nodiscard]] FileStamp stamp_of_shard(const ShardInfo& expected);

/**
 * @brief A whole shard read into memory; tokens start after the header. Read with pread rather
 * than mapped: a shard truncated while the run uses it (a re-prep in another shell, a full disk)
 * must give an error naming the file, and a mapping would kill the process with SIGBUS on the
 * first page past the new end.
 */
class LoadedShard {
 public:
  LoadedShard() = default;
  /// @throws ght::io_error naming the file when it holds fewer bytes than `info` says
  explicit LoadedShard(const ShardInfo& info);
  [[nodiscard]] std::uint32_t at(std::int64_t i) const {
    const unsigned char* p = data_.data() + kShardHeaderBytes;
    if (info_.dtype == TokenDtype::u16) {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  /// @throws ght::io_error naming the file, the token's index and value when one is >= vocab
  void validate(int vocab) const;
  [[nodiscard]] const ShardInfo& info() const { return info_; }
  /// The file as it was before it was read.
  [[nodiscard]] const FileStamp& stamp() const { return stamp_; }

 private:
  ShardInfo info_;
  FileStamp stamp_;
  std::vector<unsigned char> data_;
};

}  // namespace ght::trainer::detail
