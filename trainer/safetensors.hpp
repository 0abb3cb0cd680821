#pragma once
/**
 * @file safetensors.hpp
 * @brief Reading and writing Hugging Face safetensors files, single or sharded with an index.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer.
 * The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the buffer) and may hold "__metadata__" (string to string). We pad the JSON with
 * spaces so the buffer starts 8-byte aligned, and lay tensors out in the order given.
 *
 * Reading validates, naming the file and the tensor: header length within the file, JSON shape,
 * known dtype, end - begin == numel x dtype size, offsets within the file, and a buffer that the
 * tensors cover exactly (no overlap, no hole, no trailing bytes), as the reference implementation
 * requires. Errors throw ght::io_error.
 *
 * Sharded export follows transformers: model.safetensors when the tensors fit one shard, else
 * model-00001-of-0000N.safetensors ... plus model.safetensors.index.json
 * {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
 */
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ght::trainer {

namespace fileio {
class OutFile;
}

/// Tensor element types. Only F32, BF16, F16 and I32 can be read as values; the others are
/// recognised so that files holding them still validate.
enum class StDtype { F32, BF16, F16, I32, F64, I64, I16, I8, U8, BOOL };
[[nodiscard]] std::size_t dtype_size(StDtype d) noexcept;
[[nodiscard]] std::string_view to_string(StDtype d) noexcept;  ///< "F32", "BF16", ...
[[nodiscard]] std::optional<StDtype> parse_st_dtype(std::string_view s) noexcept;

using StMetadata = std::map<std::string, std::string>;

/// A tensor to write: borrowed bytes, row-major.
struct TensorRef {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  [[nodiscard]] std::int64_t numel() const noexcept;
  [[nodiscard]] std::uint64_t bytes() const noexcept { return static_cast<std::uint64_t>(numel()) * dtype_size(dtype); }
};

/// A tensor found in a file; begin/end are offsets into the data buffer.
struct TensorInfo {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
  [[nodiscard]] std::int64_t numel() const noexcept;
};

/// @brief The 8-byte length plus the padded JSON header for these tensors.
/// @throws ght::logic_error on an empty or duplicate name, or a negative dimension
[[nodiscard]] std::string safetensors_header(std::span<const TensorRef> tensors,
                                             const StMetadata& metadata = {});
/// @brief Write a file atomically (temporary file, fsync, rename). @throws ght::io_error
void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const StMetadata& metadata = {});
/// @brief Write into an open file (the checkpoint writer hashes as it writes).
void write_safetensors(fileio::OutFile& out, std::span<const TensorRef> tensors,
                       const StMetadata& metadata = {});
/// @brief The same file, with each tensor's bytes made only when they are written: `tensors`
/// give names, dtypes and shapes (their data may be null), and fill(i, buf) writes tensor i's
/// bytes into an 8-byte-aligned buffer as large as the largest tensor. One tensor is held at a
/// time (a checkpoint of weights that live on several processes gathers each one there).
void write_safetensors_streamed(fileio::OutFile& out, std::span<const TensorRef> tensors, const StMetadata& metadata,
                                const std::function<void(std::size_t, void*)>& fill);

/// @brief A validated safetensors file; tensor data is read on demand.
class SafetensorsReader {
 public:
  /// @throws ght::io_error naming the file (and tensor) on any validation failure
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Tensors in data-buffer order.
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const StMetadata& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const TensorInfo* find(std::string_view name) const noexcept;
  /// @throws ght::io_error naming the file when the tensor is absent
  [[nodiscard]] const TensorInfo& at(std::string_view name) const;
  /// Copy a tensor's bytes (end - begin of them) to dst.
  void read_raw(const TensorInfo& t, void* dst) const;
  /// The file's first data_start() bytes: the 8-byte length and the JSON header. With the
  /// tensors' bytes in tensors() order they make up the whole file (the reader rejects holes
  /// and trailing bytes), so a caller can checksum the file while reading it once.
  [[nodiscard]] std::string header_bytes() const;
  [[nodiscard]] std::uint64_t data_start() const noexcept { return data_start_; }
  /// Values as fp32 (from F32, BF16 or F16). @throws ght::io_error for other dtypes
  [[nodiscard]] std::vector<float> read_f32(std::string_view name) const;
  [[nodiscard]] std::vector<std::int32_t> read_i32(std::string_view name) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  StMetadata metadata_;
};

struct ShardedWriteOptions {
  /// Largest shard, in tensor bytes; transformers' default is 5 GB. A tensor larger than this
  /// gets a shard of its own.
  std::uint64_t max_shard_bytes = 5'000'000'000ULL;
  /// transformers refuses files without metadata "format" in {pt, tf, flax, mlx}.
  StMetadata metadata = {{"format", "pt"}};
};

/// @brief Write `dir/model.safetensors`, or shards plus `dir/model.safetensors.index.json` when
/// the tensors exceed max_shard_bytes. Returns the file names written (index last).
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   std::span<const TensorRef> tensors,
                                                   const ShardedWriteOptions& opt = {});

/// @brief A model directory: model.safetensors.index.json with its shards, else
/// model.safetensors.
class SafetensorsDir {
 public:
  /// @throws ght::io_error naming the index or shard on a missing file, a tensor the index
  ///         places in a shard that lacks it, or any shard validation failure
  explicit SafetensorsDir(const std::string& dir);
  [[nodiscard]] std::vector<std::string> names() const;  ///< sorted
  [[nodiscard]] bool contains(std::string_view name) const;
  /// @throws ght::io_error naming the directory when the tensor is absent
  [[nodiscard]] const TensorInfo& info(std::string_view name) const;
  [[nodiscard]] std::vector<float> read_f32(std::string_view name) const;
  [[nodiscard]] const std::vector<SafetensorsReader>& files() const noexcept { return files_; }

 private:
  std::string dir_;
  std::vector<SafetensorsReader> files_;
  std::map<std::string, std::size_t, std::less<>> where_;
};

// ---- 16-bit float conversions (round to nearest even; NaN stays NaN) --------------------------
[[nodiscard]] std::uint16_t f32_to_bf16(float f) noexcept;
[[nodiscard]] float bf16_to_f32(std::uint16_t h) noexcept;
[[nodiscard]] std::uint16_t f32_to_f16(float f) noexcept;
[[nodiscard]] float f16_to_f32(std::uint16_t h) noexcept;

}  // namespace ght::trainer
