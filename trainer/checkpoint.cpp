#include "trainer/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>
#include <utility>

#include <tbb/task_group.h>

#include "tier/error.hpp"
#include "tier/log.hpp"
#include "trainer/file_io.hpp"
#include "trainer/safetensors.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

namespace {

constexpr const char* kMarker = "COMMITTED";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "ghtier-checkpoint";
constexpr int kFormatVersion = 1;

// Tensor files and JSON files, in the order they are written and listed in the manifest.
constexpr const char* kWeights = "model.safetensors";
constexpr const char* kMaster = "optimizer.master.safetensors";
constexpr const char* kAdamM = "optimizer.m.safetensors";
constexpr const char* kAdamV = "optimizer.v.safetensors";
constexpr const char* kOptimizer = "optimizer.json";
constexpr const char* kData = "data.json";
constexpr const char* kRng = "rng.json";
constexpr const char* kConfig = "config.json";
constexpr const char* kRequired[] = {kWeights, kMaster, kAdamM, kAdamV, kOptimizer, kData, kRng, kConfig};

[[noreturn]] void ck_fail(const fs::path& file, const std::string& what) {
  throw io_error("checkpoint " + file.string() + ": " + what);
}

std::int64_t parse_step(const std::string& name) {
  if (!name.starts_with("ckpt_") || name.size() == 5) return -1;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    const char c = name[i];
    if (c < '0' || c > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

struct FileEntry {
  std::uint64_t size = 0, hash = 0;
};

FileEntry write_tensors(const fs::path& path, const std::vector<CheckpointTensorView>& group,
                        const StMetadata& metadata = {{"format", "pt"}}) {
  std::vector<TensorRef> refs;
  refs.reserve(group.size());
  for (const auto& t : group) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    GHT_EXPECTS(n == static_cast<std::int64_t>(t.data.size()),
                "checkpoint: tensor '" + t.name + "' holds " + std::to_string(t.data.size()) +
                    " floats but its shape needs " + std::to_string(n));
    refs.push_back({t.name, StDtype::F32, t.shape, t.data.data()});
  }
  fileio::OutFile f(path.string(), /*hash=*/true);
  write_safetensors(f, refs, metadata);
  f.close();
  return {f.bytes_written(), f.digest()};
}

// F32 tensors whose values `source` makes one at a time (CheckpointView::weights_source).
FileEntry write_streamed(const fs::path& path, const std::vector<CheckpointTensorView>& group,
                         const std::function<void(std::size_t, std::span<float>)>& source) {
  std::vector<TensorRef> refs;
  refs.reserve(group.size());
  for (const auto& t : group) refs.push_back({t.name, StDtype::F32, t.shape, nullptr});
  fileio::OutFile f(path.string(), /*hash=*/true);
  write_safetensors_streamed(f, refs, {{"format", "pt"}}, [&](std::size_t i, void* buf) {
    source(i, std::span<float>(static_cast<float*>(buf), static_cast<std::size_t>(refs[i].numel())));
  });
  f.close();
  return {f.bytes_written(), f.digest()};
}

FileEntry write_text(const fs::path& path, const std::string& text) {
  fileio::OutFile f(path.string(), /*hash=*/true);
  f.write(text.data(), text.size());
  f.close();
  return {f.bytes_written(), f.digest()};
}

// `text`, read from `path`, as JSON; throws naming the file.
nlohmann::json parse_json_text(const fs::path& path, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ck_fail(path, std::string("not valid JSON: ") + e.what());
  }
}

nlohmann::json parse_json_file(const fs::path& path) { return parse_json_text(path, fileio::read_all(path.string())); }

std::uint64_t parse_hex(const nlohmann::json& v) {
  if (!v.is_string() || v.get<std::string>().size() != 16) return 0;
  return std::stoull(v.get<std::string>(), nullptr, 16);
}

std::vector<CheckpointTensorView> views_of(const std::vector<CheckpointTensor>& v) {
  std::vector<CheckpointTensorView> out;
  out.reserve(v.size());
  for (const auto& t : v) out.push_back({t.name, t.shape, t.data});
  return out;
}

// The manifest, after checking it against the marker; throws naming the file at fault.
nlohmann::json checked_manifest(const fs::path& dir) {
  const fs::path marker = dir / kMarker;
  std::error_code ec;
  if (!fs::exists(marker, ec)) {
    ck_fail(marker, "missing: the checkpoint was never committed (interrupted while writing?)");
  }
  const nlohmann::json m = parse_json_file(marker);
  if (!m.is_object() || !m.contains("manifest_size") || !m["manifest_size"].is_number_unsigned() ||
      !m.contains("manifest_xxh3_64")) {
    ck_fail(marker, "malformed marker: " + m.dump());
  }
  const fs::path manifest = dir / kManifest;
  if (!fs::exists(manifest, ec)) ck_fail(manifest, "missing");
  const std::string text = fileio::read_all(manifest.string());  // read once: checksum, then parse
  const std::uint64_t size = text.size();
  const std::uint64_t hash = fileio::xxh3(text.data(), text.size());
  if (size != m["manifest_size"].get<std::uint64_t>()) {
    ck_fail(manifest, "size " + std::to_string(size) + " bytes, the COMMITTED marker says " +
                          std::to_string(m["manifest_size"].get<std::uint64_t>()));
  }
  if (hash != parse_hex(m["manifest_xxh3_64"])) {
    ck_fail(manifest, "checksum mismatch: xxh3_64 " + fileio::hex64(hash) +
                          ", the COMMITTED marker says " + m["manifest_xxh3_64"].dump());
  }
  nlohmann::json man = parse_json_text(manifest, text);
  if (!man.is_object() || man.value("format", "") != kFormat || !man.contains("files") ||
      !man["files"].is_object() || !man.contains("step") || !man["step"].is_number_integer()) {
    ck_fail(manifest, "not a ghtier checkpoint manifest");
  }
  if (man.value("version", 0) != kFormatVersion) {
    ck_fail(manifest, "unsupported checkpoint format version " + man["version"].dump());
  }
  for (const char* req : kRequired) {
    if (!man["files"].contains(req)) ck_fail(manifest, std::string("does not list ") + req);
  }
  // A ckpt_<step> directory must hold that step: resume and prune trust the name (a copied or
  // renamed directory would otherwise resume at the wrong step, or be pruned as the wrong one).
  fs::path name = dir.filename();
  if (name.empty()) name = dir.parent_path().filename();  // "run/ckpt_00000009/"
  const std::int64_t named = parse_step(name.string());
  const std::int64_t step = man["step"].get<std::int64_t>();
  if (named >= 0 && named != step) {
    ck_fail(manifest, "holds step " + std::to_string(step) + " but its directory is named " + name.string() +
                          " (step " + std::to_string(named) + "); rename it to " + checkpoint_dir_name(step));
  }
  return man;
}

// A manifest entry's size and checksum. Throws naming the manifest when the entry is malformed.
FileEntry expected_of(const fs::path& dir, const nlohmann::json& man, const std::string& name) {
  const auto& files = man["files"];
  if (name.find('/') != std::string::npos || name == ".." || !files.contains(name) ||
      !files[name].is_object() || !files[name].contains("size") || !files[name]["size"].is_number_unsigned()) {
    ck_fail(dir / kManifest, "malformed entry for file '" + name + "'");
  }
  const auto& e = files[name];
  return {e["size"].get<std::uint64_t>(), parse_hex(e.value("xxh3_64", nlohmann::json()))};
}

// Before reading: the file exists and has the manifest's size (truncation named as such).
void check_size(const fs::path& file, const FileEntry& want) {
  std::error_code ec;
  if (!fs::exists(file, ec)) ck_fail(file, "missing");
  const std::uint64_t size = fs::file_size(file, ec);
  if (ec) ck_fail(file, "cannot stat: " + ec.message());
  if (size != want.size) {
    ck_fail(file, "size " + std::to_string(size) + " bytes, the manifest says " + std::to_string(want.size) +
                      (size < want.size ? " (truncated)" : ""));
  }
}

void check_hash(const fs::path& file, const FileEntry& want, std::uint64_t hash) {
  if (hash != want.hash) {
    ck_fail(file, "checksum mismatch: xxh3_64 " + fileio::hex64(hash) + ", the manifest says " +
                      fileio::hex64(want.hash) + " (file corrupted)");
  }
}

// The tensors of a safetensors file, read once and checksummed on the way (header bytes, then
// the tensors' bytes in file order, which is the whole file), one at a time through `visit`. A
// header damaged so badly that it does not parse is reported as corruption of that file.
void visit_tensors(const fs::path& path, const FileEntry& want,
                   const std::function<void(const StMetadata&, CheckpointTensor&)>& visit,
                   StMetadata* metadata = nullptr) {
  check_size(path, want);
  std::optional<SafetensorsReader> r;
  try {
    r.emplace(path.string());
  } catch (const io_error& e) {
    check_hash(path, want, fileio::xxh3_file(path.string()));  // corrupted: say so first
    throw;
  }
  fileio::Xxh3 h;
  const std::string head = r->header_bytes();
  h.update(head.data(), head.size());
  for (const auto& t : r->tensors()) {
    if (t.dtype != StDtype::F32) {
      ck_fail(path, "tensor '" + t.name + "' has dtype " + std::string(to_string(t.dtype)) + ", expected F32");
    }
    CheckpointTensor n{t.name, t.shape, FloatBuffer(static_cast<std::size_t>(t.numel()))};  // read_raw fills it
    r->read_raw(t, n.data.data());
    h.update(n.data.data(), n.data.size() * sizeof(float));
    try {
      visit(r->metadata(), n);
    } catch (const std::exception&) {
      check_hash(path, want, fileio::xxh3_file(path.string()));  // what it rejects may be corruption
      throw;
    }
  }
  check_hash(path, want, h.digest());
  if (metadata != nullptr) *metadata = r->metadata();
}

std::vector<CheckpointTensor> read_tensors(const fs::path& path, const FileEntry& want, StMetadata* metadata = nullptr) {
  std::vector<CheckpointTensor> out;
  visit_tensors(path, want, [&](const StMetadata&, CheckpointTensor& t) { out.push_back(std::move(t)); }, metadata);
  return out;
}

nlohmann::json read_json(const fs::path& path, const FileEntry& want) {
  check_size(path, want);
  const std::string text = fileio::read_all(path.string());
  check_hash(path, want, fileio::xxh3(text.data(), text.size()));
  return parse_json_text(path, text);
}

// One listed file's size and checksum, read in full (no parsing).
void verify_file(const fs::path& dir, const nlohmann::json& man, const std::string& name) {
  const FileEntry want = expected_of(dir, man, name);
  check_size(dir / name, want);
  check_hash(dir / name, want, fileio::xxh3_file((dir / name).string()));
}

void verify_files(const fs::path& dir, const nlohmann::json& man) {
  for (auto it = man["files"].begin(); it != man["files"].end(); ++it) verify_file(dir, man, it.key());
}

}  // namespace

CheckpointView CheckpointData::view() const {
  CheckpointView v;
  v.weights = views_of(weights);
  v.master = views_of(master);
  v.adam_m = views_of(adam_m);
  v.adam_v = views_of(adam_v);
  v.optimizer = optimizer;
  v.data_position = data_position;
  v.rng = rng;
  v.config = config;
  return v;
}

std::string checkpoint_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%08lld", static_cast<long long>(step));
  return buf;
}

std::string staging_dir(const std::string& run_dir, std::int64_t step) {
  return (fs::path(run_dir) / (".tmp-" + checkpoint_dir_name(step))).string();
}

CheckpointFile write_tensor_file(const std::string& dir, const std::string& name,
                                 const std::vector<CheckpointTensorView>& tensors, const StMetadata& metadata) {
  const FileEntry e = write_tensors(fs::path(dir) / name, tensors, metadata);
  return {name, e.size, e.hash};
}

std::string save(const std::string& run_dir, std::int64_t step, const CheckpointView& ckpt) {
  GHT_EXPECTS(step >= 0, "checkpoint: step must be >= 0, got " + std::to_string(step));
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) ck_fail(run_dir, "cannot create run directory: " + ec.message());
  const std::string name = checkpoint_dir_name(step);
  const fs::path final_dir = fs::path(run_dir) / name;
  const fs::path tmp = staging_dir(run_dir, step);
  fs::remove_all(tmp, ec);  // a leftover of an interrupted save of this step
  fs::create_directory(tmp, ec);
  if (ec) ck_fail(tmp, "cannot create directory: " + ec.message());

  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  auto record = [&](const char* file, FileEntry e) {
    files[file] = {{"size", e.size}, {"xxh3_64", fileio::hex64(e.hash)}};
  };
  try {
    // The tensor files are independent: write and checksum them concurrently. For a model of
    // billions of parameters each is tens of GB, and one stream uses a fraction of an NVMe
    // drive's bandwidth (and one core for XXH3). wait() rethrows a task's exception.
    const std::pair<const char*, const std::vector<CheckpointTensorView>*> groups[] = {
        {kWeights, &ckpt.weights}, {kMaster, &ckpt.master}, {kAdamM, &ckpt.adam_m}, {kAdamV, &ckpt.adam_v}};
    FileEntry written[std::size(groups)];
    // Streamed weights come first, in this thread: their source may be a collective.
    if (ckpt.weights_source) written[0] = write_streamed(tmp / kWeights, ckpt.weights, ckpt.weights_source);
    tbb::task_group tasks;
    for (std::size_t i = ckpt.weights_source ? 1 : 0; i < std::size(groups); ++i) {
      tasks.run([&, i] { written[i] = write_tensors(tmp / groups[i].first, *groups[i].second); });
    }
    tasks.wait();
    for (std::size_t i = 0; i < std::size(groups); ++i) record(groups[i].first, written[i]);
    record(kOptimizer, write_text(tmp / kOptimizer, ckpt.optimizer.dump(2) + "\n"));
    record(kData, write_text(tmp / kData, ckpt.data_position.dump(2) + "\n"));
    record(kRng, write_text(tmp / kRng, ckpt.rng.dump(2) + "\n"));
    record(kConfig, write_text(tmp / kConfig, ckpt.config.dump(2) + "\n"));
    if (ckpt.extra_files) {
      for (const CheckpointFile& e : ckpt.extra_files(tmp.string())) {
        GHT_EXPECTS(!e.name.empty() && e.name.find('/') == std::string::npos && !files.contains(e.name) &&
                        e.name != kManifest && e.name != kMarker,
                    "checkpoint: bad or duplicate extra file name '" + e.name + "'");
        record(e.name.c_str(), {e.size, e.xxh3_64});
      }
    }
    const nlohmann::ordered_json manifest = {
        {"format", kFormat}, {"version", kFormatVersion}, {"step", step}, {"files", files}};
    const FileEntry man = write_text(tmp / kManifest, manifest.dump(2) + "\n");
    fileio::fsync_dir(tmp.string());

    // Move a same-step checkpoint aside rather than deleting it first, so that a crash here
    // still leaves its data on disk.
    const fs::path old = fs::path(run_dir) / (".old-" + name);
    const bool replacing = fs::exists(final_dir, ec);
    if (replacing) {
      fs::remove_all(old, ec);
      fs::rename(final_dir, old, ec);
      if (ec) ck_fail(final_dir, "cannot move the existing checkpoint aside: " + ec.message());
    }
    fs::rename(tmp, final_dir, ec);
    if (ec) ck_fail(final_dir, "cannot rename " + tmp.string() + " into place: " + ec.message());
    fileio::fsync_dir(run_dir);

    const nlohmann::ordered_json marker = {
        {"step", step}, {"manifest_size", man.size}, {"manifest_xxh3_64", fileio::hex64(man.hash)}};
    write_text(final_dir / kMarker, marker.dump(2) + "\n");
    fileio::fsync_dir(final_dir.string());
    if (replacing) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir.string();
}

std::string save(const std::string& run_dir, std::int64_t step, const CheckpointData& ckpt) {
  return save(run_dir, step, ckpt.view());
}

std::string verify(const std::string& ckpt_dir) {
  try {
    const nlohmann::json man = checked_manifest(ckpt_dir);
    verify_files(ckpt_dir, man);
  } catch (const io_error& e) {
    return e.what();
  } catch (const nlohmann::json::exception& e) {
    return "checkpoint " + ckpt_dir + ": malformed manifest or marker: " + e.what();
  }
  return {};
}

CheckpointData load(const std::string& ckpt_dir, const LoadOptions& opts) {
  const fs::path dir(ckpt_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) ck_fail(dir, "no such checkpoint directory");
  try {
    const nlohmann::json man = checked_manifest(dir);
    const auto tensors = [&](const char* name) { return read_tensors(dir / name, expected_of(dir, man, name)); };
    const auto json = [&](const char* name) { return read_json(dir / name, expected_of(dir, man, name)); };
    // Files the manifest lists beyond ours: read those asked for, check the others in full.
    CheckpointData d;
    for (auto it = man["files"].begin(); it != man["files"].end(); ++it) {
      const std::string& file = it.key();
      if (std::find(std::begin(kRequired), std::end(kRequired), file) != std::end(kRequired)) continue;
      if (std::find(opts.tensor_files.begin(), opts.tensor_files.end(), file) != opts.tensor_files.end()) {
        CheckpointTensorFile& t = d.tensor_files[file];
        t.tensors = read_tensors(dir / file, expected_of(dir, man, file), &t.metadata);
      } else if (opts.stream && !opts.stream_prefix.empty() && file.starts_with(opts.stream_prefix)) {
        visit_tensors(dir / file, expected_of(dir, man, file), [&](const StMetadata& m, CheckpointTensor& t) {
          opts.stream(ckpt_dir, file, m, CheckpointTensorView{t.name, t.shape, t.data});
        });
      } else {
        verify_file(dir, man, file);
      }
    }
    d.step = man["step"].get<std::int64_t>();
    // Read and checksum the tensor files concurrently (see save()).
    tbb::task_group tasks;
    tasks.run([&] { d.weights = tensors(kWeights); });
    if (opts.optimizer_state) {
      tasks.run([&] { d.master = tensors(kMaster); });
      tasks.run([&] { d.adam_m = tensors(kAdamM); });
      tasks.run([&] { d.adam_v = tensors(kAdamV); });
    }
    tasks.wait();
    d.optimizer = json(kOptimizer);
    d.data_position = json(kData);
    d.rng = json(kRng);
    d.config = json(kConfig);
    return d;
  } catch (const nlohmann::json::exception& e) {
    throw io_error("checkpoint " + ckpt_dir + ": malformed manifest or marker: " + e.what());
  }
}

std::optional<LoadedCheckpoint> load_latest(const std::string& run_dir, const LoadOptions& opts) {
  for (const std::int64_t step : list_checkpoints(run_dir)) {
    const std::string dir = (fs::path(run_dir) / checkpoint_dir_name(step)).string();
    try {
      return LoadedCheckpoint{dir, load(dir, opts)};
    } catch (const io_error& e) {
      log::warn("skipping checkpoint " + dir + ": " + e.what());
    }
  }
  return std::nullopt;
}

std::optional<LoadedCheckpoint> load_for_resume(const std::string& resume, const std::string& run_dir,
                                                const std::function<void(const std::string&)>& say,
                                                const LoadOptions& opts) {
  if (resume.empty()) return std::nullopt;
  if (resume != "auto") {
    std::error_code ec;
    // A run directory (no marker of its own, checkpoints inside): its newest good checkpoint.
    if (!fs::exists(fs::path(resume) / kMarker, ec) && !fs::exists(fs::path(resume) / kManifest, ec) &&
        !list_checkpoints(resume).empty()) {
      auto c = load_latest(resume, opts);
      if (!c) throw io_error("--resume " + resume + ": a run directory with no checkpoint that loads (see the warnings above)");
      return c;
    }
    return LoadedCheckpoint{resume, load(resume, opts)};
  }
  auto c = load_latest(run_dir, opts);
  if (!c) say("resume auto: no committed checkpoint in " + run_dir + "; starting fresh");
  return c;
}

std::vector<std::int64_t> list_checkpoints(const std::string& run_dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return steps;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::int64_t s = parse_step(e.path().filename().string());
    // Only canonical names: a hand-made "ckpt_5" next to "ckpt_00000005" would be ambiguous.
    if (s >= 0 && e.path().filename().string() == checkpoint_dir_name(s)) steps.push_back(s);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::optional<std::string> find_latest(const std::string& run_dir) {
  for (const std::int64_t step : list_checkpoints(run_dir)) {
    const std::string dir = (fs::path(run_dir) / checkpoint_dir_name(step)).string();
    const std::string why = verify(dir);
    if (why.empty()) return dir;
    log::warn("skipping checkpoint " + dir + ": " + why);
  }
  return std::nullopt;
}

std::vector<std::string> prune(const std::string& run_dir, int keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  std::error_code ec;
  int kept = 0;
  for (const std::int64_t step : list_checkpoints(run_dir)) {
    const fs::path dir = fs::path(run_dir) / checkpoint_dir_name(step);
    if (kept < keep && fs::exists(dir / kMarker, ec)) {
      ++kept;
      continue;
    }
    fs::remove_all(dir, ec);
    removed.push_back(dir.string());
  }
  std::vector<fs::path> leftovers;  // collected first: removing while iterating is unspecified
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(".tmp-ckpt_") || n.starts_with(".old-ckpt_")) leftovers.push_back(e.path());
  }
  for (const auto& p : leftovers) {
    fs::remove_all(p, ec);
    removed.push_back(p.string());
  }
  return removed;
}

}  // namespace ght::trainer
