#pragma once
/**
 * @file checkpoint.hpp
 * @brief Atomic, checksummed training checkpoints: one directory per step under a run dir.
 *
 * `<run_dir>/ckpt_<step:08d>/` holds
 *   model.safetensors                  weights (F32)
 *   optimizer.master.safetensors       AdamW fp32 master weights  } each may hold no tensor,
 *   optimizer.m.safetensors            first moments              } e.g. when master weights
 *   optimizer.v.safetensors            second moments             } are the model weights
 *   optimizer.json                     optimizer scalars (e.g. {"step": N, "state_dtype": "bf16"};
 *                                      bf16 m and v are stored widened to F32, exactly)
 *   data.json                          the data loader position
 *   rng.json                           RNG state
 *   config.json                        the resolved run configuration
 *   manifest.json                      {"step", "files": {name: {"size", "xxh3_64"}}}
 *   COMMITTED                          written last: the manifest's size and XXH3-64
 * and any further files a writer adds through CheckpointView::extra_files (e.g. DiLoCo's
 * per-rank shards, trainer/loop.cpp), listed in the manifest and verified like the others.
 *
 * Writing: every file goes into `<run_dir>/.tmp-ckpt_<step>` (staging_dir()), each fsync'd; then the directory is
 * fsync'd, renamed to its final name, the run dir fsync'd, and only then COMMITTED is written and
 * fsync'd (with the directory). A crash at any point leaves either no `ckpt_` directory or one
 * without COMMITTED, which load() and find_latest() reject. Checksums are XXH3-64 (libxxhash).
 *
 * Loading verifies the marker, the manifest's checksum, every file's size and checksum, and that
 * a `ckpt_<step>` directory's name agrees with its manifest's step;
 * errors (ght::io_error) name the checkpoint file and the problem. load() reads each file once,
 * checksumming the bytes as it parses them (a 21B-parameter checkpoint is ~340 GB: a separate
 * verification pass would double the time to resume).
 */
#include <functional>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/safetensors.hpp"

namespace ght::trainer {

/// std::allocator that default-initialises: FloatBuffer(n) leaves its floats uninitialised
/// instead of zero-filling them, for buffers that a read fills right away (a checkpoint's tensors
/// are hundreds of GB; the zero-fill cost as much as the read, see
/// bench/results/2026-11-30-cpu-checkpoint-io.md). Ask for zeros explicitly: FloatBuffer(n, 0.0f).
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  using std::allocator<T>::allocator;
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using FloatBuffer = std::vector<float, DefaultInitAllocator<float>>;

/// A named fp32 tensor, row-major.
struct CheckpointTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  FloatBuffer data;
};

/// A named fp32 tensor that borrows its data (saving a model without copying it).
struct CheckpointTensorView {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> data;
};

/// A file of a checkpoint beyond the standard ones: its manifest entry.
struct CheckpointFile {
  std::string name;  ///< a plain file name inside the checkpoint directory
  std::uint64_t size = 0, xxh3_64 = 0;
};

/// Everything a checkpoint holds, non-owning (what save() writes).
struct CheckpointView {
  std::vector<CheckpointTensorView> weights, master, adam_m, adam_v;
  nlohmann::json optimizer = nlohmann::json::object();      ///< e.g. {"step": N}
  nlohmann::json data_position = nlohmann::json::object();  ///< LoaderState::to_json()
  nlohmann::json rng = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();
  /// Called with the staging directory once the files above are in it and before the manifest:
  /// writes further files there (fsync'd) and returns their entries, which the manifest lists.
  std::function<std::vector<CheckpointFile>(const std::string& staging_dir)> extra_files;
  /// When set, model.safetensors is written from it, one tensor at a time, in the thread that
  /// calls save() and before any other file: `weights` then give the names and shapes (their
  /// data may be empty) and weights_source(i, out) fills tensor i's values. For weights that
  /// live on several processes (ZeRO-1): each call may be a collective, and only one tensor is
  /// held at a time.
  std::function<void(std::size_t i, std::span<float> out)> weights_source;
};

/// A further tensor file that load() was asked for (LoadOptions::tensor_files).
struct CheckpointTensorFile {
  StMetadata metadata;
  std::vector<CheckpointTensor> tensors;
};

/// Everything a checkpoint holds (what load() returns).
struct CheckpointData {
  std::int64_t step = 0;
  std::vector<CheckpointTensor> weights, master, adam_m, adam_v;
  nlohmann::json optimizer = nlohmann::json::object();
  nlohmann::json data_position = nlohmann::json::object();
  nlohmann::json rng = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();
  /// The LoadOptions::tensor_files that the manifest lists, by name.
  std::map<std::string, CheckpointTensorFile> tensor_files;
  /// A view of this data, for save() (without tensor_files).
  [[nodiscard]] CheckpointView view() const;
};

/// `ckpt_00000042` for step 42.
[[nodiscard]] std::string checkpoint_dir_name(std::int64_t step);

/// Where save() assembles the checkpoint of `step` before committing it: other processes write
/// their files there from CheckpointView::extra_files' call until it returns.
[[nodiscard]] std::string staging_dir(const std::string& run_dir, std::int64_t step);

/// @brief Write F32 `tensors` and `metadata` as the safetensors file dir/name, fsync'd, and
/// return its manifest entry (for CheckpointView::extra_files). @throws ght::io_error
CheckpointFile write_tensor_file(const std::string& dir, const std::string& name,
                                 const std::vector<CheckpointTensorView>& tensors, const StMetadata& metadata);

/// @brief Write a checkpoint atomically; returns its directory. An existing checkpoint of the
/// same step is replaced only after the new one is complete.
/// @throws ght::io_error naming the file that failed; ght::logic_error on a tensor whose data
///         size does not match its shape
std::string save(const std::string& run_dir, std::int64_t step, const CheckpointView& ckpt);
std::string save(const std::string& run_dir, std::int64_t step, const CheckpointData& ckpt);

/// @brief Check a checkpoint without parsing its tensors: marker, manifest, each file's size
/// and XXH3-64. Returns an empty string when it is good, else the reason (naming the file).
[[nodiscard]] std::string verify(const std::string& ckpt_dir);

struct LoadOptions {
  /// Read master, m and v. Without them (sampling, export) those files are neither read nor
  /// checksummed, and CheckpointData's master/adam_m/adam_v stay empty.
  bool optimizer_state = true;
  /// Further tensor files to read (checksummed as they are parsed) into
  /// CheckpointData::tensor_files; one the manifest does not list is left out. Every other
  /// further file the manifest lists is verified in full.
  std::vector<std::string> tensor_files;
  /// Further tensor files streamed instead of kept: each listed file whose name starts with
  /// `stream_prefix` (when not empty) is read one tensor at a time, in manifest order and in the
  /// calling thread, and `stream` sees each tensor (its data valid during the call only) with
  /// the checkpoint's directory (load_latest may try several), the file's name and its metadata.
  /// A file's checksum is known only after its last tensor: on a mismatch load() throws, so
  /// what `stream` was given counts only once load() has returned. (ZeRO-1 shards: each rank
  /// keeps the parts it holds now, whatever the number of ranks that wrote them.)
  std::string stream_prefix;
  std::function<void(const std::string& ckpt_dir, const std::string& file, const StMetadata& metadata,
                     const CheckpointTensorView& tensor)>
      stream;
};

/// @brief Load a checkpoint directory, verifying every file it reads as it reads it.
/// @throws ght::io_error naming the file and the problem (missing marker, size, checksum, format)
[[nodiscard]] CheckpointData load(const std::string& ckpt_dir, const LoadOptions& opts = {});

/// A checkpoint and the directory it came from.
struct LoadedCheckpoint {
  std::string dir;
  CheckpointData data;
};

/// @brief The newest checkpoint under run_dir that loads with every check passing. Each newer
/// one that fails is skipped with a warning on stderr naming it and the reason. nullopt when
/// there is none (or run_dir does not exist).
[[nodiscard]] std::optional<LoadedCheckpoint> load_latest(const std::string& run_dir,
                                                          const LoadOptions& opts = {});

/// @brief What `--resume` asks for: "" = nothing (nullopt); "auto" = load_latest(run_dir) (nullopt,
/// with a "starting fresh" line through `say`, when there is none); a run directory (one holding
/// `ckpt_*` directories) = its newest checkpoint that loads, which must exist; anything else =
/// that checkpoint directory, which must load. @throws ght::io_error for an explicit one that fails
[[nodiscard]] std::optional<LoadedCheckpoint> load_for_resume(const std::string& resume, const std::string& run_dir,
                                                              const std::function<void(const std::string&)>& say,
                                                              const LoadOptions& opts = {});

/// @brief The newest checkpoint under run_dir that is committed and verifies (a full read of
/// its files; load_latest() verifies while loading instead). Each newer one that fails is skipped
/// with a warning on stderr naming it and the reason. nullopt when there is none.
[[nodiscard]] std::optional<std::string> find_latest(const std::string& run_dir);

/// Steps of the `ckpt_*` directories under run_dir, newest first (committed or not).
[[nodiscard]] std::vector<std::int64_t> list_checkpoints(const std::string& run_dir);

/// @brief Keep the newest `keep` committed checkpoints (by their COMMITTED marker) and delete
/// every other `ckpt_*` directory and leftover `.tmp-ckpt_*` / `.old-ckpt_*`. keep <= 0 keeps
/// everything. Call it right after a successful save(). Returns the removed directories.
std::vector<std::string> prune(const std::string& run_dir, int keep);

}  // namespace ght::trainer
