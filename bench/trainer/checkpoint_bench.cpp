// Checkpoint throughput: trainer::save() and load() of a 4-file checkpoint (weights, master, m,
// v) against raw, checksummed file I/O of the same bytes in the same run, as one stream and as
// four concurrent streams (the storage's practical limit). Page cache is dropped for the files
// (fsync, then POSIX_FADV_DONTNEED) before every read, so reads come from the device.
//
//   checkpoint_bench [--gib 4] [--dir build/bench-ckpt] [--reps 3] [--json out.json]
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <tbb/task_group.h>

#include "trainer/checkpoint.hpp"
#include "trainer/file_io.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void drop_cache(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_dir(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cache(e.path());
}

// Raw checksummed write of `bufs` into `files` (one file per buffer, or all into files[0]).
void raw_write(const std::vector<fs::path>& files, const std::vector<std::vector<float>>& bufs, bool concurrent) {
  if (!concurrent) {
    fileio::OutFile f(files[0].string(), true);
    for (const auto& b : bufs) f.write(b.data(), b.size() * sizeof(float));
    f.close();
    return;
  }
  tbb::task_group g;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    g.run([&, i] {
      fileio::OutFile f(files[i].string(), true);
      f.write(bufs[i].data(), bufs[i].size() * sizeof(float));
      f.close();
    });
  }
  g.wait();
}

void raw_read(const std::vector<fs::path>& files) {
  tbb::task_group g;
  for (const auto& p : files) g.run([&p] { (void)fileio::xxh3_file(p.string()); });
  g.wait();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/load throughput against raw file I/O"};
  double gib = 4;
  std::string dir = "build/bench-ckpt", json_path;
  int reps = 3;
  app.add_option("--gib", gib, "Checkpoint size in GiB (four equal tensor files)")->check(CLI::Range(0.01, 1024.0));
  app.add_option("--dir", dir, "Scratch directory (removed at the end)");
  app.add_option("--reps", reps, "Repetitions (median reported)")->check(CLI::Range(1, 100));
  app.add_option("--json", json_path, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  const fs::path root(dir);
  fs::remove_all(root);
  fs::create_directories(root);
  const auto n = static_cast<std::size_t>(gib * (1ull << 30) / 4 / sizeof(float));
  const double bytes = 4.0 * static_cast<double>(n) * sizeof(float);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(n));
  for (std::size_t b = 0; b < 4; ++b) {
    for (std::size_t i = 0; i < n; ++i) bufs[b][i] = static_cast<float>((i * 2654435761u + b) % 1000003) * 1e-3f;
  }
  CheckpointView view;
  std::vector<CheckpointTensorView>* groups[] = {&view.weights, &view.master, &view.adam_m, &view.adam_v};
  for (std::size_t b = 0; b < 4; ++b) {
    groups[b]->push_back({"t" + std::to_string(b), {static_cast<std::int64_t>(n)}, bufs[b]});
  }
  view.optimizer = {{"step", 1}};

  const std::vector<fs::path> one = {root / "one.bin"};
  const std::vector<fs::path> four = {root / "a.bin", root / "b.bin", root / "c.bin", root / "d.bin"};
  std::vector<double> w1, w4, r1, r4, ws, rl, vf, rc;
  for (int r = 0; r < reps; ++r) {
    std::printf("rep %d/%d ...\n", r + 1, reps);
    for (const auto& p : one) fs::remove(p);  // truncating last rep's files would be timed too
    for (const auto& p : four) fs::remove(p);
    double t = now_s();
    raw_write(one, bufs, false);
    w1.push_back(now_s() - t);
    t = now_s();
    raw_write(four, bufs, true);
    w4.push_back(now_s() - t);
    t = now_s();
    const std::string ck = save(root.string(), r, view);
    ws.push_back(now_s() - t);

    for (const auto& p : one) drop_cache(p);
    t = now_s();
    raw_read(one);
    r1.push_back(now_s() - t);
    for (const auto& p : four) drop_cache(p);
    t = now_s();
    raw_read(four);
    r4.push_back(now_s() - t);
    drop_cache_dir(ck);
    t = now_s();
    const std::string why = verify(ck);  // the separate pass that load() used to make first
    vf.push_back(now_s() - t);
    if (!why.empty()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", why.c_str());
      return 1;
    }
    drop_cache_dir(ck);
    t = now_s();
    const CheckpointData d = load(ck);
    rl.push_back(now_s() - t);
    t = now_s();
    const CheckpointData cached = load(ck);  // files now in page cache: the in-memory cost alone
    rc.push_back(now_s() - t);
    const auto same = [&](const CheckpointData& x) {
      return !x.adam_v.empty() && std::equal(x.adam_v[0].data.begin(), x.adam_v[0].data.end(), bufs[3].begin(),
                                             bufs[3].end());
    };
    if (!same(d) || !same(cached)) {
      std::fprintf(stderr, "checkpoint_bench: loaded data differs from what was saved\n");
      return 1;
    }
    fs::remove_all(ck);
  }
  fs::remove_all(root);

  const auto gbps = [&](const std::vector<double>& s) { return bytes / median(s) / 1e9; };
  const double wlim = std::max(gbps(w1), gbps(w4)), rlim = std::max(gbps(r1), gbps(r4));
  std::printf("\ncheckpoint of %.2f GiB (4 tensor files), median of %d; GB/s, and ratio to the faster raw rate\n",
              gib, reps);
  std::printf("%-34s %9s %7s\n", "", "GB/s", "ratio");
  std::printf("%-34s %9.2f %7.2f\n", "raw write+xxh3+fsync, 1 stream", gbps(w1), gbps(w1) / wlim);
  std::printf("%-34s %9.2f %7.2f\n", "raw write+xxh3+fsync, 4 streams", gbps(w4), gbps(w4) / wlim);
  std::printf("%-34s %9.2f %7.2f\n", "save()", gbps(ws), gbps(ws) / wlim);
  std::printf("%-34s %9.2f %7.2f\n", "raw read+xxh3, 1 stream", gbps(r1), gbps(r1) / rlim);
  std::printf("%-34s %9.2f %7.2f\n", "raw read+xxh3, 4 streams", gbps(r4), gbps(r4) / rlim);
  std::printf("%-34s %9.2f %7.2f\n", "verify() (sequential, read+xxh3)", gbps(vf), gbps(vf) / rlim);
  std::printf("%-34s %9.2f %7.2f\n", "load() (verify while reading)", gbps(rl), gbps(rl) / rlim);
  std::printf("%-34s %9.2f %7s\n", "load() again, from page cache", gbps(rc), "-");
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"gib", gib}, {"reps", reps},
                                               {"write_gbps", {{"raw1", gbps(w1)}, {"raw4", gbps(w4)}, {"save", gbps(ws)}}},
                                               {"read_gbps", {{"raw1", gbps(r1)}, {"raw4", gbps(r4)}, {"verify", gbps(vf)}, {"load", gbps(rl)}, {"load_cached", gbps(rc)}}}}
                                    .dump(2)
                             << "\n";
  }
  return 0;
}
