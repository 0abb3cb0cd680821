// A shard truncated while the loader uses it: the old loader mapped shards with mmap, and reading
// a page past the new end of file killed the process with SIGBUS. Shards are now read with pread
// into memory: the windows already loaded stay readable, and the next load of the shard is an
// io_error naming the file. This test crashes (SIGBUS) against the mmap loader.
#include <gtest/gtest.h>
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
