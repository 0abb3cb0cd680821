#pragma once
/**
 * @file data.hpp
 * @brief Token shards (llm.c format), the seeded resumable DataLoader, and the `ght prep` core.
 *
 * Shard format (little-endian), as in karpathy/llm.c:
 *   header  256 x int32
 *           header[0] = 20240520   magic
 *           header[1] = 1          version: tokens are uint16   (llm.c's GPT-2 shards)
 *                     = 2          version: tokens are uint32   (ghtier's variant, vocab > 65535)
 *           header[2] = N          token count (int32, so at most 2^31-1 tokens per shard)
 *           header[3..255] = 0
 *   body    N tokens of the version's width, nothing after them
 * Readers also accept llm.c's Llama-3 shards (magic 20240801, version 7, uint32 tokens).
 *
 * Validation (every failure throws ght::io_error naming the file): magic, version, file size
 * against header[2] (truncated body or trailing bytes), and, when a shard is loaded, every token
 * id against the vocabulary (the message names the token index and value).
 *
 * Document boundaries: the byte tokenizer's EOT (byte 0) starts every document that `ght prep`
 * writes. With LoaderOptions::eot >= 0 the loader numbers the documents in each row
 * (Batch::doc_ids) so attention can be masked at boundaries.
 */
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ght::trainer {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersionU16 = 1;
inline constexpr std::int32_t kShardVersionU32 = 2;
inline constexpr std::int32_t kLlmcLlama3Magic = 20240801;  ///< read-only compatibility
inline constexpr std::int32_t kLlmcLlama3Version = 7;
inline constexpr std::size_t kShardHeaderInts = 256;
inline constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * sizeof(std::int32_t);

enum class TokenDtype { u16, u32 };
[[nodiscard]] std::size_t token_bytes(TokenDtype d) noexcept;
[[nodiscard]] std::string_view to_string(TokenDtype d) noexcept;  ///< "uint16" | "uint32"
/// "uint16"/"u16" or "uint32"/"u32" (case-insensitive); nullopt otherwise.
[[nodiscard]] std::optional<TokenDtype> parse_token_dtype(std::string_view s) noexcept;

/// A validated shard header.
struct ShardInfo {
  std::string path;
  TokenDtype dtype = TokenDtype::u16;
  std::int64_t tokens = 0;
};

/// @brief Read a shard's header and check magic, version and the file size against the count.
/// @throws ght::io_error naming the file and the problem
[[nodiscard]] ShardInfo read_shard_info(const std::string& path);

/// @brief Read a whole shard, range-checking every token.
/// @param vocab tokens must be < vocab (<= 0: only the dtype bounds them)
/// @throws ght::io_error naming the file, and for a bad token its index and value
[[nodiscard]] std::vector<std::uint32_t> read_shard(const std::string& path, int vocab);

/// @brief Streaming shard writer: writes `<path>.tmp`, then fsyncs and renames on close().
class ShardWriter {
 public:
  /// @throws ght::io_error when the file cannot be created
  ShardWriter(std::string path, TokenDtype dtype);
  ~ShardWriter();  ///< removes the temporary file when close() was not called
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// @throws ght::logic_error naming the value when a token does not fit the dtype, or the
  ///         shard would exceed 2^31-1 tokens; ght::io_error on a write failure
  void append(std::span<const std::uint32_t> tokens);
  [[nodiscard]] std::int64_t tokens() const noexcept { return count_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Patch the header count, fsync and rename into place. @throws ght::io_error
  void close();

 private:
  void flush_buffer();
  std::string path_, tmp_path_;
  TokenDtype dtype_;
  int fd_ = -1;
  std::int64_t count_ = 0;
  std::vector<unsigned char> buf_;
};

/// @brief Write a whole shard at once (ShardWriter underneath).
void write_shard(const std::string& path, std::span<const std::uint32_t> tokens, TokenDtype dtype);

/// @brief Shard files named by a directory (its *.bin files), a glob pattern or a single file,
/// sorted by path. @throws ght::io_error when nothing matches
[[nodiscard]] std::vector<std::string> list_shards(const std::string& pattern);

/// Train and held-out shards of a dataset.
struct DataSplit {
  std::vector<std::string> train;
  std::vector<std::string> val;  ///< may be empty: no held-out data
};

/// @brief Split a dataset. A directory holding train_*.bin (as `ght prep` writes) gives those
/// for training and its val_*.bin (possibly none) as held-out data. Any other set of shards (a
/// directory of other *.bin files, a glob, a file) holds out its last shard when it has at least
/// two, else has no held-out data.
/// @throws ght::io_error when no shard matches
[[nodiscard]] DataSplit resolve_split(const std::string& pattern_or_dir);

// ---- the loader ---------------------------------------------------------------------------------

struct LoaderOptions {
  int batch = 8;              ///< B: rows per batch
  int seq_len = 128;          ///< T: tokens per row (each window reads T+1 tokens)
  std::uint64_t seed = 1337;  ///< order seed (shard order and window order per epoch)
  int vocab = 256;            ///< every token must be < vocab (checked when a shard is loaded)
  bool shuffle = true;        ///< false: shards and windows in file order (for eval)
  std::int32_t eot = -1;      ///< >= 0: fill Batch::doc_ids using this document-start token
};

/// The read position; serialises to JSON for checkpoints.
struct LoaderState {
  std::int64_t epoch = 0;  ///< completed passes over all shards
  std::int64_t shard = 0;  ///< position in this epoch's shard order
  std::int64_t index = 0;  ///< next window within that shard's window order
  std::uint64_t seed = 0;
  [[nodiscard]] nlohmann::json to_json() const;
  /// @throws ght::logic_error naming a missing or mistyped field
  [[nodiscard]] static LoaderState from_json(const nlohmann::json& j);
  friend bool operator==(const LoaderState&, const LoaderState&) = default;
};

/// One batch of training windows.
struct Batch {
  int batch = 0, seq_len = 0;
  std::vector<std::int32_t> inputs;   ///< (B, T)
  std::vector<std::int32_t> targets;  ///< (B, T): inputs shifted left by one token
  /// (B, T) when LoaderOptions::eot >= 0: per row, the number of EOT tokens in inputs[0..t].
  /// Position t may attend to s <= t only when doc_ids[s] == doc_ids[t]. Empty otherwise.
  std::vector<std::int32_t> doc_ids;
};

/**
 * @brief Yields (inputs, targets) windows of T+1 tokens from a list of shards.
 *
 * Windows are the non-overlapping starts 0, T, 2T, ... of each shard (a shard of N tokens gives
 * (N-1)/T windows). Order is deterministic: per epoch the shard order, and per (epoch, shard)
 * the window order, are Fisher-Yates shuffles driven by std::mt19937_64 seeded from
 * splitmix64(seed, epoch, shard), with the index drawn as rng() % (i+1). Both are fully specified
 * by the C++ standard, so the order is the same on every platform. state()/restore() resume
 * exactly.
 */
class DataLoader {
 public:
  /// @throws ght::io_error (bad shard header, no shards), ght::logic_error (bad options, or the
  ///         shards hold no window of seq_len+1 tokens)
  DataLoader(std::vector<std::string> shards, LoaderOptions opt);
  /// Shards named by list_shards(pattern).
  DataLoader(const std::string& pattern, LoaderOptions opt);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  /// @brief The next B windows, crossing shards and epochs as needed. Each visit of a shard (its
  /// turn in an epoch, also when it is the only one) checks that its file is still the one read:
  /// a rewrite of the same size is read again.
  /// @throws ght::io_error when a shard fails validation on load, or its file changed size since
  ///         the loader was built (the message names the file, both sizes and the way out)
  [[nodiscard]] Batch next();
  /// Fill an existing batch (reuses its buffers).
  void next(Batch& out);

  [[nodiscard]] LoaderState state() const;
  /// @throws ght::logic_error when the state does not fit these shards
  void restore(const LoaderState& s);
  /// Back to epoch 0, shard 0, window 0 (same seed).
  void reset();

  [[nodiscard]] const LoaderOptions& options() const noexcept;
  [[nodiscard]] const std::vector<ShardInfo>& shards() const noexcept;
  [[nodiscard]] std::int64_t windows_per_epoch() const noexcept;
  [[nodiscard]] std::int64_t tokens_per_epoch() const noexcept;  ///< sum of shard tokens

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/**
 * @brief Fault injection for tests: the DataLoaders of this process together fill `batches` more
 * batches (one count for all of them), then the next fill throws ght::io_error (as a shard that
 * cannot be read would) before it changes any state, once; a negative count turns it off.
 * Recovery tests use it to fail a training step part-way through its micro-batches.
 */
void fail_next_fill_after_for_testing(std::int64_t batches);

/**
 * @brief One optimizer step's micro-batches for rank `rank` of `ranks` (the contract of
 * TrainBackend::step, trainer/loop.hpp): reads ranks·per_rank batches from `data` into `b`, so
 * every rank's loader stays at the same position, and calls f(i, b) for this rank's i-th one
 * (i = 0..per_rank-1): the batches at positions rank, rank+ranks, ... N ranks with A each thus
 * read what one rank with N·A does, in the same order.
 */
void for_each_rank_batch(DataLoader& data, int per_rank, int rank, int ranks, Batch& b,
                         const std::function<void(int, const Batch&)>& f);

// ---- `ght prep` core ----------------------------------------------------------------------------

struct PrepOptions {
  std::string out_dir;
  double val_fraction = 0.1;                 ///< of all tokens, taken from the end; in [0, 1)
  std::int64_t shard_tokens = 100'000'000;  ///< tokens per shard (at most 2^31-1)
  TokenDtype dtype = TokenDtype::u16;        ///< output width
  std::int64_t vocab = 0;                    ///< > 0: reject tokens >= vocab
  bool overwrite = false;                    ///< replace existing train_/val_ shards in out_dir
  /// Called with (bytes done, bytes total) as input is consumed.
  std::function<void(std::int64_t, std::int64_t)> progress;
};

struct PrepResult {
  std::vector<ShardInfo> train, val;
  std::int64_t documents = 0;  ///< text mode: files read
  std::int64_t tokens = 0;
  nlohmann::json manifest;  ///< also written to out_dir/prep.json
};

/// @brief Text files (a directory contributes its *.txt files, recursively, sorted) to
/// byte-level token shards. Each file is one document and starts with the EOT token (byte 0).
/// @throws ght::io_error naming an unreadable input, a file holding a NUL byte (with its
///         offset), or an output directory that already holds shards (without overwrite)
PrepResult prep_text(const std::vector<std::string>& inputs, const PrepOptions& opt);

/// Element type of a raw or .npy token array.
enum class ArrayDtype { u16, u32, i32 };

/// A parsed .npy header (format versions 1-3).
struct NpyInfo {
  ArrayDtype dtype = ArrayDtype::u16;
  std::int64_t count = 0;
  std::int64_t data_offset = 0;
};
/// @brief Parse a .npy header: dtype <u2, <u4 or <i4, C order, 1-D; checks the file size.
/// @throws ght::io_error naming the file and what is unsupported or inconsistent
[[nodiscard]] NpyInfo read_npy_info(const std::string& path);

/// @brief Wrap token arrays into shards: .npy files (detected by their magic) or raw
/// little-endian arrays of `raw_dtype`. Values are range-checked against the output dtype and
/// opt.vocab; errors name the file, the index and the value.
PrepResult prep_tokens(const std::vector<std::string>& inputs, ArrayDtype raw_dtype,
                       const PrepOptions& opt);

}  // namespace ght::trainer
