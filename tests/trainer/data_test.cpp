// Token shards (llm.c format), validation errors, the seeded resumable loader and `ght prep`'s
// core (text and token arrays, .npy parsing).
#include "trainer/data.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;

namespace {

using ght::test::error_of;
using ght::test::read_bytes;
using ght::test::write_bytes;

// One directory per test, removed on scope exit.
struct TempDir : ght::test::TempDir {
  TempDir() : ght::test::TempDir("ght_data_test") {}
};

std::vector<std::uint32_t> random_tokens(std::size_t n, std::uint32_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % vocab;
  return t;
}

std::int32_t header_int(const std::string& bytes, int i) {
  std::int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

void set_header_int(std::string& bytes, int i, std::int32_t v) { std::memcpy(bytes.data() + 4 * i, &v, 4); }

// A .npy file (format 1.0) holding `payload` with the given header dict text.
std::string npy(const std::string& dict, const std::string& payload) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xFF);
  out += static_cast<char>(h.size() >> 8);
  return out + h + payload;
}

template <class T>
std::string raw_array(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

// ---- shard format ---------------------------------------------------------------------------

TEST(Shard, Uint16RoundTripMatchesLlmcLayout) {
  TempDir d;
  const auto tok = random_tokens(5000, 65536, 1);
  write_shard(d / "a.bin", tok, TokenDtype::u16);
  const std::string bytes = read_bytes(d / "a.bin");
  ASSERT_EQ(bytes.size(), 1024u + 2 * tok.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 5000);
  for (int i = 3; i < 256; ++i) ASSERT_EQ(header_int(bytes, i), 0) << i;
  std::uint16_t first;
  std::memcpy(&first, bytes.data() + 1024, 2);
  EXPECT_EQ(first, tok[0]);

  const ShardInfo info = read_shard_info(d / "a.bin");
  EXPECT_EQ(info.dtype, TokenDtype::u16);
  EXPECT_EQ(info.tokens, 5000);
  EXPECT_EQ(read_shard(d / "a.bin", 65536), tok);
  EXPECT_FALSE(fs::exists(d / "a.bin.tmp"));
}

TEST(Shard, Uint32VariantIsVersion2) {
  TempDir d;
  auto tok = random_tokens(3000, 151936, 2);
  tok[17] = 151935;
  write_shard(d / "b.bin", tok, TokenDtype::u32);
  const std::string bytes = read_bytes(d / "b.bin");
  ASSERT_EQ(bytes.size(), 1024u + 4 * tok.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 2);
  EXPECT_EQ(read_shard_info(d / "b.bin").dtype, TokenDtype::u32);
  EXPECT_EQ(read_shard(d / "b.bin", 151936), tok);
}

TEST(Shard, AcceptsLlmcLlama3Header) {
  TempDir d;
  const auto tok = random_tokens(100, 128256, 3);
  std::string bytes(1024, '\0');
  set_header_int(bytes, 0, 20240801);
  set_header_int(bytes, 1, 7);
  set_header_int(bytes, 2, 100);
  bytes += raw_array(tok);
  write_bytes(d / "l3.bin", bytes);
  EXPECT_EQ(read_shard_info(d / "l3.bin").dtype, TokenDtype::u32);
  EXPECT_EQ(read_shard(d / "l3.bin", 128256), tok);
}

TEST(Shard, EmptyShardIsValid) {
  TempDir d;
  write_shard(d / "e.bin", {}, TokenDtype::u16);
  EXPECT_EQ(read_shard_info(d / "e.bin").tokens, 0);
  EXPECT_TRUE(read_shard(d / "e.bin", 256).empty());
}

TEST(ShardErrors, BadMagicNamesTheFile) {
  TempDir d;
  write_shard(d / "m.bin", random_tokens(10, 256, 4), TokenDtype::u16);
  std::string bytes = read_bytes(d / "m.bin");
  set_header_int(bytes, 0, 12345);
  write_bytes(d / "m.bin", bytes);
  const std::string msg = error_of<ght::io_error>([&] { (void)read_shard_info(d / "m.bin"); });
  EXPECT_CONTAINS(msg, d / "m.bin");
  EXPECT_CONTAINS(msg, "bad magic 12345");
  EXPECT_CONTAINS(msg, "20240520");
}

TEST(ShardErrors, UnsupportedVersion) {
  TempDir d;
  write_shard(d / "v.bin", random_tokens(10, 256, 5), TokenDtype::u16);
  std::string bytes = read_bytes(d / "v.bin");
  set_header_int(bytes, 1, 3);
  write_bytes(d / "v.bin", bytes);
  const std::string msg = error_of<ght::io_error>([&] { (void)read_shard(d / "v.bin", 256); });
  EXPECT_CONTAINS(msg, d / "v.bin");
  EXPECT_CONTAINS(msg, "version 3");
}

TEST(ShardErrors, TruncatedBodyAndTrailingBytes) {
  TempDir d;
  write_shard(d / "t.bin", random_tokens(100, 256, 6), TokenDtype::u16);
  std::string bytes = read_bytes(d / "t.bin");
  write_bytes(d / "t.bin", bytes.substr(0, bytes.size() - 1));
  std::string msg = error_of<ght::io_error>([&] { (void)read_shard_info(d / "t.bin"); });
  EXPECT_CONTAINS(msg, d / "t.bin");
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "100 uint16 tokens");

  write_bytes(d / "t.bin", bytes + "xy");
  msg = error_of<ght::io_error>([&] { (void)read_shard_info(d / "t.bin"); });
  EXPECT_CONTAINS(msg, "trailing bytes");

  write_bytes(d / "t.bin", bytes.substr(0, 100));
  msg = error_of<ght::io_error>([&] { (void)read_shard_info(d / "t.bin"); });
  EXPECT_CONTAINS(msg, "truncated shard header");
}

TEST(ShardErrors, OutOfRangeTokenNamesFileIndexAndValue) {
  TempDir d;
  auto tok = random_tokens(200, 256, 7);
  tok[137] = 300;
  write_shard(d / "r.bin", tok, TokenDtype::u16);
  const std::string msg = error_of<ght::io_error>([&] { (void)read_shard(d / "r.bin", 256); });
  EXPECT_CONTAINS(msg, d / "r.bin");
  EXPECT_CONTAINS(msg, "token 137");
  EXPECT_CONTAINS(msg, "id 300");
  // The loader checks when it loads the shard.
  DataLoader dl(std::vector<std::string>{d / "r.bin"}, {.batch = 1, .seq_len = 8, .seed = 1, .vocab = 256});
  const std::string msg2 = error_of<ght::io_error>([&] { (void)dl.next(); });
  EXPECT_CONTAINS(msg2, "token 137");
  // With a larger vocabulary the same shard is fine.
  EXPECT_EQ(read_shard(d / "r.bin", 512), tok);
}

TEST(ShardErrors, WriterRejectsTokensThatDoNotFitUint16) {
  TempDir d;
  const std::vector<std::uint32_t> tok = {1, 2, 70000};
  const std::string msg = error_of<ght::logic_error>([&] { write_shard(d / "w.bin", tok, TokenDtype::u16); });
  EXPECT_CONTAINS(msg, "70000");
  EXPECT_CONTAINS(msg, "index 2");
  EXPECT_FALSE(fs::exists(d / "w.bin"));
  EXPECT_FALSE(fs::exists(d / "w.bin.tmp"));  // the abandoned temporary is removed
}

TEST(ShardErrors, MissingFile) {
  const std::string msg = error_of<ght::io_error>([] { (void)read_shard_info("/nonexistent/x.bin"); });
  EXPECT_CONTAINS(msg, "/nonexistent/x.bin");
}

// ---- listing and splits -----------------------------------------------------------------------

TEST(ShardList, DirectoryGlobAndFile) {
  TempDir d;
  for (const char* n : {"b.bin", "a.bin", "c.txt"}) write_bytes(d / n, "x");
  EXPECT_EQ(list_shards(d.path.string()), (std::vector<std::string>{d / "a.bin", d / "b.bin"}));
  EXPECT_EQ(list_shards(d / "b*.bin"), (std::vector<std::string>{d / "b.bin"}));
  EXPECT_EQ(list_shards(d / "a.bin"), (std::vector<std::string>{d / "a.bin"}));
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)list_shards(d / "z*.bin"); }), "no shard file matches");
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)list_shards(d / "none.bin"); }), "none.bin");
}

TEST(ShardList, ResolveSplit) {
  TempDir d;
  fs::create_directory(d.path / "prep");
  fs::create_directory(d.path / "plain");
  fs::create_directory(d.path / "trainonly");
  for (const char* n : {"prep/train_000000.bin", "prep/train_000001.bin", "prep/val_000000.bin",
                        "plain/s0.bin", "plain/s1.bin", "plain/s2.bin", "trainonly/train_000000.bin",
                        "trainonly/train_000001.bin"}) {
    write_bytes(d / n, "x");
  }
  auto s = resolve_split(d / "prep");
  EXPECT_EQ(s.train, (std::vector<std::string>{d / "prep/train_000000.bin", d / "prep/train_000001.bin"}));
  EXPECT_EQ(s.val, (std::vector<std::string>{d / "prep/val_000000.bin"}));
  s = resolve_split(d / "plain");  // the last shard is held out
  EXPECT_EQ(s.train, (std::vector<std::string>{d / "plain/s0.bin", d / "plain/s1.bin"}));
  EXPECT_EQ(s.val, (std::vector<std::string>{d / "plain/s2.bin"}));
  s = resolve_split(d / "trainonly");  // prep with --val-fraction 0: no held-out data
  EXPECT_EQ(s.train.size(), 2u);
  EXPECT_TRUE(s.val.empty());
  s = resolve_split(d / "plain/s1.bin");
  EXPECT_EQ(s.train.size(), 1u);
  EXPECT_TRUE(s.val.empty());
}

// ---- loader -----------------------------------------------------------------------------------

namespace {
// Shards whose token value is a unique position code: shard k, position i -> k * 100000 + i.
std::vector<std::string> position_shards(const TempDir& d, const std::vector<int>& sizes) {
  std::vector<std::string> paths;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::uint32_t> t(static_cast<std::size_t>(sizes[k]));
    for (int i = 0; i < sizes[k]; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(k * 100000 + i);
    paths.push_back(d / ("pos_" + std::to_string(k) + ".bin"));
    write_shard(paths.back(), t, TokenDtype::u32);
  }
  return paths;
}
constexpr int kPosVocab = 1 << 20;
}  // namespace

TEST(DataLoader, WindowsAreShiftedPairsAndEachEpochCoversEveryWindowOnce) {
  TempDir d;
  const auto paths = position_shards(d, {1001, 457, 30, 5});  // the last has no window of 17+1
  const int B = 3, T = 16;
  DataLoader dl(paths, {.batch = B, .seq_len = T, .seed = 42, .vocab = kPosVocab});
  EXPECT_EQ(dl.windows_per_epoch(), 1000 / 16 + 456 / 16 + 29 / 16 + 0);
  EXPECT_EQ(dl.tokens_per_epoch(), 1001 + 457 + 30 + 5);
  const std::int64_t W = dl.windows_per_epoch();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<std::int32_t> starts;
    // W is not a multiple of B; take exactly W windows by reading whole batches and counting.
    while (static_cast<std::int64_t>(starts.size()) + B <= W) {
      const Batch b = dl.next();
      ASSERT_EQ(b.inputs.size(), static_cast<std::size_t>(B * T));
      EXPECT_TRUE(b.doc_ids.empty());
      for (int r = 0; r < B; ++r) {
        const std::int32_t s = b.inputs[static_cast<std::size_t>(r * T)];
        EXPECT_EQ((s % 100000) % T, 0) << "window starts at a multiple of T";
        for (int t = 0; t < T; ++t) {
          ASSERT_EQ(b.inputs[static_cast<std::size_t>(r * T + t)], s + t);
          ASSERT_EQ(b.targets[static_cast<std::size_t>(r * T + t)], s + t + 1);
        }
        starts.insert(s);
      }
    }
    // Finish the epoch one window at a time with a B=1 loader restored at the same position.
    DataLoader one(paths, {.batch = 1, .seq_len = T, .seed = 42, .vocab = kPosVocab});
    one.restore(dl.state());
    while (static_cast<std::int64_t>(starts.size()) < W) starts.insert(one.next().inputs[0]);
    dl.restore(one.state());
    std::set<std::int32_t> unique(starts.begin(), starts.end());
    EXPECT_EQ(unique.size(), starts.size()) << "a window repeated within epoch " << epoch;
    EXPECT_EQ(static_cast<std::int64_t>(unique.size()), W);
    EXPECT_EQ(dl.state().epoch, epoch) << "the epoch ends exactly after W windows";
  }
}

TEST(DataLoader, SameSeedSameOrderDifferentSeedDifferentOrder) {
  TempDir d;
  const auto paths = position_shards(d, {3000, 2000, 1000});
  LoaderOptions o{.batch = 4, .seq_len = 32, .seed = 7, .vocab = kPosVocab};
  DataLoader a(paths, o), b(paths, o);
  o.seed = 8;
  DataLoader c(paths, o);
  bool any_diff = false;
  for (int i = 0; i < 100; ++i) {  // 100 batches = more than two epochs of 184 windows
    const Batch x = a.next(), y = b.next(), z = c.next();
    ASSERT_EQ(x.inputs, y.inputs) << "batch " << i;
    any_diff = any_diff || x.inputs != z.inputs;
  }
  EXPECT_TRUE(any_diff);
  EXPECT_GE(a.state().epoch, 2);
}

TEST(DataLoader, ShuffleReordersWindowsAndEpochsDiffer) {
  TempDir d;
  const auto paths = position_shards(d, {4097});
  DataLoader dl(paths, {.batch = 256, .seq_len = 16, .seed = 3, .vocab = kPosVocab});
  const Batch e0 = dl.next();
  const Batch e1 = dl.next();
  std::vector<std::int32_t> s0, s1;
  for (int r = 0; r < 256; ++r) {
    s0.push_back(e0.inputs[static_cast<std::size_t>(r * 16)]);
    s1.push_back(e1.inputs[static_cast<std::size_t>(r * 16)]);
  }
  EXPECT_FALSE(std::is_sorted(s0.begin(), s0.end()));
  EXPECT_NE(s0, s1) << "each epoch has its own window order";
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  EXPECT_EQ(s0, s1);
}

TEST(DataLoader, NoShuffleReadsInFileOrder) {
  TempDir d;
  const auto paths = position_shards(d, {65, 33});
  DataLoader dl(paths, {.batch = 6, .seq_len = 16, .seed = 3, .vocab = kPosVocab, .shuffle = false});
  const Batch b = dl.next();
  const std::vector<std::int32_t> want = {0, 16, 32, 48, 100000, 100016};
  for (int r = 0; r < 6; ++r) EXPECT_EQ(b.inputs[static_cast<std::size_t>(r * 16)], want[static_cast<std::size_t>(r)]);
  // Then it wraps around to the start (epoch 1).
  EXPECT_EQ(dl.next().inputs[0], 0);
  dl.reset();
  EXPECT_EQ(dl.next().inputs, b.inputs);
}

TEST(DataLoader, ResumeFromSerialisedStateIsExact) {
  TempDir d;
  const auto paths = position_shards(d, {2500, 1300, 800});
  const LoaderOptions o{.batch = 5, .seq_len = 24, .seed = 99, .vocab = kPosVocab};
  DataLoader straight(paths, o);
  std::vector<Batch> want;
  for (int i = 0; i < 60; ++i) want.push_back(straight.next());  // crosses two epoch boundaries

  for (const int split : {0, 1, 7, 19, 20, 37, 59}) {
    DataLoader first(paths, o);
    for (int i = 0; i < split; ++i) (void)first.next();
    const std::string saved = first.state().to_json().dump();
    DataLoader second(paths, o);  // a fresh process, in effect
    second.restore(LoaderState::from_json(nlohmann::json::parse(saved)));
    EXPECT_EQ(second.state(), first.state());
    for (int i = split; i < 60; ++i) ASSERT_EQ(second.next().inputs, want[static_cast<std::size_t>(i)].inputs) << "split " << split << " batch " << i;
  }
}

TEST(DataLoader, StateCarriesTheSeed) {
  TempDir d;
  const auto paths = position_shards(d, {3000});
  DataLoader a(paths, {.batch = 2, .seq_len = 8, .seed = 1234, .vocab = kPosVocab});
  (void)a.next();
  const LoaderState s = a.state();
  EXPECT_EQ(s.seed, 1234u);
  // A loader built with another seed follows the restored one.
  DataLoader b(paths, {.batch = 2, .seq_len = 8, .seed = 1, .vocab = kPosVocab});
  b.restore(s);
  EXPECT_EQ(b.next().inputs, a.next().inputs);
}

TEST(DataLoader, BadStatesAndOptions) {
  TempDir d;
  const auto paths = position_shards(d, {100});
  DataLoader dl(paths, {.batch = 1, .seq_len = 8, .seed = 1, .vocab = kPosVocab});
  EXPECT_THROW(dl.restore({0, 5, 0, 1}), ght::logic_error);   // only one shard
  EXPECT_THROW(dl.restore({0, 0, 13, 1}), ght::logic_error);  // 12 windows
  EXPECT_NO_THROW(dl.restore({3, 0, 12, 1}));                  // exhausted shard: moves on
  EXPECT_EQ(dl.next().inputs[0] % 8, 0);
  EXPECT_THROW((void)LoaderState::from_json(nlohmann::json{{"epoch", 0}, {"shard", 0}}), ght::logic_error);
  EXPECT_THROW((void)LoaderState::from_json(nlohmann::json{{"epoch", 0}, {"shard", 0}, {"index", "x"}, {"seed", 1}}),
               ght::logic_error);
  const std::string msg = error_of<ght::logic_error>(
      [&] { DataLoader x(paths, {.batch = 1, .seq_len = 100, .seed = 1, .vocab = kPosVocab}); });
  EXPECT_CONTAINS(msg, "seq_len+1 = 101");
  EXPECT_THROW(DataLoader(paths, {.batch = 0, .seq_len = 8}), ght::logic_error);
  EXPECT_THROW(DataLoader(std::vector<std::string>{}, {}), ght::io_error);
}

TEST(DataLoader, DocumentIdsCountEotTokensPerRow) {
  TempDir d;
  // EOT (0) starts each document: documents of length 5, 3 and the rest.
  std::vector<std::uint32_t> t = {0, 'a', 'b', 'c', 'd', 0, 'e', 'f', 0, 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n'};
  write_shard(d / "doc.bin", t, TokenDtype::u16);
  DataLoader dl(std::vector<std::string>{d / "doc.bin"},
                {.batch = 1, .seq_len = 16, .seed = 1, .vocab = 256, .shuffle = false, .eot = 0});
  const Batch b = dl.next();
  const std::vector<std::int32_t> want = {1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  EXPECT_EQ(b.doc_ids, want);
}

// ---- prep: text -----------------------------------------------------------------------------

TEST(PrepText, DirectoryOfTextFilesToTrainAndValShards) {
  TempDir d;
  fs::create_directories(d.path / "in/sub");
  const std::string a = "First document.\nSecond line.\n";
  const std::string b = "Another text, with caf\xC3\xA9.\n";
  write_bytes(d / "in/a.txt", a);
  write_bytes(d / "in/sub/b.txt", b);
  write_bytes(d / "in/notes.md", "not text input");
  write_bytes(d / "in/.hidden.txt", "hidden");
  PrepOptions o;
  o.out_dir = d / "out";
  o.val_fraction = 0.2;
  o.shard_tokens = 16;
  std::int64_t last_done = -1, last_total = -1;
  o.progress = [&](std::int64_t done, std::int64_t total) { last_done = done; last_total = total; };
  const PrepResult r = prep_text({d / "in"}, o);

  std::vector<std::uint32_t> want = {0};
  for (char c : a) want.push_back(static_cast<unsigned char>(c));
  want.push_back(0);
  for (char c : b) want.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.tokens, static_cast<std::int64_t>(want.size()));
  EXPECT_EQ(last_done, static_cast<std::int64_t>(a.size() + b.size()));
  EXPECT_EQ(last_total, last_done);

  std::vector<std::uint32_t> got;
  std::int64_t val_tokens = 0;
  for (const auto& s : r.train) {
    EXPECT_LE(s.tokens, 16);
    auto t = read_shard(s.path, 256);
    got.insert(got.end(), t.begin(), t.end());
  }
  for (const auto& s : r.val) {
    auto t = read_shard(s.path, 256);
    val_tokens += s.tokens;
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got, want) << "train then val shards hold the token stream in order";
  EXPECT_EQ(val_tokens, std::llround(0.2 * static_cast<double>(want.size())));
  EXPECT_EQ(fs::path(r.train.front().path).filename(), "train_000000.bin");
  EXPECT_EQ(fs::path(r.val.front().path).filename(), "val_000000.bin");
  const auto m = nlohmann::json::parse(read_bytes(d / "out/prep.json"));
  EXPECT_EQ(m["tokenizer"], "byte");
  EXPECT_EQ(m["eot"], 0);
  EXPECT_EQ(m["tokens"], r.tokens);
  EXPECT_EQ(m["train"].size(), r.train.size());

  // resolve_split sees the same layout, and the decoded stream is the text.
  const DataSplit split = resolve_split(o.out_dir);
  EXPECT_EQ(split.train.size(), r.train.size());
  EXPECT_EQ(split.val.size(), r.val.size());
  EXPECT_EQ(ByteTokenizer::decode(got, true), a + b);
}

TEST(PrepText, RefusesToMixWithOldShardsUnlessOverwrite) {
  TempDir d;
  write_bytes(d / "t.txt", "hello world, hello world");
  PrepOptions o;
  o.out_dir = d / "out";
  o.shard_tokens = 5;
  o.val_fraction = 0;
  const auto r1 = prep_text({d / "t.txt"}, o);
  EXPECT_EQ(r1.train.size(), 5u);  // 25 tokens
  EXPECT_TRUE(r1.val.empty());
  const std::string msg = error_of<ght::io_error>([&] { (void)prep_text({d / "t.txt"}, o); });
  EXPECT_CONTAINS(msg, "--overwrite");
  o.overwrite = true;
  o.shard_tokens = 100;
  const auto r2 = prep_text({d / "t.txt"}, o);
  EXPECT_EQ(r2.train.size(), 1u);
  EXPECT_EQ(list_shards(o.out_dir).size(), 1u) << "old shards were removed";
}

TEST(PrepText, InputErrorsNameTheFile) {
  TempDir d;
  write_bytes(d / "bin.txt", std::string("abc\0def", 7));
  PrepOptions o;
  o.out_dir = d / "out";
  std::string msg = error_of<ght::io_error>([&] { (void)prep_text({d / "bin.txt"}, o); });
  EXPECT_CONTAINS(msg, d / "bin.txt");
  EXPECT_CONTAINS(msg, "NUL byte at offset 3");
  msg = error_of<ght::io_error>([&] { (void)prep_text({d / "missing.txt"}, o); });
  EXPECT_CONTAINS(msg, d / "missing.txt");
  fs::create_directory(d.path / "empty");
  msg = error_of<ght::io_error>([&] { (void)prep_text({d / "empty"}, o); });
  EXPECT_CONTAINS(msg, "no *.txt");
  o.val_fraction = 1.0;
  EXPECT_THROW((void)prep_text({d / "bin.txt"}, o), ght::logic_error);
}

// ---- prep: token arrays and .npy -----------------------------------------------------------

TEST(Npy, ParsesHeaderVariants) {
  TempDir d;
  const std::vector<std::uint16_t> v = {5, 6, 7};
  write_bytes(d / "a.npy", npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", raw_array(v)));
  NpyInfo i = read_npy_info(d / "a.npy");
  EXPECT_EQ(i.dtype, ArrayDtype::u16);
  EXPECT_EQ(i.count, 3);
  EXPECT_EQ(i.data_offset % 64, 0);  // numpy pads the header to a multiple of 64 bytes
  EXPECT_EQ(i.data_offset + 6, static_cast<std::int64_t>(fs::file_size(d / "a.npy")));
  const std::vector<std::int32_t> w = {1, 2};
  write_bytes(d / "b.npy", npy("{'descr':'<i4','fortran_order':False,'shape':(2,)}", raw_array(w)));
  i = read_npy_info(d / "b.npy");
  EXPECT_EQ(i.dtype, ArrayDtype::i32);
  EXPECT_EQ(i.count, 2);
}

TEST(Npy, RejectsWhatItCannotWrap) {
  TempDir d;
  const std::string four(16, '\0');
  auto err = [&](const std::string& dict, const std::string& payload) {
    write_bytes(d / "x.npy", npy(dict, payload));
    return error_of<ght::io_error>([&] { (void)read_npy_info(d / "x.npy"); });
  };
  EXPECT_CONTAINS(err("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four), "unsupported .npy dtype '<f4'");
  EXPECT_CONTAINS(err("{'descr': '>u2', 'fortran_order': False, 'shape': (8,), }", four), "'>u2'");
  EXPECT_CONTAINS(err("{'descr': '<u4', 'fortran_order': False, 'shape': (2, 2), }", four), "must be 1-D");
  EXPECT_CONTAINS(err("{'descr': '<u4', 'fortran_order': True, 'shape': (4,), }", four), "Fortran");
  EXPECT_CONTAINS(err("{'descr': '<u4', 'fortran_order': False, 'shape': (5,), }", four), "truncated");
  EXPECT_CONTAINS(err("{'descr': '<u4', 'fortran_order': False, 'shape': (3,), }", four), "trailing");
  write_bytes(d / "y.npy", "not numpy at all");
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)read_npy_info(d / "y.npy"); }), "bad magic");
}

TEST(PrepTokens, WrapsNpyAndRawArrays) {
  TempDir d;
  std::vector<std::uint32_t> u4 = {0, 70000, 12, 151935};
  write_bytes(d / "a.npy", npy("{'descr': '<u4', 'fortran_order': False, 'shape': (4,), }", raw_array(u4)));
  std::vector<std::uint32_t> raw = {1, 2, 3, 4, 5, 6};
  write_bytes(d / "b.raw", raw_array(raw));
  PrepOptions o;
  o.out_dir = d / "out";
  o.val_fraction = 0.5;
  o.dtype = TokenDtype::u32;
  o.vocab = 151936;
  const PrepResult r = prep_tokens({d / "a.npy", d / "b.raw"}, ArrayDtype::u32, o);
  EXPECT_EQ(r.tokens, 10);
  ASSERT_EQ(r.train.size(), 1u);
  ASSERT_EQ(r.val.size(), 1u);
  EXPECT_EQ(read_shard(r.train[0].path, 151936), (std::vector<std::uint32_t>{0, 70000, 12, 151935, 1}));
  EXPECT_EQ(read_shard(r.val[0].path, 151936), (std::vector<std::uint32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(read_shard_info(r.train[0].path).dtype, TokenDtype::u32);
}

TEST(PrepTokens, ValueErrorsNameFileIndexAndValue) {
  TempDir d;
  PrepOptions o;
  o.out_dir = d / "out";
  o.val_fraction = 0;
  std::vector<std::int32_t> neg = {3, 4, -5};
  write_bytes(d / "neg.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", raw_array(neg)));
  std::string msg = error_of<ght::io_error>([&] { (void)prep_tokens({d / "neg.npy"}, ArrayDtype::u16, o); });
  EXPECT_CONTAINS(msg, d / "neg.npy");
  EXPECT_CONTAINS(msg, "token 2 is negative (-5)");

  std::vector<std::uint32_t> big = {1, 65536};
  write_bytes(d / "big.npy", npy("{'descr': '<u4', 'fortran_order': False, 'shape': (2,), }", raw_array(big)));
  o.dtype = TokenDtype::u16;
  o.overwrite = true;
  msg = error_of<ght::io_error>([&] { (void)prep_tokens({d / "big.npy"}, ArrayDtype::u16, o); });
  EXPECT_CONTAINS(msg, "token 1 has id 65536");
  EXPECT_CONTAINS(msg, "--dtype uint32");

  std::vector<std::uint16_t> v = {1, 2, 300};
  write_bytes(d / "v.raw", raw_array(v));
  o.vocab = 256;
  msg = error_of<ght::io_error>([&] { (void)prep_tokens({d / "v.raw"}, ArrayDtype::u16, o); });
  EXPECT_CONTAINS(msg, "token 2 has id 300");

  write_bytes(d / "odd.raw", "abc");
  msg = error_of<ght::io_error>([&] { (void)prep_tokens({d / "odd.raw"}, ArrayDtype::u16, o); });
  EXPECT_CONTAINS(msg, "not a multiple of 2");
}
