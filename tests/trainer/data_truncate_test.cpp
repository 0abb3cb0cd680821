// A shard truncated while the loader uses it: the old loader mapped shards with mmap, and reading
// a page past the new end of file killed the process with SIGBUS. Shards are now read with pread
// into memory: the windows already loaded stay readable, and the next load of the shard is an
// io_error naming the file. This test crashes (SIGBUS) against the mmap loader.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/data.hpp"

namespace ght::trainer {
namespace {

std::vector<std::uint32_t> random_tokens(std::size_t n, std::uint32_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % vocab;
  return t;
}

TEST(DataLoaderTruncation, ShardTruncatedInUseIsAnErrorNamingTheFileNotACrash) {
  ght::test::TempDir dir("ght_data_truncate");
  // Many pages per shard, so the windows read after the truncation lie far past the new end.
  const std::size_t n = 64 * 1024;
  const std::string a = dir / "a.bin", b = dir / "b.bin";
  write_shard(a, random_tokens(n, 256, 1), TokenDtype::u16);
  write_shard(b, random_tokens(n, 256, 2), TokenDtype::u16);
  LoaderOptions opt;
  opt.batch = 4;
  opt.seq_len = 64;
  opt.vocab = 256;
  DataLoader loader(std::vector<std::string>{a, b}, opt);
  Batch first = loader.next();  // loads whichever shard comes first in this epoch's order
  ASSERT_EQ(first.inputs.size(), 4u * 64u);

  // Truncate every shard to its header only: the one in use and the one to come.
  for (const auto& p : {a, b}) {
    ASSERT_EQ(::truncate(p.c_str(), 1024), 0);
  }
  // Read on: the remaining windows of the loaded shard, then the next shard's load must fail with
  // an io_error that names a truncated file.
  const std::int64_t batches = 2 * loader.windows_per_epoch() / opt.batch + 2;
  std::string error;
  for (std::int64_t i = 0; i < batches && error.empty(); ++i) {
    try {
      Batch x = loader.next();
      ASSERT_EQ(x.inputs.size(), 4u * 64u);
    } catch (const ght::io_error& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "reading truncated shards never failed";
  EXPECT_TRUE(error.find(a) != std::string::npos || error.find(b) != std::string::npos) << error;
}

TEST(DataLoaderTruncation, ReadShardOfATruncatedFileNamesIt) {
  ght::test::TempDir dir("ght_data_truncate");
  const std::string a = dir / "a.bin";
  write_shard(a, random_tokens(10000, 256, 3), TokenDtype::u16);
  ASSERT_EQ(::truncate(a.c_str(), 4096), 0);
  const std::string msg = ght::test::error_of<ght::io_error>([&] { (void)read_shard(a, 256); });
  EXPECT_CONTAINS(msg, a);
}

}  // namespace
}  // namespace ght::trainer

namespace ght::trainer {
namespace {

// A single shard is loaded once and then reused: every epoch wrap checks that the file is still
// the one read, so a truncation is an error naming the file, both sizes and the way out.
TEST(DataLoaderTruncation, SingleShardTruncatedIsAnErrorAtTheNextEpoch) {
  ght::test::TempDir dir("ght_data_truncate");
  const std::string a = dir / "a.bin";
  write_shard(a, random_tokens(4097, 256, 4), TokenDtype::u16);  // 64 windows of 64+1 tokens
  LoaderOptions opt;
  opt.batch = 4;
  opt.seq_len = 64;
  opt.vocab = 256;
  DataLoader loader(dir.str(), opt);
  ASSERT_EQ(loader.windows_per_epoch(), 64);
  (void)loader.next();
  ASSERT_EQ(::truncate(a.c_str(), 2048), 0);
  std::string error;
  for (int i = 0; i < 3 * 16 && error.empty(); ++i) {
    try {
      (void)loader.next();
    } catch (const ght::io_error& e) {
      error = e.what();
      EXPECT_GE(loader.state().epoch, 1) << "failed before the epoch wrap: " << error;
    }
  }
  ASSERT_FALSE(error.empty()) << "the truncated single shard was never re-checked";
  EXPECT_CONTAINS(error, a);
  EXPECT_CONTAINS(error, "expected 9218 bytes");  // 1024 + 4097 * 2
  EXPECT_CONTAINS(error, "now 2048 bytes");
  EXPECT_CONTAINS(error, "ght prep");
}

// A rewrite that keeps the size (a re-prep with the same token count) is read again, not an error.
TEST(DataLoaderTruncation, SingleShardRewrittenWithTheSameSizeIsReadAgain) {
  ght::test::TempDir dir("ght_data_truncate");
  const std::string a = dir / "a.bin";
  write_shard(a, std::vector<std::uint32_t>(129, 7), TokenDtype::u16);
  LoaderOptions opt;
  opt.batch = 2;
  opt.seq_len = 64;
  opt.vocab = 256;
  opt.shuffle = false;
  DataLoader loader(std::vector<std::string>{a}, opt);
  EXPECT_EQ(loader.next().inputs.front(), 7);
  // A new file renamed over the old one; the old one stays open, so its inode is not reused.
  const int old_fd = ::open(a.c_str(), O_RDONLY);
  ASSERT_GE(old_fd, 0);
  write_shard(a, std::vector<std::uint32_t>(129, 9), TokenDtype::u16);
  ::close(old_fd);
  EXPECT_EQ(loader.next().inputs.front(), 9);
}

}  // namespace
}  // namespace ght::trainer
