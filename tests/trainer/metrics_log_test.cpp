// Training logs: console line fields, JSONL records (one per line, appended), progress and ETA.
#include "trainer/metrics_log.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/expect.hpp"

using namespace ght::trainer;
namespace fs = std::filesystem;

namespace {

StepRecord rec(std::int64_t step, double elapsed) {
  StepRecord r;
  r.step = step;
  r.loss = 2.5 - 0.01 * static_cast<double>(step);
  r.aux_loss = 0.0123;
  r.grad_norm = 0.75;
  r.lr = 3e-4;
  r.tokens_per_s = 41234;
  r.elapsed_s = elapsed;
  return r;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

struct TempFile {
  std::string path;
  TempFile() {
    std::string t = (fs::temp_directory_path() / "ght_metrics_XXXXXX").string();
    const int fd = ::mkstemp(t.data());
    ::close(fd);
    fs::remove(t);
    path = t;
  }
  ~TempFile() { fs::remove(path); }
};

}  // namespace

TEST(MetricsFormat, Durations) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(62.4), "1:02");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--:--");
  EXPECT_EQ(format_count(41234), "41.2k");
  EXPECT_EQ(format_count(1234567), "1.23M");
  EXPECT_EQ(format_count(812), "812");
  EXPECT_EQ(render_bar(0.5, 10), "[#####.....]  50.0%");
  EXPECT_EQ(render_bar(1.2, 4), "[####] 100.0%");
}

TEST(MetricsFormat, StepLineHasEveryFieldAndOnlySetOptionals) {
  StepRecord r = rec(120, 62);
  std::string s = format_step_line(r, 2000, 980);
  EXPECT_CONTAINS(s, "step  120/2000");
  EXPECT_CONTAINS(s, "loss 1.3000");
  EXPECT_CONTAINS(s, "aux 0.0123");
  EXPECT_CONTAINS(s, "gnorm 0.750");
  EXPECT_CONTAINS(s, "lr 3.00e-04");
  EXPECT_CONTAINS(s, "41.2k tok/s");
  EXPECT_CONTAINS(s, "1:02 elapsed");
  EXPECT_CONTAINS(s, "ETA 16:20");
  EXPECT_EQ(s.find("mfu"), std::string::npos);
  EXPECT_EQ(s.find("h2d"), std::string::npos);
  EXPECT_EQ(s.find("skipped"), std::string::npos);
  r.mfu = 0.382;
  r.link_gb_h2d = 12.4;
  r.link_gb_d2h = 3.1;
  r.skipped_steps = 2;
  s = format_step_line(r, 0, -1);
  EXPECT_CONTAINS(s, "mfu 38.2%");
  EXPECT_CONTAINS(s, "h2d 12.40 GB");
  EXPECT_CONTAINS(s, "d2h 3.10 GB");
  EXPECT_CONTAINS(s, "skipped 2");
  EXPECT_EQ(s.find("ETA"), std::string::npos);

  const auto j = step_json(r);
  EXPECT_EQ(j["type"], "step");
  EXPECT_EQ(j["step"], 120);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.382);
  EXPECT_DOUBLE_EQ(j["link_gb_h2d"].get<double>(), 12.4);
  EXPECT_EQ(j["skipped_steps"], 2);
  EXPECT_FALSE(step_json(rec(1, 1)).contains("mfu"));
}

TEST(MetricsLogger, JsonlOneRecordPerLineAppendedAcrossRuns) {
  TempFile f;
  std::ostringstream out;
  {
    MetricsLogger log({.jsonl_path = f.path, .total_steps = 4, .console = &out, .progress = ProgressMode::off});
    log.log_step(rec(1, 1.0));
    StepRecord bad = rec(2, 2.0);
    bad.loss = std::nan("");
    log.log_step(bad);
    log.log_eval(2, 2.25, 2.5);
  }
  {  // a resumed run appends
    MetricsLogger log({.jsonl_path = f.path, .total_steps = 4, .console = &out, .progress = ProgressMode::off});
    log.log_step(rec(3, 3.0));
    log.log_event({{"type", "checkpoint"}, {"step", 3}});
  }
  const auto lines = lines_of(f.path);
  ASSERT_EQ(lines.size(), 5u);
  const auto j0 = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j0["step"], 1);
  EXPECT_DOUBLE_EQ(j0["loss"].get<double>(), 2.49);
  EXPECT_TRUE(nlohmann::json::parse(lines[1])["loss"].is_null()) << "NaN is written as null";
  EXPECT_EQ(nlohmann::json::parse(lines[2])["type"], "eval");
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(lines[2])["eval_loss"].get<double>(), 2.25);
  EXPECT_EQ(nlohmann::json::parse(lines[3])["step"], 3);
  EXPECT_EQ(nlohmann::json::parse(lines[4])["type"], "checkpoint");
  // Console: three step lines and the eval line.
  const std::string s = out.str();
  EXPECT_CONTAINS(s, "step 1/4");
  EXPECT_CONTAINS(s, "eval step 2 | eval loss 2.2500");
  EXPECT_EQ(s.find("progress"), std::string::npos);
}

TEST(MetricsLogger, EtaFromThePaceSinceTheFirstLoggedStep) {
  std::ostringstream out;
  MetricsLogger log({.jsonl_path = "", .total_steps = 110, .console = &out, .progress = ProgressMode::off});
  log.log_step(rec(10, 100.0));  // a resumed run starts at step 10, 100 s after process start
  EXPECT_LT(log.eta_s(rec(10, 100.0)), 0);
  log.log_step(rec(11, 102.0));
  EXPECT_DOUBLE_EQ(log.eta_s(rec(20, 120.0)), 2.0 * 90);
}

TEST(MetricsLogger, LinesModePrintsProgressEveryNSteps) {
  std::ostringstream out;
  MetricsLogger log({.jsonl_path = "", .total_steps = 10, .console = &out, .console_every = 5, .progress = ProgressMode::lines,
                     .progress_every = 5});
  for (int s = 1; s <= 10; ++s) log.log_step(rec(s, s));
  const std::string o = out.str();
  EXPECT_CONTAINS(o, "step  1/10");   // the first step always prints
  EXPECT_EQ(o.find("step  2/10"), std::string::npos);
  EXPECT_CONTAINS(o, "step  5/10");
  EXPECT_CONTAINS(o, "step 10/10");
  EXPECT_CONTAINS(o, "progress [###############...............]  50.0% 5/10");
  EXPECT_CONTAINS(o, "progress [##############################] 100.0% 10/10");
  EXPECT_EQ(o.find('\r'), std::string::npos);
}

TEST(MetricsLogger, BarModeRedrawsInPlaceAndFinishClears) {
  std::ostringstream out;
  MetricsLogger log({.jsonl_path = "", .total_steps = 4, .console = &out, .progress = ProgressMode::bar});
  log.log_step(rec(1, 1));
  log.print("checkpoint saved");
  log.log_step(rec(2, 2));
  log.finish();
  const std::string o = out.str();
  EXPECT_CONTAINS(o, "\r\033[Kstep 1/4");
  EXPECT_CONTAINS(o, "[#######.......................]  25.0% 1/4");
  EXPECT_CONTAINS(o, "\r\033[Kcheckpoint saved\n");
  EXPECT_EQ(o.substr(o.size() - 4), "\r\033[K") << "the bar is erased at the end";
}

TEST(MetricsLogger, QuietWritesNothingToTheConsole) {
  std::ostringstream out;
  MetricsLogger log({.jsonl_path = "", .total_steps = 4, .console = &out, .quiet = true});
  log.log_step(rec(1, 1));
  log.print("x");
  EXPECT_TRUE(out.str().empty());
}
