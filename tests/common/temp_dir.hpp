#pragma once
/**
 * @file temp_dir.hpp
 * @brief Test helpers for file-based tests: a private temporary directory removed on scope exit,
 * and whole-file byte reads and writes (for corrupting files on purpose).
 */
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace ght::test {

/// mkdtemp under the system temp directory: unique per process and per instance.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "ght_test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string str() const { return path.string(); }
  [[nodiscard]] std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace ght::test
