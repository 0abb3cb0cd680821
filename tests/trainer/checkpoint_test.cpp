// Checkpoints: exact round trip, atomic layout, and each corruption (truncated file, flipped
// byte, missing COMMITTED marker, damaged manifest) giving an error that names the file, with
// find_latest falling back to the previous good checkpoint; prune keeps the newest N.
#include "trainer/checkpoint.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/file_io.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;

namespace {

using ght::test::error_of;

// One directory per test, removed on scope exit.
struct TempDir : ght::test::TempDir {
  TempDir() : ght::test::TempDir("ght_ckpt_test") {}
};

std::vector<CheckpointTensor> tensors(std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<CheckpointTensor> out;
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> shapes = {
      {"model.embed_tokens.weight", {32, 8}},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", {12, 8}},
      {"model.norm.weight", {8}}};
  for (const auto& [name, shape] : shapes) {
    CheckpointTensor t{name, shape, {}};
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    t.data.resize(static_cast<std::size_t>(n));
    for (auto& x : t.data) x = dist(rng);
    out.push_back(std::move(t));
  }
  return out;
}

CheckpointData make_data(std::uint32_t seed) {
  CheckpointData d;
  d.weights = tensors(seed, 0.02f);
  d.master = tensors(seed + 1, 0.02f);
  d.adam_m = tensors(seed + 2, 1e-3f);
  d.adam_v = tensors(seed + 3, 1e-6f);
  for (auto& t : d.adam_v) {
    for (auto& x : t.data) x = x * x;  // second moments are non-negative
  }
  d.optimizer = {{"step", seed}, {"beta1", 0.9}, {"beta2", 0.95}};
  d.data_position = {{"epoch", 1}, {"shard", 2}, {"index", 345}, {"seed", 1337}};
  d.rng = {{"mt19937_64", "123 456 789"}, {"seed", seed}};
  d.config = {{"model", {{"preset", "tiny"}, {"d_model", 96}}}, {"lr", 3e-4}};
  return d;
}

bool same_bytes(const std::vector<CheckpointTensor>& a, const std::vector<CheckpointTensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].data.size() != b[i].data.size()) return false;
    if (std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

void flip_byte(const fs::path& p, std::uintmax_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

TEST(Checkpoint, RoundTripIsExact) {
  TempDir run;
  const CheckpointData d = make_data(7);
  const std::string dir = save(run.str(), 7, d);
  EXPECT_EQ(fs::path(dir).filename(), "ckpt_00000007");
  for (const char* f : {"model.safetensors", "optimizer.master.safetensors", "optimizer.m.safetensors",
                        "optimizer.v.safetensors", "optimizer.json", "data.json", "rng.json", "config.json",
                        "manifest.json", "COMMITTED"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  }
  EXPECT_FALSE(fs::exists(run.path / ".tmp-ckpt_00000007"));
  EXPECT_EQ(verify(dir), "");

  const CheckpointData l = load(dir);
  EXPECT_EQ(l.step, 7);
  EXPECT_TRUE(same_bytes(l.weights, d.weights));
  EXPECT_TRUE(same_bytes(l.master, d.master));
  EXPECT_TRUE(same_bytes(l.adam_m, d.adam_m));
  EXPECT_TRUE(same_bytes(l.adam_v, d.adam_v));
  EXPECT_EQ(l.optimizer, d.optimizer);
  EXPECT_EQ(l.data_position, d.data_position);
  EXPECT_EQ(l.rng, d.rng);
  EXPECT_EQ(l.config, d.config);

  // The manifest records each file's real size and XXH3-64.
  const auto man = nlohmann::json::parse(fileio::read_all((fs::path(dir) / "manifest.json").string()));
  EXPECT_EQ(man["step"], 7);
  for (auto it = man["files"].begin(); it != man["files"].end(); ++it) {
    std::uint64_t size = 0;
    const std::uint64_t h = fileio::xxh3_file((fs::path(dir) / it.key()).string(), &size);
    EXPECT_EQ(it.value()["size"], size) << it.key();
    EXPECT_EQ(it.value()["xxh3_64"], fileio::hex64(h)) << it.key();
  }
}

TEST(Checkpoint, EmptyOptimizerGroupsAndViewsWork) {
  TempDir run;
  CheckpointData d = make_data(3);
  d.master.clear();  // e.g. fp32 training where the master weights are the weights
  const CheckpointView v = d.view();
  EXPECT_EQ(v.weights[1].data.data(), d.weights[1].data.data()) << "a view borrows, it does not copy";
  const CheckpointData l = load(save(run.str(), 3, v));
  EXPECT_TRUE(l.master.empty());
  EXPECT_TRUE(same_bytes(l.weights, d.weights));
}

TEST(Checkpoint, SavingTheSameStepReplacesIt) {
  TempDir run;
  save(run.str(), 5, make_data(1));
  const CheckpointData second = make_data(2);
  const std::string dir = save(run.str(), 5, second);
  EXPECT_TRUE(same_bytes(load(dir).weights, second.weights));
  EXPECT_FALSE(fs::exists(run.path / ".old-ckpt_00000005"));
}

TEST(Checkpoint, ShapeMismatchIsRejectedAndLeavesNothing) {
  TempDir run;
  CheckpointData d = make_data(1);
  d.adam_m[0].data.pop_back();
  const std::string msg = error_of<ght::logic_error>([&] { save(run.str(), 1, d); });
  EXPECT_CONTAINS(msg, "model.embed_tokens.weight");
  EXPECT_TRUE(list_checkpoints(run.str()).empty());
  EXPECT_FALSE(fs::exists(run.path / ".tmp-ckpt_00000001"));
}

TEST(CheckpointCorruption, TruncatedFileIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  const fs::path f = fs::path(dir) / "optimizer.m.safetensors";
  fs::resize_file(f, fs::file_size(f) - 5);
  const std::string msg = error_of<ght::io_error>([&] { (void)load(dir); });
  EXPECT_CONTAINS(msg, f.string());
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(verify(dir), "optimizer.m.safetensors");
}

TEST(CheckpointCorruption, FlippedByteIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  const fs::path f = fs::path(dir) / "model.safetensors";
  flip_byte(f, fs::file_size(f) - 7);  // inside the tensor data: the safetensors header still parses
  const std::string msg = error_of<ght::io_error>([&] { (void)load(dir); });
  EXPECT_CONTAINS(msg, f.string());
  EXPECT_CONTAINS(msg, "checksum mismatch");
}

TEST(CheckpointCorruption, FlippedByteInAJsonFileIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  const fs::path f = fs::path(dir) / "data.json";
  flip_byte(f, 5);
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)load(dir); }), f.string());
}

TEST(CheckpointCorruption, MissingMarkerIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  fs::remove(fs::path(dir) / "COMMITTED");
  const std::string msg = error_of<ght::io_error>([&] { (void)load(dir); });
  EXPECT_CONTAINS(msg, (fs::path(dir) / "COMMITTED").string());
  EXPECT_CONTAINS(msg, "never committed");
}

TEST(CheckpointCorruption, DamagedManifestIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  const fs::path f = fs::path(dir) / "manifest.json";
  flip_byte(f, 30);
  const std::string msg = error_of<ght::io_error>([&] { (void)load(dir); });
  EXPECT_CONTAINS(msg, f.string());
  EXPECT_CONTAINS(msg, "COMMITTED marker");
}

TEST(CheckpointCorruption, MissingFileIsNamed) {
  TempDir run;
  const std::string dir = save(run.str(), 10, make_data(1));
  fs::remove(fs::path(dir) / "rng.json");
  const std::string msg = error_of<ght::io_error>([&] { (void)load(dir); });
  EXPECT_CONTAINS(msg, "rng.json");
  EXPECT_CONTAINS(msg, "missing");
}

TEST(CheckpointResume, FindLatestSkipsCorruptOnesWithAWarning) {
  TempDir run;
  EXPECT_EQ(find_latest(run.str()), std::nullopt);
  EXPECT_EQ(find_latest((run.path / "does-not-exist").string()), std::nullopt);
  save(run.str(), 10, make_data(10));
  save(run.str(), 20, make_data(20));
  save(run.str(), 30, make_data(30));
  const fs::path c20 = run.path / "ckpt_00000020", c30 = run.path / "ckpt_00000030";
  EXPECT_EQ(find_latest(run.str()), c30.string());
  EXPECT_EQ(list_checkpoints(run.str()), (std::vector<std::int64_t>{30, 20, 10}));

  flip_byte(c30 / "optimizer.v.safetensors", fs::file_size(c30 / "optimizer.v.safetensors") - 1);
  fs::remove(c20 / "COMMITTED");
  // Directories that are not checkpoints are ignored.
  fs::create_directory(run.path / "ckpt_abc");
  fs::create_directory(run.path / ".tmp-ckpt_00000040");

  testing::internal::CaptureStderr();
  const auto latest = find_latest(run.str());
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, (run.path / "ckpt_00000010").string());
  EXPECT_CONTAINS(err, "skipping checkpoint " + c30.string());
  EXPECT_CONTAINS(err, "optimizer.v.safetensors");
  EXPECT_CONTAINS(err, "skipping checkpoint " + c20.string());
  EXPECT_CONTAINS(err, "COMMITTED");
  EXPECT_EQ(load(*latest).optimizer["step"], 10);
}

TEST(CheckpointResume, FallsBackAfterATruncatedFileToo) {
  TempDir run;
  save(run.str(), 1, make_data(1));
  const std::string dir2 = save(run.str(), 2, make_data(2));
  fs::resize_file(fs::path(dir2) / "model.safetensors", 100);
  testing::internal::CaptureStderr();
  const auto latest = find_latest(run.str());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest, (run.path / "ckpt_00000001").string());
  EXPECT_CONTAINS(err, "model.safetensors");
}

TEST(CheckpointResume, LoadLatestSkipsCorruptOnesWhileLoading) {
  TempDir run;
  EXPECT_EQ(load_latest(run.str()), std::nullopt);
  save(run.str(), 10, make_data(10));
  save(run.str(), 20, make_data(20));
  const fs::path c20 = run.path / "ckpt_00000020";
  flip_byte(c20 / "optimizer.master.safetensors", fs::file_size(c20 / "optimizer.master.safetensors") - 3);
  testing::internal::CaptureStderr();
  const auto latest = load_latest(run.str());
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->dir, (run.path / "ckpt_00000010").string());
  EXPECT_EQ(latest->data.optimizer["step"], 10);
  EXPECT_CONTAINS(err, "skipping checkpoint " + c20.string());
  EXPECT_CONTAINS(err, "optimizer.master.safetensors");
  EXPECT_CONTAINS(err, "checksum mismatch");
  const CheckpointData want = make_data(10);
  ASSERT_EQ(latest->data.adam_v.size(), want.adam_v.size());
  for (std::size_t i = 0; i < want.adam_v.size(); ++i) EXPECT_EQ(latest->data.adam_v[i].data, want.adam_v[i].data);
}

TEST(CheckpointResume, WeightsOnlyLoadReadsNoOptimizerState) {
  TempDir run;
  const std::string dir = save(run.str(), 5, make_data(5));
  // Damage the moments: a weights-only load does not read them, a full load must notice.
  flip_byte(fs::path(dir) / "optimizer.v.safetensors", fs::file_size(fs::path(dir) / "optimizer.v.safetensors") - 1);
  LoadOptions weights_only;
  weights_only.optimizer_state = false;
  const CheckpointData c = load(dir, weights_only);
  EXPECT_EQ(c.weights.size(), make_data(5).weights.size());
  EXPECT_TRUE(c.master.empty() && c.adam_m.empty() && c.adam_v.empty());
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)load(dir); }), "optimizer.v.safetensors");
}

TEST(CheckpointResume, ForResumeFollowsTheFlag) {
  TempDir run;
  std::vector<std::string> said;
  const auto say = [&](const std::string& m) { said.push_back(m); };
  EXPECT_EQ(load_for_resume("", run.str(), say), std::nullopt);
  EXPECT_TRUE(said.empty());
  EXPECT_EQ(load_for_resume("auto", run.str(), say), std::nullopt);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_CONTAINS(said[0], "starting fresh");
  const std::string dir = save(run.str(), 3, make_data(3));
  EXPECT_EQ(load_for_resume("auto", run.str(), say)->dir, dir);
  EXPECT_EQ(load_for_resume(dir, run.str(), say)->data.step, 3);
  // An explicit directory must load: no silent fresh start.
  EXPECT_THROW((void)load_for_resume((run.path / "ckpt_00000099").string(), run.str(), say), ght::io_error);
}

TEST(CheckpointPrune, KeepsTheNewestCommitted) {
  TempDir run;
  for (int s : {1, 2, 3, 4, 5}) save(run.str(), s, make_data(static_cast<std::uint32_t>(s)));
  fs::remove(run.path / "ckpt_00000005" / "COMMITTED");  // an interrupted save
  fs::create_directory(run.path / ".tmp-ckpt_00000006");
  const auto removed = prune(run.str(), 2);
  EXPECT_EQ(list_checkpoints(run.str()), (std::vector<std::int64_t>{4, 3}));
  EXPECT_FALSE(fs::exists(run.path / ".tmp-ckpt_00000006"));
  EXPECT_EQ(removed.size(), 4u);
  EXPECT_TRUE(prune(run.str(), 0).empty()) << "keep <= 0 keeps everything";
  EXPECT_EQ(list_checkpoints(run.str()).size(), 2u);
}
