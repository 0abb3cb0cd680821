#include "trainer/data.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "tier/error.hpp"
#include "trainer/detail/data_shard.hpp"
#include "trainer/file_io.hpp"
#include "trainer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

static_assert(std::endian::native == std::endian::little,
              "shards and .npy arrays are read as little-endian in place");

using detail::Fd;
using detail::file_size_or_fail;
using detail::io_fail;
using detail::LoadedShard;
using detail::pread_full;

namespace {

std::atomic<std::int64_t> g_fill_fault{-1};  // fail_next_fill_after_for_testing

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::uint64_t order_seed(std::uint64_t seed, std::int64_t epoch, std::int64_t shard) {
  std::uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<std::uint64_t>(epoch));
  return splitmix64(h ^ static_cast<std::uint64_t>(shard));
}

// Fisher-Yates with mt19937_64 and a modulo draw: std::shuffle's algorithm is unspecified, so it
// would give a different order on another standard library.
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed, bool shuffle) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  if (!shuffle || n < 2) return p;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

// The links of a path that loop, as "a -> b -> a": from the first of its prefixes whose
// resolution fails with ELOOP, each link's target in turn until one repeats.
std::string symlink_loop(const std::string& path) {
  fs::path start;
  fs::path prefix;
  std::error_code ec;
  for (const auto& part : fs::path(path)) {
    prefix /= part;
    if (!fs::is_symlink(prefix, ec)) continue;
    (void)fs::status(prefix, ec);
    if (ec.value() == ELOOP) {
      start = prefix;
      break;
    }
  }
  if (start.empty()) return path;
  std::vector<fs::path> seen{start.lexically_normal()};
  std::string chain = start.string();
  for (fs::path at = start; seen.size() < 40;) {
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) break;
    at = target.is_absolute() ? target : at.parent_path() / target;
    chain += " -> " + at.lexically_normal().string();
    if (std::find(seen.begin(), seen.end(), at.lexically_normal()) != seen.end()) break;
    seen.push_back(at.lexically_normal());
    if (!fs::is_symlink(at, ec)) break;
  }
  return chain;
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> dir_files(const std::string& dir, const std::string& prefix,
                                   const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name.starts_with(".")) continue;
    if (!prefix.empty() && !name.starts_with(prefix)) continue;
    if (e.path().extension() != ext) continue;
    out.push_back(e.path().string());
  }
  if (ec) io_fail(dir, "cannot list directory: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// ---- dtype names --------------------------------------------------------------------------------

std::size_t token_bytes(TokenDtype d) noexcept { return d == TokenDtype::u16 ? 2 : 4; }

std::string_view to_string(TokenDtype d) noexcept {
  return d == TokenDtype::u16 ? "uint16" : "uint32";
}

std::optional<TokenDtype> parse_token_dtype(std::string_view s) noexcept {
  const std::string l = lower(s);
  if (l == "uint16" || l == "u16") return TokenDtype::u16;
  if (l == "uint32" || l == "u32") return TokenDtype::u32;
  return std::nullopt;
}

// ---- listing ------------------------------------------------------------------------------------

std::vector<std::string> list_shards(const std::string& pattern) {
  std::error_code ec;
  if (fs::is_directory(pattern, ec)) {
    auto files = dir_files(pattern, "", ".bin");
    if (files.empty()) io_fail(pattern, "directory holds no *.bin token shards");
    return files;
  }
  if (has_glob_chars(pattern)) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> files;
    if (rc == 0) {
      for (std::size_t i = 0; i < g.gl_pathc; ++i) {
        if (fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
      }
    }
    ::globfree(&g);
    if (files.empty()) io_fail(pattern, "no shard file matches this pattern");
    std::sort(files.begin(), files.end());
    return files;
  }
  if (!fs::exists(pattern, ec)) {
    if (ec.value() == ELOOP) {
      throw io_error("--data " + pattern + ": symbolic link loop (" + symlink_loop(pattern) +
                     "); point the link at the shard directory or file");
    }
    io_fail(pattern, "no such shard file or directory");
  }
  return {pattern};
}

DataSplit resolve_split(const std::string& pattern_or_dir) {
  DataSplit s;
  std::error_code ec;
  if (fs::is_directory(pattern_or_dir, ec)) {
    s.train = dir_files(pattern_or_dir, "train_", ".bin");
    if (!s.train.empty()) {
      s.val = dir_files(pattern_or_dir, "val_", ".bin");
      return s;
    }
  }
  s.train = list_shards(pattern_or_dir);
  if (s.train.size() >= 2) {
    s.val.push_back(s.train.back());
    s.train.pop_back();
  }
  return s;
}

// ---- loader -------------------------------------------------------------------------------------

nlohmann::json LoaderState::to_json() const {
  return {{"epoch", epoch}, {"shard", shard}, {"index", index}, {"seed", seed}};
}

LoaderState LoaderState::from_json(const nlohmann::json& j) {
  LoaderState s;
  auto get_int = [&](const char* key) -> std::int64_t {
    GHT_EXPECTS(j.is_object() && j.contains(key) && j.at(key).is_number_integer(),
                std::string("data position: field '") + key +
                    "' is missing or not an integer in " + j.dump());
    return j.at(key).get<std::int64_t>();
  };
  s.epoch = get_int("epoch");
  s.shard = get_int("shard");
  s.index = get_int("index");
  GHT_EXPECTS(j.contains("seed") && j.at("seed").is_number_unsigned(),
              "data position: field 'seed' is missing or not an unsigned integer in " + j.dump());
  s.seed = j.at("seed").get<std::uint64_t>();
  GHT_EXPECTS(s.epoch >= 0 && s.shard >= 0 && s.index >= 0,
              "data position: negative field in " + j.dump());
  return s;
}

struct DataLoader::Impl {
  LoaderOptions opt;
  std::vector<ShardInfo> shards;
  std::vector<std::int64_t> windows;  // per shard
  std::int64_t total_windows = 0, total_tokens = 0;
  // position
  std::int64_t epoch = 0, shard_pos = 0, index = 0;
  std::uint64_t seed = 0;
  // caches
  std::int64_t order_epoch = -1;
  std::vector<std::int64_t> shard_order;
  std::int64_t perm_epoch = -1, perm_shard_pos = -1;
  std::vector<std::int64_t> window_order;
  std::int64_t mapped_shard = -1;
  LoadedShard mapped;
  std::int64_t checked_epoch = -1, checked_pos = -1;  // the visit whose file was last checked

  void ensure_order() {
    if (order_epoch != epoch) {
      shard_order = permutation(static_cast<std::int64_t>(shards.size()),
                                order_seed(seed, epoch, -1), opt.shuffle);
      order_epoch = epoch;
    }
  }

  // Move the position to the next window that exists (skips exhausted and empty shards).
  void normalize() {
    for (;;) {
      if (shard_pos >= static_cast<std::int64_t>(shards.size())) {
        ++epoch;
        shard_pos = 0;
        index = 0;
      }
      ensure_order();
      const std::int64_t sh = shard_order[static_cast<std::size_t>(shard_pos)];
      if (index < windows[static_cast<std::size_t>(sh)]) return;
      ++shard_pos;
      index = 0;
    }
  }

  // Each visit of a shard (a new position in the epoch's order, or the same one in a later
  // epoch, as with a single shard) checks that its file is still the one read: a changed size
  // is an error naming the file; a rewrite of the same size is read again.
  void ensure_shard(std::int64_t sh) {
    if (mapped_shard == sh) {
      if (checked_epoch == epoch && checked_pos == shard_pos) return;
      if (detail::stamp_of_shard(mapped.info()) == mapped.stamp()) {
        checked_epoch = epoch;
        checked_pos = shard_pos;
        return;
      }
    }
    mapped = LoadedShard();
    mapped_shard = -1;
    (void)detail::stamp_of_shard(shards[static_cast<std::size_t>(sh)]);
    // Re-read the header: the file may have been replaced since the loader was built.
    const ShardInfo now = read_shard_info(shards[static_cast<std::size_t>(sh)].path);
    if (now.tokens != shards[static_cast<std::size_t>(sh)].tokens ||
        now.dtype != shards[static_cast<std::size_t>(sh)].dtype) {
      io_fail(now.path, "shard changed while the loader was using it (header now says " +
                            std::to_string(now.tokens) + " tokens)");
    }
    LoadedShard m(now);
    m.validate(opt.vocab);
    mapped = std::move(m);
    mapped_shard = sh;
    checked_epoch = epoch;
    checked_pos = shard_pos;
  }

  void ensure_window_order(std::int64_t sh) {
    if (perm_epoch == epoch && perm_shard_pos == shard_pos) return;
    window_order = permutation(windows[static_cast<std::size_t>(sh)],
                               order_seed(seed, epoch, shard_pos), opt.shuffle);
    perm_epoch = epoch;
    perm_shard_pos = shard_pos;
  }

  void fill(Batch& out) {
    if (g_fill_fault.load(std::memory_order_relaxed) >= 0 && g_fill_fault.fetch_sub(1) == 0) {
      throw io_error("data loader: injected read failure (fail_next_fill_after_for_testing)");
    }
    const int B = opt.batch, T = opt.seq_len;
    out.batch = B;
    out.seq_len = T;
    const auto n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    out.inputs.resize(n);
    out.targets.resize(n);
    if (opt.eot >= 0) {
      out.doc_ids.resize(n);
    } else {
      out.doc_ids.clear();
    }
    for (int b = 0; b < B; ++b) {
      normalize();
      const std::int64_t sh = shard_order[static_cast<std::size_t>(shard_pos)];
      ensure_shard(sh);
      ensure_window_order(sh);
      const std::int64_t start = window_order[static_cast<std::size_t>(index)] * T;
      ++index;
      std::int32_t* in = out.inputs.data() + static_cast<std::size_t>(b) * T;
      std::int32_t* tg = out.targets.data() + static_cast<std::size_t>(b) * T;
      std::uint32_t prev = mapped.at(start);
      std::int32_t doc = 0;
      for (int t = 0; t < T; ++t) {
        const std::uint32_t next = mapped.at(start + t + 1);
        in[t] = static_cast<std::int32_t>(prev);
        tg[t] = static_cast<std::int32_t>(next);
        if (opt.eot >= 0) {
          if (prev == static_cast<std::uint32_t>(opt.eot)) ++doc;
          out.doc_ids[static_cast<std::size_t>(b) * T + t] = doc;
        }
        prev = next;
      }
    }
  }
};

DataLoader::DataLoader(std::vector<std::string> shard_paths, LoaderOptions opt)
    : impl_(std::make_unique<Impl>()) {
  GHT_EXPECTS(opt.batch > 0 && opt.seq_len > 0,
              "data loader: batch (" + std::to_string(opt.batch) + ") and seq_len (" +
                  std::to_string(opt.seq_len) + ") must be > 0");
  GHT_EXPECTS(opt.vocab > 0, "data loader: vocab must be > 0, got " + std::to_string(opt.vocab));
  if (shard_paths.empty()) throw io_error("data loader: no shard files given");
  impl_->opt = opt;
  impl_->seed = opt.seed;
  std::int64_t largest = 0;
  for (const auto& p : shard_paths) {
    ShardInfo info = read_shard_info(p);
    const std::int64_t w = info.tokens > 0 ? (info.tokens - 1) / opt.seq_len : 0;
    largest = std::max(largest, info.tokens);
    impl_->windows.push_back(w);
    impl_->total_windows += w;
    impl_->total_tokens += info.tokens;
    impl_->shards.push_back(std::move(info));
  }
  GHT_EXPECTS(impl_->total_windows > 0,
              "data loader: no shard holds seq_len+1 = " + std::to_string(opt.seq_len + 1) +
                  " tokens (largest of " + std::to_string(impl_->shards.size()) + " shard(s): " +
                  std::to_string(largest) + " tokens, first: " + impl_->shards.front().path + ")");
}

DataLoader::DataLoader(const std::string& pattern, LoaderOptions opt)
    : DataLoader(list_shards(pattern), opt) {}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

void fail_next_fill_after_for_testing(std::int64_t batches) {
  g_fill_fault.store(batches < 0 ? -1 : batches);
}

Batch DataLoader::next() {
  Batch b;
  impl_->fill(b);
  return b;
}

void DataLoader::next(Batch& out) { impl_->fill(out); }

LoaderState DataLoader::state() const {
  return {impl_->epoch, impl_->shard_pos, impl_->index, impl_->seed};
}

void DataLoader::restore(const LoaderState& s) {
  const auto nshards = static_cast<std::int64_t>(impl_->shards.size());
  GHT_EXPECTS(s.epoch >= 0 && s.shard >= 0 && s.index >= 0 && s.shard <= nshards,
              "data position " + s.to_json().dump() + " does not fit these " +
                  std::to_string(nshards) + " shard(s); were the shards changed?");
  impl_->epoch = s.epoch;
  impl_->shard_pos = s.shard;
  impl_->index = s.index;
  impl_->seed = s.seed;
  impl_->order_epoch = impl_->perm_epoch = impl_->perm_shard_pos = -1;
  impl_->checked_epoch = impl_->checked_pos = -1;
  if (s.shard < nshards) {
    impl_->ensure_order();
    const std::int64_t sh = impl_->shard_order[static_cast<std::size_t>(s.shard)];
    GHT_EXPECTS(s.index <= impl_->windows[static_cast<std::size_t>(sh)],
                "data position " + s.to_json().dump() + ": window index past the " +
                    std::to_string(impl_->windows[static_cast<std::size_t>(sh)]) +
                    " windows of " + impl_->shards[static_cast<std::size_t>(sh)].path +
                    "; were the shards or seq_len changed?");
  }
}

void DataLoader::reset() { restore({0, 0, 0, impl_->seed}); }

const LoaderOptions& DataLoader::options() const noexcept { return impl_->opt; }
const std::vector<ShardInfo>& DataLoader::shards() const noexcept { return impl_->shards; }
std::int64_t DataLoader::windows_per_epoch() const noexcept { return impl_->total_windows; }
std::int64_t DataLoader::tokens_per_epoch() const noexcept { return impl_->total_tokens; }

void for_each_rank_batch(DataLoader& data, int per_rank, int rank, int ranks, Batch& b,
                         const std::function<void(int, const Batch&)>& f) {
  GHT_EXPECTS(ranks >= 1 && rank >= 0 && rank < ranks && per_rank >= 0,
              "for_each_rank_batch: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ", " +
                  std::to_string(per_rank) + " per rank");
  const int total = ranks * per_rank;
  for (int pos = 0; pos < total; ++pos) {
    data.next(b);
    if (pos % ranks == rank) f(pos / ranks, b);
  }
}

// ---- prep ---------------------------------------------------------------------------------------

namespace {

// Writes train_NNNNNN.bin or val_NNNNNN.bin shards, rolling over every shard_tokens tokens.
class RollingWriter {
 public:
  RollingWriter(std::string dir, std::string prefix, const PrepOptions& opt)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), opt_(opt) {}
  void append(std::span<const std::uint32_t> t) {
    while (!t.empty()) {
      if (!w_) open_next();
      const auto room = static_cast<std::size_t>(opt_.shard_tokens - w_->tokens());
      const std::size_t n = std::min(room, t.size());
      w_->append(t.first(n));
      t = t.subspan(n);
      if (w_->tokens() == opt_.shard_tokens) finish_current();
    }
  }
  void finish() {
    if (w_) finish_current();
  }
  [[nodiscard]] const std::vector<ShardInfo>& shards() const { return done_; }

 private:
  void open_next() {
    char name[64];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix_.c_str(), done_.size());
    w_ = std::make_unique<ShardWriter>((fs::path(dir_) / name).string(), opt_.dtype);
  }
  void finish_current() {
    w_->close();
    done_.push_back({w_->path(), opt_.dtype, w_->tokens()});
    w_.reset();
  }
  std::string dir_, prefix_;
  const PrepOptions& opt_;
  std::unique_ptr<ShardWriter> w_;
  std::vector<ShardInfo> done_;
};

// Routes the global token stream: the first `train_tokens` to train shards, the rest to val.
class SplitSink {
 public:
  SplitSink(const PrepOptions& opt, std::int64_t total)
      : train_(opt.out_dir, "train", opt), val_(opt.out_dir, "val", opt) {
    val_tokens_ = static_cast<std::int64_t>(std::llround(opt.val_fraction * static_cast<double>(total)));
    train_tokens_ = total - val_tokens_;
  }
  void append(std::span<const std::uint32_t> t) {
    if (seen_ < train_tokens_) {
      const auto n = static_cast<std::size_t>(
          std::min<std::int64_t>(train_tokens_ - seen_, static_cast<std::int64_t>(t.size())));
      train_.append(t.first(n));
      seen_ += static_cast<std::int64_t>(n);
      t = t.subspan(n);
    }
    val_.append(t);
    seen_ += static_cast<std::int64_t>(t.size());
  }
  void finish() {
    train_.finish();
    val_.finish();
  }
  [[nodiscard]] std::int64_t seen() const { return seen_; }
  RollingWriter train_, val_;

 private:
  std::int64_t train_tokens_ = 0, val_tokens_ = 0, seen_ = 0;
};

void prepare_out_dir(const PrepOptions& opt) {
  GHT_EXPECTS(!opt.out_dir.empty(), "prep: --out DIR is required");
  GHT_EXPECTS(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0,
              "prep: --val-fraction must be in [0, 1), got " + std::to_string(opt.val_fraction));
  GHT_EXPECTS(opt.shard_tokens > 0 && opt.shard_tokens <= std::numeric_limits<std::int32_t>::max(),
              "prep: --shard-tokens must be in 1..2147483647, got " + std::to_string(opt.shard_tokens));
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) io_fail(opt.out_dir, "cannot create output directory: " + ec.message());
  auto old = dir_files(opt.out_dir, "train_", ".bin");
  for (auto& v : dir_files(opt.out_dir, "val_", ".bin")) old.push_back(v);
  if (!old.empty()) {
    if (!opt.overwrite) {
      io_fail(opt.out_dir, "already holds " + std::to_string(old.size()) + " shard(s) (" +
                               fs::path(old.front()).filename().string() +
                               "...); pass --overwrite to replace them");
    }
    for (const auto& f : old) fs::remove(f, ec);
  }
}

PrepResult finish_prep(SplitSink& sink, const PrepOptions& opt, nlohmann::json manifest) {
  sink.finish();
  PrepResult r;
  r.train = sink.train_.shards();
  r.val = sink.val_.shards();
  r.tokens = sink.seen();
  auto list = [](const std::vector<ShardInfo>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& s : v) a.push_back({{"file", fs::path(s.path).filename().string()}, {"tokens", s.tokens}});
    return a;
  };
  manifest["dtype"] = std::string(to_string(opt.dtype));
  manifest["tokens"] = r.tokens;
  manifest["val_fraction"] = opt.val_fraction;
  manifest["shard_tokens"] = opt.shard_tokens;
  manifest["train"] = list(r.train);
  manifest["val"] = list(r.val);
  r.manifest = manifest;
  fileio::atomic_write((fs::path(opt.out_dir) / "prep.json").string(), manifest.dump(2) + "\n");
  return r;
}

std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& in : inputs) {
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.starts_with(".")) {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file() && lower(it->path().extension().string()) == ".txt") {
          found.push_back(it->path().string());
        }
      }
      if (ec) io_fail(in, "cannot list directory: " + ec.message());
      if (found.empty()) io_fail(in, "directory holds no *.txt files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      files.push_back(in);
    } else {
      io_fail(in, "no such input file or directory");
    }
  }
  GHT_EXPECTS(!files.empty(), "prep: no --input given");
  return files;
}

}  // namespace

PrepResult prep_text(const std::vector<std::string>& inputs, const PrepOptions& opt) {
  const auto files = expand_text_inputs(inputs);
  std::int64_t total_bytes = 0;
  std::vector<std::int64_t> sizes;
  for (const auto& f : files) {
    sizes.push_back(file_size_or_fail(f));
    total_bytes += sizes.back();
  }
  prepare_out_dir(opt);
  // One EOT per document plus one token per byte.
  SplitSink sink(opt, total_bytes + static_cast<std::int64_t>(files.size()));
  std::vector<char> buf(16 << 20);
  std::vector<std::uint32_t> tok;
  std::int64_t done = 0;
  for (std::size_t k = 0; k < files.size(); ++k) {
    const std::uint32_t eot = ByteTokenizer::kEot;
    sink.append({&eot, 1});
    Fd f(files[k]);
    std::int64_t off = 0;
    for (;;) {
      const std::size_t n = pread_full(f.fd, buf.data(), buf.size(), off, files[k]);
      if (n == 0) break;
      if (const void* z = std::memchr(buf.data(), 0, n); z != nullptr) {
        const auto at = off + (static_cast<const char*>(z) - buf.data());
        io_fail(files[k], "holds a NUL byte at offset " + std::to_string(at) +
                              " (a binary file?); text inputs must not contain byte 0, the "
                              "document separator");
      }
      tok.resize(n);
      for (std::size_t i = 0; i < n; ++i) tok[i] = static_cast<unsigned char>(buf[i]);
      sink.append(tok);
      off += static_cast<std::int64_t>(n);
      done += static_cast<std::int64_t>(n);
      if (opt.progress) opt.progress(done, total_bytes);
    }
    if (off != sizes[k]) {
      io_fail(files[k], "changed size while being read (" + std::to_string(sizes[k]) + " -> " +
                            std::to_string(off) + " bytes)");
    }
  }
  nlohmann::json m = {{"format", "llm.c token shards (see data/README.md)"},
                      {"tokenizer", "byte"},
                      {"vocab", ByteTokenizer::kVocab},
                      {"eot", ByteTokenizer::kEot},
                      {"documents", files.size()},
                      {"inputs", files}};
  PrepResult r = finish_prep(sink, opt, std::move(m));
  r.documents = static_cast<std::int64_t>(files.size());
  return r;
}

NpyInfo read_npy_info(const std::string& path) {
  const std::int64_t size = file_size_or_fail(path);
  Fd f(path);
  unsigned char pre[12] = {};
  const std::size_t got = pread_full(f.fd, pre, sizeof pre, 0, path);
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) io_fail(path, "not a .npy file (bad magic)");
  const int major = pre[6];
  std::int64_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = pre[8] | (pre[9] << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (got < 12) io_fail(path, "truncated .npy header");
    header_len = static_cast<std::int64_t>(pre[8]) | (static_cast<std::int64_t>(pre[9]) << 8) |
                 (static_cast<std::int64_t>(pre[10]) << 16) | (static_cast<std::int64_t>(pre[11]) << 24);
    header_start = 12;
  } else {
    io_fail(path, "unsupported .npy format version " + std::to_string(major));
  }
  if (header_start + header_len > size) io_fail(path, "truncated .npy header");
  std::string h(static_cast<std::size_t>(header_len), '\0');
  pread_full(f.fd, h.data(), h.size(), header_start, path);

  // The header is a Python dict literal: {'descr': '<u2', 'fortran_order': False, 'shape': (N,), }
  auto value_of = [&](const std::string& key) -> std::string {
    const auto k = h.find("'" + key + "'");
    if (k == std::string::npos) io_fail(path, ".npy header lacks '" + key + "': " + h);
    auto c = h.find(':', k);
    if (c == std::string::npos) io_fail(path, "malformed .npy header: " + h);
    ++c;
    while (c < h.size() && h[c] == ' ') ++c;
    std::size_t e = c;
    if (h[c] == '\'' || h[c] == '"') {
      e = h.find(h[c], c + 1);
      if (e == std::string::npos) io_fail(path, "malformed .npy header: " + h);
      return h.substr(c + 1, e - c - 1);
    }
    if (h[c] == '(') {
      e = h.find(')', c);
      if (e == std::string::npos) io_fail(path, "malformed .npy header: " + h);
      return h.substr(c, e - c + 1);
    }
    while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
    return h.substr(c, e - c);
  };
  NpyInfo info;
  const std::string descr = value_of("descr");
  if (descr == "<u2") {
    info.dtype = ArrayDtype::u16;
  } else if (descr == "<u4") {
    info.dtype = ArrayDtype::u32;
  } else if (descr == "<i4") {
    info.dtype = ArrayDtype::i32;
  } else {
    io_fail(path, "unsupported .npy dtype '" + descr + "' (expected <u2, <u4 or <i4)");
  }
  const std::string fortran = value_of("fortran_order");
  if (fortran.find("False") == std::string::npos) {
    io_fail(path, ".npy array is in Fortran order; only C order is supported");
  }
  const std::string shape = value_of("shape");  // "(N,)"
  std::string inner = shape.substr(1, shape.size() - 2);
  std::vector<std::int64_t> dims;
  std::size_t p = 0;
  while (p < inner.size()) {
    while (p < inner.size() && (inner[p] == ' ' || inner[p] == ',')) ++p;
    if (p >= inner.size()) break;
    std::size_t q = p;
    while (q < inner.size() && std::isdigit(static_cast<unsigned char>(inner[q]))) ++q;
    if (q == p) io_fail(path, "malformed .npy shape " + shape);
    dims.push_back(std::stoll(inner.substr(p, q - p)));
    p = q;
  }
  if (dims.size() != 1) {
    io_fail(path, ".npy array has shape " + shape + "; token arrays must be 1-D");
  }
  info.count = dims[0];
  info.data_offset = header_start + header_len;
  const std::int64_t item = info.dtype == ArrayDtype::u16 ? 2 : 4;
  const std::int64_t want = info.data_offset + info.count * item;
  if (size != want) {
    io_fail(path, std::string(size < want ? "truncated" : "trailing bytes") + ": .npy header says " +
                      std::to_string(info.count) + " elements of " + descr + " (" +
                      std::to_string(want) + " bytes), file has " + std::to_string(size));
  }
  return info;
}

PrepResult prep_tokens(const std::vector<std::string>& inputs, ArrayDtype raw_dtype,
                       const PrepOptions& opt) {
  GHT_EXPECTS(!inputs.empty(), "prep: no --from-tokens file given");
  struct Src {
    std::string path;
    ArrayDtype dtype;
    std::int64_t offset, count;
    bool npy;
  };
  std::vector<Src> srcs;
  std::int64_t total = 0, total_bytes = 0;
  for (const auto& in : inputs) {
    const std::int64_t size = file_size_or_fail(in);
    char magic[6] = {};
    {
      Fd f(in);
      pread_full(f.fd, magic, sizeof magic, 0, in);
    }
    if (std::memcmp(magic, "\x93NUMPY", 6) == 0) {
      const NpyInfo n = read_npy_info(in);
      srcs.push_back({in, n.dtype, n.data_offset, n.count, true});
    } else {
      const std::int64_t w = raw_dtype == ArrayDtype::u16 ? 2 : 4;
      if (size % w != 0) {
        io_fail(in, "raw token file has " + std::to_string(size) + " bytes, not a multiple of " +
                        std::to_string(w) + " (the element size of --dtype)");
      }
      srcs.push_back({in, raw_dtype, 0, size / w, false});
    }
    total += srcs.back().count;
    total_bytes += srcs.back().count * (srcs.back().dtype == ArrayDtype::u16 ? 2 : 4);
  }
  prepare_out_dir(opt);
  SplitSink sink(opt, total);
  const std::uint64_t dtype_max = opt.dtype == TokenDtype::u16 ? 0xFFFFu : 0xFFFFFFFFu;
  std::vector<unsigned char> buf(16 << 20);
  std::vector<std::uint32_t> tok;
  std::int64_t done = 0;
  for (const auto& s : srcs) {
    Fd f(s.path);
    const std::size_t w = s.dtype == ArrayDtype::u16 ? 2 : 4;
    std::int64_t i = 0;
    while (i < s.count) {
      const auto n = static_cast<std::size_t>(
          std::min<std::int64_t>(s.count - i, static_cast<std::int64_t>(buf.size() / w)));
      const std::size_t got = pread_full(f.fd, buf.data(), n * w, s.offset + i * static_cast<std::int64_t>(w), s.path);
      if (got != n * w) io_fail(s.path, "file shrank while being read");
      tok.resize(n);
      for (std::size_t k = 0; k < n; ++k) {
        std::int64_t v;
        if (s.dtype == ArrayDtype::u16) {
          std::uint16_t x;
          std::memcpy(&x, buf.data() + 2 * k, 2);
          v = x;
        } else if (s.dtype == ArrayDtype::u32) {
          std::uint32_t x;
          std::memcpy(&x, buf.data() + 4 * k, 4);
          v = x;
        } else {
          std::int32_t x;
          std::memcpy(&x, buf.data() + 4 * k, 4);
          v = x;
        }
        const std::int64_t idx = i + static_cast<std::int64_t>(k);
        if (v < 0) io_fail(s.path, "token " + std::to_string(idx) + " is negative (" + std::to_string(v) + ")");
        if (static_cast<std::uint64_t>(v) > dtype_max) {
          io_fail(s.path, "token " + std::to_string(idx) + " has id " + std::to_string(v) +
                              ", which does not fit " + std::string(to_string(opt.dtype)) +
                              " (use --dtype uint32)");
        }
        if (opt.vocab > 0 && v >= opt.vocab) {
          io_fail(s.path, "token " + std::to_string(idx) + " has id " + std::to_string(v) +
                              ", outside the vocabulary (ids must be < " + std::to_string(opt.vocab) + ")");
        }
        tok[k] = static_cast<std::uint32_t>(v);
      }
      sink.append(tok);
      i += static_cast<std::int64_t>(n);
      done += static_cast<std::int64_t>(n * w);
      if (opt.progress) opt.progress(done, total_bytes);
    }
  }
  nlohmann::json m = {{"format", "llm.c token shards (see data/README.md)"},
                      {"tokenizer", "none (wrapped token arrays)"},
                      {"vocab", opt.vocab},
                      {"inputs", inputs}};
  return finish_prep(sink, opt, std::move(m));
}

}  // namespace ght::trainer
