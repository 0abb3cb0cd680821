// Link model: built-in profiles, strict JSON profiles, resolution per GHT_LINK_PROFILE and the
// probe cache file. CPU-only; the probe itself is tested in probe_test.cu.
#include "tier/link.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "tier/config.hpp"
#include "tier/detail/link_detail.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

namespace {

namespace fs = std::filesystem;
using ght::LinkKind;
using ght::tier::LinkNumbers;

const char* const kFieldNames[] = {"h2d_bps",         "d2h_bps",          "bidir_bps",
                                   "kernel_read_bps", "kernel_write_bps", "host_triad_bps",
                                   "hbm_bps"};

void expect_same_numbers(const LinkNumbers& a, const LinkNumbers& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.h2d_bps, b.h2d_bps);
  EXPECT_EQ(a.d2h_bps, b.d2h_bps);
  EXPECT_EQ(a.bidir_bps, b.bidir_bps);
  EXPECT_EQ(a.kernel_read_bps, b.kernel_read_bps);
  EXPECT_EQ(a.kernel_write_bps, b.kernel_write_bps);
  EXPECT_EQ(a.host_triad_bps, b.host_triad_bps);
  EXPECT_EQ(a.hbm_bps, b.hbm_bps);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path project_root() {
  return fs::path(GHT_SOURCE_DIR);  // tests/CMakeLists.txt
}

/// A valid pcie profile as JSON, to be broken one field at a time.
nlohmann::json valid_profile() {
  return nlohmann::json::parse(ght::tier::builtin_profile("pcie5").to_json());
}

/// Expects from_json to throw io_error whose message names the origin and every `needles`.
void expect_rejected(const std::string& text, std::initializer_list<std::string> needles) {
  const std::string origin = "/tmp/broken-profile.json";
  try {
    (void)LinkNumbers::from_json(text, origin);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const ght::io_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(origin), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << n << " in: " << msg;
  }
}

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ght-link-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    ght::config::cfg().set_flag("GHT_CACHE_DIR", dir_.string());
  }
  void TearDown() override {
    ght::config::cfg().set_flag("GHT_LINK_PROFILE", "measured");
    ght::config::cfg().set_flag("GHT_CACHE_DIR", "");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// ---- built-in profiles ------------------------------------------------------------------------

TEST(LinkProfiles, BuiltinValuesMatchHardwareNotes) {
  const LinkNumbers g = ght::tier::builtin_profile("gh200");
  EXPECT_EQ(g.name, "gh200");
  EXPECT_EQ(g.source, "builtin");
  EXPECT_EQ(g.kind, LinkKind::c2c);
  EXPECT_DOUBLE_EQ(g.h2d_bps, 375e9);
  EXPECT_DOUBLE_EQ(g.d2h_bps, 297e9);
  EXPECT_DOUBLE_EQ(g.bidir_bps, 600e9);
  EXPECT_DOUBLE_EQ(g.kernel_read_bps, 342e9);
  EXPECT_DOUBLE_EQ(g.kernel_write_bps, 297e9);
  EXPECT_DOUBLE_EQ(g.host_triad_bps, 486e9);
  EXPECT_DOUBLE_EQ(g.hbm_bps, 3.4e12);

  const LinkNumbers p = ght::tier::builtin_profile("pcie5");
  EXPECT_EQ(p.kind, LinkKind::pcie);
  EXPECT_DOUBLE_EQ(p.h2d_bps, 55.4e9);
  EXPECT_DOUBLE_EQ(p.d2h_bps, 55.3e9);
  EXPECT_DOUBLE_EQ(p.bidir_bps, 99.8e9);
  EXPECT_DOUBLE_EQ(p.kernel_read_bps, 51.3e9);
  EXPECT_DOUBLE_EQ(p.kernel_write_bps, 52.6e9);
  EXPECT_DOUBLE_EQ(p.host_triad_bps, 111e9);
  EXPECT_DOUBLE_EQ(p.hbm_bps, 4.43e12);

  const LinkNumbers n = ght::tier::builtin_profile("none");
  EXPECT_EQ(n.kind, LinkKind::none);
  for (double LinkNumbers::*m :
       {&LinkNumbers::h2d_bps, &LinkNumbers::d2h_bps, &LinkNumbers::bidir_bps,
        &LinkNumbers::kernel_read_bps, &LinkNumbers::kernel_write_bps,
        &LinkNumbers::host_triad_bps, &LinkNumbers::hbm_bps}) {
    EXPECT_EQ(n.*m, 0.0);
  }

  expect_same_numbers(ght::tier::builtin_profile("GH200"), g);  // case-insensitive
  EXPECT_THROW((void)ght::tier::builtin_profile("gh100"), ght::logic_error);
  EXPECT_EQ(ght::tier::builtin_profile_for(LinkKind::c2c).name, "gh200");
  EXPECT_EQ(ght::tier::builtin_profile_for(LinkKind::pcie).name, "pcie5");
  EXPECT_EQ(ght::tier::builtin_profile_for(LinkKind::none).name, "none");
}

TEST(LinkProfiles, HbmCarriesOverToAnotherGpuByItsPeak) {
  // An H100 SXM reports HBM3 at 2,619 MHz on 5,120 bits: 3.352 TB/s.
  const double h100 = 2 * 2619e6 * 5120 / 8;
  LinkNumbers p = ght::tier::builtin_profile("pcie5");
  ght::tier::scale_hbm_to_gpu(p, h100);
  EXPECT_NEAR(p.hbm_bps, 4.43e12 * h100 / ght::tier::builtin_profile_hbm_peak("pcie5"), 1e6);
  EXPECT_NEAR(p.hbm_bps / 1e12, 3.02, 0.01);
  EXPECT_NE(p.source.find("scaled to this GPU's HBM peak, 3.35 of the profile's 4.92 TB/s"), std::string::npos)
      << p.source;
  // Only HBM moves: the link and host figures are the profile's.
  const LinkNumbers ref = ght::tier::builtin_profile("pcie5");
  EXPECT_EQ(p.h2d_bps, ref.h2d_bps);
  EXPECT_EQ(p.kernel_read_bps, ref.kernel_read_bps);
  EXPECT_EQ(p.host_triad_bps, ref.host_triad_bps);

  // The profile's own GPU gets the profile's figure back.
  LinkNumbers g = ght::tier::builtin_profile("gh200");
  ght::tier::scale_hbm_to_gpu(g, ght::tier::builtin_profile_hbm_peak("gh200"));
  EXPECT_DOUBLE_EQ(g.hbm_bps, 3.4e12);

  // An unknown peak, or a profile with no GPU behind it, changes nothing.
  LinkNumbers q = ght::tier::builtin_profile("pcie5");
  ght::tier::scale_hbm_to_gpu(q, 0);
  expect_same_numbers(q, ref);
  EXPECT_EQ(q.source, "builtin");
  LinkNumbers n = ght::tier::builtin_profile("none");
  ght::tier::scale_hbm_to_gpu(n, h100);
  EXPECT_EQ(n.hbm_bps, 0.0);
  EXPECT_EQ(ght::tier::builtin_profile_hbm_peak("measured"), 0.0);
}

TEST(LinkProfiles, ShippedProfileFilesParseAndMatchBuiltins) {
  const fs::path dir = project_root() / "tier" / "profiles";
  ASSERT_TRUE(fs::exists(dir)) << dir;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    ++files;
    const LinkNumbers n = LinkNumbers::from_json(slurp(e.path()), e.path().string());
    const std::string stem = e.path().stem().string();
    if (stem == "gh200" || stem == "pcie5") {
      expect_same_numbers(n, ght::tier::builtin_profile(stem));
      EXPECT_EQ(n.name, stem);
    }
  }
  EXPECT_GE(files, 2);
}

// ---- JSON -------------------------------------------------------------------------------------

TEST(LinkJson, RoundTripsBuiltinsAndRandomNumbers) {
  for (const char* name : {"gh200", "pcie5", "none"}) {
    const LinkNumbers a = ght::tier::builtin_profile(name);
    const LinkNumbers b = LinkNumbers::from_json(a.to_json(), "round-trip");
    expect_same_numbers(a, b);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.source, a.source);
  }
  std::mt19937_64 rng(20240520);
  std::uniform_real_distribution<double> dist(1e8, 9e12);
  for (int i = 0; i < 50; ++i) {
    LinkNumbers a;
    a.name = "random-" + std::to_string(i);
    a.source = "test";
    a.kind = i % 2 ? LinkKind::c2c : LinkKind::pcie;
    for (double LinkNumbers::*m :
         {&LinkNumbers::h2d_bps, &LinkNumbers::d2h_bps, &LinkNumbers::bidir_bps,
          &LinkNumbers::kernel_read_bps, &LinkNumbers::kernel_write_bps,
          &LinkNumbers::host_triad_bps, &LinkNumbers::hbm_bps}) {
      a.*m = dist(rng);
    }
    const LinkNumbers b = LinkNumbers::from_json(a.to_json(), "round-trip");
    expect_same_numbers(a, b);  // exact: the JSON writer prints round-trip precision
    EXPECT_EQ(b.name, a.name);
  }
}

TEST(LinkJson, NameAndSourceDefaultToTheOrigin) {
  auto j = valid_profile();
  j.erase("name");
  j.erase("source");
  const LinkNumbers n = LinkNumbers::from_json(j.dump(), "/etc/ght/site.json");
  EXPECT_EQ(n.name, "/etc/ght/site.json");
  EXPECT_EQ(n.source, "file:/etc/ght/site.json");
}

TEST(LinkProfiles, HostTriadOriginNamesItsSource) {
  // The plan prints where its CPU AdamW rate comes from: the Grace figure cites its measurement.
  EXPECT_NE(ght::tier::host_triad_origin(ght::tier::builtin_profile("gh200")).find("arXiv 2407.07850"), std::string::npos);
  EXPECT_NE(ght::tier::host_triad_origin(ght::tier::builtin_profile("pcie5")).find("measured"), std::string::npos);
  ght::tier::LinkNumbers cached = ght::tier::builtin_profile("pcie5");
  cached.source = "cache:/tmp/x.json";
  EXPECT_NE(ght::tier::host_triad_origin(cached).find("this host"), std::string::npos);
  ght::tier::LinkNumbers file = ght::tier::builtin_profile("pcie5");
  file.source = "file:my-link.json";
  EXPECT_EQ(ght::tier::host_triad_origin(file), "file:my-link.json");
}

TEST(LinkJson, RejectsMissingFieldsNamingThem) {
  for (const char* f : kFieldNames) {
    auto j = valid_profile();
    j.erase(f);
    expect_rejected(j.dump(), {"missing field", std::string("'") + f + "'"});
  }
  auto j = valid_profile();
  j.erase("kind");
  expect_rejected(j.dump(), {"missing field 'kind'"});
}

TEST(LinkJson, RejectsNegativeZeroAndImplausibleValues) {
  for (const char* f : kFieldNames) {
    auto j = valid_profile();
    j[f] = -55.4e9;
    expect_rejected(j.dump(), {std::string("'") + f + "'", ">= 0"});
    j[f] = 0.0;
    expect_rejected(j.dump(), {std::string("'") + f + "'", "> 0 for link kind pcie"});
    j[f] = 55.4;  // GB/s written where bytes/s is expected
    expect_rejected(j.dump(), {std::string("'") + f + "'", "bytes per second"});
  }
  // Zeros are fine where nothing moves.
  auto none = nlohmann::json::parse(ght::tier::builtin_profile("none").to_json());
  none["host_triad_bps"] = 80e9;
  const LinkNumbers n = LinkNumbers::from_json(none.dump(), "cpu-only.json");
  EXPECT_EQ(n.kind, LinkKind::none);
  EXPECT_EQ(n.host_triad_bps, 80e9);
}

TEST(LinkJson, RejectsWrongTypes) {
  auto j = valid_profile();
  j["h2d_bps"] = "55.4e9";
  expect_rejected(j.dump(), {"'h2d_bps'", "must be a number", "string"});
  j = valid_profile();
  j["d2h_bps"] = true;
  expect_rejected(j.dump(), {"'d2h_bps'", "must be a number", "boolean"});
  j = valid_profile();
  j["hbm_bps"] = nullptr;
  expect_rejected(j.dump(), {"'hbm_bps'", "null"});
  j = valid_profile();
  j["kind"] = 2;
  expect_rejected(j.dump(), {"'kind'", "must be a string"});
  j = valid_profile();
  j["kind"] = "nvlink";
  expect_rejected(j.dump(), {"'kind'", "nvlink", "none|pcie|c2c"});
  j = valid_profile();
  j["name"] = 7;
  expect_rejected(j.dump(), {"'name'", "must be a string"});
  j = valid_profile();
  j["meta"] = "x";
  expect_rejected(j.dump(), {"'meta'", "object"});
  j = valid_profile();
  j["h2d_gbps"] = 55.4;
  expect_rejected(j.dump(), {"unknown field 'h2d_gbps'"});
}

TEST(LinkJson, RejectsWhatIsNotAJsonObject) {
  expect_rejected("{\"kind\": \"pcie\", ", {"not valid JSON"});
  expect_rejected("", {"not valid JSON"});
  expect_rejected("h2d_bps = 55.4e9", {"not valid JSON"});
  expect_rejected("[1, 2, 3]", {"expected a JSON object", "array"});
}

// ---- resolution -------------------------------------------------------------------------------

TEST_F(LinkTest, ResolvesBuiltinNames) {
  for (const char* name : {"pcie5", "gh200", "none", "PCIe5"}) {
    ght::config::cfg().set_flag("GHT_LINK_PROFILE", name);
    const LinkNumbers n = ght::tier::resolve_link_numbers();
    expect_same_numbers(n, ght::tier::builtin_profile(name));
    EXPECT_EQ(n.source, "builtin");
  }
}

TEST_F(LinkTest, ResolvesAFile) {
  LinkNumbers want = ght::tier::builtin_profile("gh200");
  want.name = "site-profile";
  want.h2d_bps = 411e9;
  want.d2h_bps = 170e9;
  const fs::path path = dir_ / "site.json";
  std::ofstream(path) << want.to_json();
  ght::config::cfg().set_flag("GHT_LINK_PROFILE", path.string());
  const LinkNumbers n = ght::tier::resolve_link_numbers();
  expect_same_numbers(n, want);
  EXPECT_EQ(n.name, "site-profile");
  EXPECT_EQ(n.source, "file:" + path.string());
}

TEST_F(LinkTest, MissingOrBrokenFileFailsNamingThePath) {
  const std::string missing = (dir_ / "nonexistent.json").string();
  ght::config::cfg().set_flag("GHT_LINK_PROFILE", missing);
  try {
    (void)ght::tier::resolve_link_numbers();
    FAIL() << "a missing profile file was accepted";
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const fs::path broken = dir_ / "broken.json";
  std::ofstream(broken) << "{\"kind\": \"pcie\", \"h2d_bps\": -1}";
  ght::config::cfg().set_flag("GHT_LINK_PROFILE", broken.string());
  try {
    (void)ght::tier::resolve_link_numbers();
    FAIL() << "a broken profile file was accepted";
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find(broken.string()), std::string::npos) << e.what();
  }
}

TEST_F(LinkTest, MeasuredUsesTheCacheElseTheProfileOfTheLinkKind) {
  ght::config::cfg().set_flag("GHT_LINK_PROFILE", "measured");
  const auto& topo = ght::tier::topology();
  const LinkNumbers fallback = ght::tier::resolve_link_numbers();
  expect_same_numbers(fallback, ght::tier::builtin_profile_for(topo.link));
  EXPECT_EQ(fallback.source.rfind("builtin (GHT_LINK_PROFILE=measured", 0), 0u) << fallback.source;
  if (topo.gpu() == nullptr) {
    EXPECT_EQ(fallback.kind, LinkKind::none);
    return;  // without a GPU there is no cache to use
  }
  EXPECT_NE(fallback.source.find("no probe cache"), std::string::npos) << fallback.source;

  // A cache for this GPU, as the probe would write it.
  ght::tier::detail::ProbeReport r;
  r.numbers = ght::tier::builtin_profile_for(topo.link);
  r.numbers.name = "measured";
  r.numbers.source = "probe";
  r.numbers.h2d_bps = 12.345e9;
  const std::string path = ght::tier::probe_cache_path();
  ght::tier::detail::write_file_atomically(path, ght::tier::detail::probe_cache_json(r, topo));
  const LinkNumbers cached = ght::tier::resolve_link_numbers();
  expect_same_numbers(cached, r.numbers);
  EXPECT_EQ(cached.source, "cache:" + path);
}

// ---- cache ------------------------------------------------------------------------------------

TEST_F(LinkTest, CachePathFollowsOptionsAndEnvironment) {
  const auto& topo = ght::tier::topology();
  const std::string path = ght::tier::probe_cache_path();
  EXPECT_EQ(path.rfind(dir_.string() + "/link-", 0), 0u) << path;
  EXPECT_NE(path.find(".json"), std::string::npos);
  if (const auto* g = topo.gpu()) {
    EXPECT_NE(path.find(g->uuid), std::string::npos) << path;
    EXPECT_NE(path.find("drv" + std::to_string(g->driver_version)), std::string::npos) << path;
  }

  ght::config::cfg().set_flag("GHT_CACHE_DIR", "");
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg != nullptr ? old_xdg : "";
  setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
  EXPECT_EQ(ght::tier::detail::cache_dir(), "/xdg/cache/ghtier");
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    EXPECT_EQ(ght::tier::detail::cache_dir(), std::string(home) + "/.cache/ghtier");
  }
  if (old_xdg != nullptr) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST_F(LinkTest, CacheFileIsWrittenAtomicallyWithMeta) {
  const auto& topo = ght::tier::topology();
  ght::tier::detail::ProbeReport r;
  r.numbers = ght::tier::builtin_profile("pcie5");
  r.numbers.name = "measured";
  r.numbers.source = "probe";
  r.copy_bytes = 512u << 20;
  const std::string path = (dir_ / "sub" / "cache.json").string();
  ght::tier::detail::write_file_atomically(path, ght::tier::detail::probe_cache_json(r, topo));
  r.numbers.d2h_bps = 50e9;  // overwrite in place
  ght::tier::detail::write_file_atomically(path, ght::tier::detail::probe_cache_json(r, topo));

  const LinkNumbers back = LinkNumbers::from_json(slurp(path), path);
  expect_same_numbers(back, r.numbers);
  const auto j = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(j["meta"]["hostname"], topo.hostname);
  EXPECT_EQ(j["meta"]["copy_bytes"], r.copy_bytes);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "sub")) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "cache.json") << "left behind: " << e.path();
  }
  EXPECT_EQ(entries, 1);

  try {
    ght::tier::detail::write_file_atomically("/proc/ght-no-such-dir/x.json", "{}");
    FAIL() << "write into /proc succeeded";
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/ght-no-such-dir"), std::string::npos) << e.what();
  }
}

TEST(LinkText, ListsEveryFigure) {
  const std::string t = ght::tier::builtin_profile("pcie5").format_text();
  EXPECT_NE(t.find("kind pcie"), std::string::npos) << t;
  EXPECT_NE(t.find("55.4 GB/s"), std::string::npos) << t;
  EXPECT_NE(t.find("99.8 GB/s"), std::string::npos) << t;
  EXPECT_NE(t.find("4.43 TB/s"), std::string::npos) << t;
}

#ifndef GHT_HAVE_CUDA
TEST(LinkProbe, CpuOnlyBuildRefusesClearly) {
  try {
    (void)ght::tier::probe_and_cache();
    FAIL() << "probe ran without CUDA";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
