#pragma once
/**
 * @file file_io.hpp
 * @brief Small POSIX file helpers shared by shards, safetensors and checkpoints: durable writes
 * (fsync of the file and its directory), atomic replace, whole-file reads and XXH3-64 hashing.
 * Every failure throws ght::io_error naming the path and the system error.
 */
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ght::trainer::fileio {

/// Streaming XXH3-64 (libxxhash): update() with consecutive pieces, digest() at any point.
class Xxh3 {
 public:
  Xxh3();  ///< @throws std::bad_alloc
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void update(const void* data, std::size_t bytes) noexcept;
  [[nodiscard]] std::uint64_t digest() const noexcept;

 private:
  void* state_ = nullptr;  // XXH3_state_t*
};

/// A file opened for writing (created or truncated), optionally hashing what is written.
class OutFile {
 public:
  /// @throws ght::io_error naming `path` when it cannot be created
  explicit OutFile(std::string path, bool hash = false);
  ~OutFile();  ///< closes without fsync when close() was not called
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, std::size_t bytes);
  /// Write at an absolute offset (does not move the append position; not hashed).
  void pwrite(const void* data, std::size_t bytes, std::uint64_t offset);
  /// fsync and close. @throws ght::io_error
  void close();
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return bytes_; }
  /// XXH3-64 of everything passed to write() (requires hash = true).
  [[nodiscard]] std::uint64_t digest() const;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  std::unique_ptr<Xxh3> hash_;
};

/// fsync a directory so that renames and creations inside it are durable.
void fsync_dir(const std::string& dir);
/// Write `content` to `path` atomically: `<path>.tmp`, fsync, rename, fsync of the directory.
void atomic_write(const std::string& path, std::string_view content);
/// The whole file. @throws ght::io_error naming the path
[[nodiscard]] std::string read_all(const std::string& path);
/// XXH3-64 of a file's bytes, streamed; its size goes to *size when given.
[[nodiscard]] std::uint64_t xxh3_file(const std::string& path, std::uint64_t* size = nullptr);
[[nodiscard]] std::uint64_t xxh3(const void* data, std::size_t bytes) noexcept;
/// 16 lower-case hex digits.
[[nodiscard]] std::string hex64(std::uint64_t v);

}  // namespace ght::trainer::fileio
