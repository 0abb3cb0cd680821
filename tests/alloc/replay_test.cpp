// Replaying allocation logs: peaks and fragmentation against hand-computed values, and
// malformed files rejected with file:line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alloc/replay.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

ReplayReport replay_text(const std::string& text) {
  std::istringstream in(text);
  return replay_log(in, "log.csv");
}

constexpr const char* kHeader = "thread,time_ns,action,pointer,size,tier,class,stream\n";

TEST(Replay, PeakAndFragmentation) {
  // A, B, C of 256 B; B freed; D of 512 B cannot use B's hole, so the best-fit heap grows to
  // 1280 B while at most 1024 B are live: fragmentation 1 - 1024/1280 = 0.2.
  const std::string log = std::string(kHeader) +
                          "1,10,allocate,0xa000,256,hbm,weight,0x0\n"
                          "1,20,allocate,0xb000,256,hbm,weight,0x0\n"
                          "2,30,allocate,0xc000,256,hbm,grad,0x0\n"
                          "2,40,free,0xb000,256,hbm,weight,0x0\n"
                          "1,50,allocate,0xd000,512,hbm,grad,0x7f00\n"
                          "1,60,allocate,0xe000,100,host,master,0x0\n"
                          "1,70,free,0xa000,256,hbm,weight,0x0\n";
  const ReplayReport r = replay_text(log);
  EXPECT_EQ(r.events, 7u);
  EXPECT_EQ(r.threads, 2u);
  EXPECT_EQ(r.duration_ns, 60u);
  const TierReplay& h = r.tiers[0];
  EXPECT_EQ(h.allocations, 4u);
  EXPECT_EQ(h.frees, 2u);
  EXPECT_EQ(h.peak_live, 1024u);
  EXPECT_EQ(h.peak_extent, 1280u);
  EXPECT_DOUBLE_EQ(h.fragmentation, 0.2);
  EXPECT_EQ(h.live_at_end, 768u);
  EXPECT_EQ(h.blocks_at_end, 2u);
  EXPECT_EQ(h.largest_block, 512u);
  const TierReplay& host = r.tiers[1];
  EXPECT_EQ(host.peak_live, 100u);
  EXPECT_EQ(host.peak_extent, 256u);  // rounded to a 256 B granule
  EXPECT_EQ(r.peak_live_all, 1124u);
  EXPECT_NE(r.to_text().find("peak usage, all tiers"), std::string::npos);
  const auto j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j["tiers"]["hbm"]["peak_live"].get<std::uint64_t>(), 1024u);
}

TEST(Replay, HolesAreReusedAndCoalesced) {
  // Two adjacent frees merge into one hole that a larger block fits: no growth, no waste.
  const ReplayReport r = replay_text(
      "1,0,allocate,0x1,256,host,other,0x0\n"
      "1,0,allocate,0x2,256,host,other,0x0\n"
      "1,0,allocate,0x3,256,host,other,0x0\n"
      "1,0,free,0x1,256,host,other,0x0\n"
      "1,0,free,0x2,256,host,other,0x0\n"
      "1,0,allocate,0x4,512,host,other,0x0\n");
  EXPECT_EQ(r.tiers[1].peak_extent, 768u);
  EXPECT_EQ(r.tiers[1].peak_live, 768u);
  EXPECT_DOUBLE_EQ(r.tiers[1].fragmentation, 0.0);
}

void expect_error_at(const std::string& body, int line, const std::string& what) {
  try {
    (void)replay_text(std::string(kHeader) + body);
    FAIL() << "accepted: " << body;
  } catch (const ght::io_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("log.csv:" + std::to_string(line) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Replay, MalformedLinesNameFileAndLine) {
  const std::string ok = "1,0,allocate,0x10,64,hbm,weight,0x0\n";
  expect_error_at(ok + "1,0,allocate,0x20,64,hbm,weight\n", 3, "expected 8 comma-separated fields");
  expect_error_at(ok + "1,0,allocate,0x20,64,hbm,weight,0x0,extra\n", 3, "got more");
  expect_error_at("x,0,allocate,0x20,64,hbm,weight,0x0\n", 2, "bad thread 'x'");
  expect_error_at("1,-5,allocate,0x20,64,hbm,weight,0x0\n", 2, "bad time_ns");
  expect_error_at("1,0,alloc,0x20,64,hbm,weight,0x0\n", 2, "bad action 'alloc'");
  expect_error_at("1,0,allocate,20,64,hbm,weight,0x0\n", 2, "bad pointer '20'");
  expect_error_at("1,0,allocate,0xzz,64,hbm,weight,0x0\n", 2, "bad pointer");
  expect_error_at("1,0,allocate,0x20,0,hbm,weight,0x0\n", 2, "bad size '0'");
  expect_error_at("1,0,allocate,0x20,12k,hbm,weight,0x0\n", 2, "bad size");
  expect_error_at("1,0,allocate,0x20,64,gpu,weight,0x0\n", 2, "bad tier 'gpu'");
  expect_error_at("1,0,allocate,0x20,64,hbm,bias,0x0\n", 2, "bad class 'bias'");
  expect_error_at("1,0,allocate,0x20,64,hbm,weight,7\n", 2, "bad stream");
  expect_error_at(ok + "\n" + ok, 4, "already live (allocated at line 2)");
  expect_error_at(ok + "1,0,free,0x99,64,hbm,weight,0x0\n", 3, "which is not live");
  expect_error_at(ok + "1,0,free,0x10,65,hbm,weight,0x0\n", 3,
                  "with size 65, but it was allocated with 64 at line 2");
  expect_error_at(ok + "1,0,free,0x10,64,host,weight,0x0\n", 3, "on tier host");
}

TEST(Replay, FileErrors) {
  EXPECT_THROW((void)replay_log("/nonexistent/ght.csv"), ght::io_error);
  const auto path = (std::filesystem::path(::testing::TempDir()) / "ght_replay_bad.csv").string();
  {
    std::ofstream out(path);
    out << kHeader << "1,0,allocate,0x10,64,hbm,weight,0x0\r\n" << "garbage\n";
  }
  try {
    (void)replay_log(path);
    FAIL();
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: "), std::string::npos) << e.what();
  }
}

}  // namespace
