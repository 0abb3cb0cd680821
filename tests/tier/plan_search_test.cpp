// The plan's search (tier/plan_search.hpp) over synthetic candidates: pinning, the tolerance and
// the ledger, the choice among admitted plans, the refusal and its alternatives; and the ledger's
// own parsing (tier/accuracy_ledger.hpp).
#include "tier/plan_search.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "common/registry.hpp"
#include "tier/config.hpp"
#include "tier/cost_model.hpp"

namespace ght::tier {
namespace {

using ght::test::registry_with;

// A one-region plan whose predicted step and HBM bytes are given: make_plan of a region that
// needs `seconds` of critical-path link time, in a budget that holds it or not.
Plan synthetic_plan(double seconds, std::uint64_t hbm_bytes, std::uint64_t budget) {
  Region r;
  r.name = "state";
  r.cls = TensorClass::master;
  r.bytes = hbm_bytes;
  r.host_allowed = false;
  Access a;
  a.what = "compute";
  a.cpu_read_bytes = seconds * 1e9;  // at 1 GB/s device -> host: `seconds` on the critical path
  a.overlappable = false;
  r.access = {a};
  PlanOptions o;
  o.budgets.hbm = budget;
  o.budgets.host = budget;
  o.link = builtin_profile("pcie5");
  o.link.d2h_bps = 1e9;
  o.link.bidir_bps = 0;
  o.step_flops = 1;
  return make_plan({r}, o);
}

std::vector<Dimension> two_dims() {
  return {Dimension{"GHT_OPT_STATE", "m/v", {{"fp32", true}, {"bf16", false}, {"q8", false}}, std::nullopt},
          Dimension{"GHT_GRAD_ACCUM", "grad accum", {{"fp32", true}, {"bf16", false}}, std::nullopt}};
}

Verdict verdict(const std::string& option, const std::string& value, double delta, double band) {
  Verdict v;
  v.option = option;
  v.value = value;
  v.model = "small";
  v.params = 7.6e6;
  v.steps = 2000;
  v.lr = 2e-3;
  v.exact_seeds = 3;
  v.eval_loss_delta = delta;
  v.noise_band = band;
  v.within_noise = delta <= band;
  v.measured = "2026-12-05";
  v.source = "test";
  return v;
}

// Each combination's (seconds, fits): fp32 state does not fit; q8 is faster than bf16; bf16
// gradient accumulation saves a further second.
PlanCandidate table_of(std::map<std::string, std::pair<double, bool>> t) {
  return [t](const Settings& s) {
    std::string key;
    for (const auto& kv : s) key += kv.second + "/";
    const auto it = t.find(key);
    if (it == t.end() || !it->second.second) throw infeasible_plan("does not fit: " + key, TierKind::host, 2, 1);
    return synthetic_plan(it->second.first, 1, 1u << 20);
  };
}

const std::map<std::string, std::pair<double, bool>> kTable = {
    {"fp32/fp32/", {10.0, false}}, {"fp32/bf16/", {9.0, false}}, {"bf16/fp32/", {8.0, true}},
    {"bf16/bf16/", {7.0, true}},   {"q8/fp32/", {6.0, true}},    {"q8/bf16/", {5.0, true}}};

TEST(PlanSearch, EveryCombinationIsPlannedAndTheFastestAdmittedOneIsChosen) {
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", -0.001, 0.01), verdict("GHT_OPT_STATE", "bf16", 0.0, 0.01),
                       verdict("GHT_GRAD_ACCUM", "bf16", 0.002, 0.01)});
  const SearchResult r = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::noise, 0});
  ASSERT_EQ(r.candidates.size(), 6u);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(r.best().changes(r.dimensions), "GHT_OPT_STATE=q8 GHT_GRAD_ACCUM=bf16");
  EXPECT_NEAR(r.best().step_seconds(), 5.0, 0.01);
  EXPECT_EQ(r.best().inexact.size(), 2u);
  // Ranked: the four that fit by time, then the two that do not.
  EXPECT_TRUE(r.candidates[3].plan.has_value());
  EXPECT_FALSE(r.candidates[4].plan.has_value());
  EXPECT_NE(r.candidates[4].infeasible.find("does not fit"), std::string::npos);
}

TEST(PlanSearch, AChoiceWithoutAVerdictIsOutsideTheNoise) {
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", -0.001, 0.01)});  // nothing on bf16 accumulation
  const SearchResult r = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::noise, 0});
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(r.best().changes(r.dimensions), "GHT_OPT_STATE=q8");
  for (const Candidate& c : r.candidates) {
    if (c.settings[1].second == "bf16") {
      EXPECT_FALSE(c.admitted);
      EXPECT_NE(c.refused.find("no ledger verdict for"), std::string::npos) << c.refused;
      EXPECT_NE(c.refused.find("GHT_GRAD_ACCUM=bf16"), std::string::npos) << c.refused;
    }
  }
}

TEST(PlanSearch, AVerdictOutsideTheNoiseIsRefusedUnderNoiseAndTakenUnderACost) {
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", 0.03, 0.01), verdict("GHT_OPT_STATE", "bf16", 0.0, 0.01),
                       verdict("GHT_GRAD_ACCUM", "bf16", 0.0, 0.01)});
  const SearchResult noise = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::noise, 0});
  ASSERT_TRUE(noise.chosen.has_value());
  EXPECT_EQ(noise.best().changes(noise.dimensions), "GHT_OPT_STATE=bf16 GHT_GRAD_ACCUM=bf16");
  const SearchResult cost = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::cost, 0.05});
  EXPECT_EQ(cost.best().changes(cost.dimensions), "GHT_OPT_STATE=q8 GHT_GRAD_ACCUM=bf16");
  const SearchResult tight = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::cost, 0.02});
  EXPECT_EQ(tight.best().changes(tight.dimensions), "GHT_OPT_STATE=bf16 GHT_GRAD_ACCUM=bf16");
}

TEST(PlanSearch, AnInexactChoiceMustBeFasterOrNeededToFit) {
  // Everything fits; bf16 accumulation gains 0.5%, under kPreferExactWithin: the exact plan wins.
  const std::map<std::string, std::pair<double, bool>> t = {{"fp32/fp32/", {10.0, true}}, {"fp32/bf16/", {9.95, true}},
                                                            {"bf16/fp32/", {10.0, true}}, {"bf16/bf16/", {9.95, true}},
                                                            {"q8/fp32/", {10.0, true}},   {"q8/bf16/", {9.95, true}}};
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", 0, 0.01), verdict("GHT_OPT_STATE", "bf16", 0, 0.01),
                       verdict("GHT_GRAD_ACCUM", "bf16", 0, 0.01)});
  const SearchResult r = search_plans(two_dims(), table_of(t), ledger, {Tolerance::Kind::noise, 0});
  EXPECT_EQ(r.best().changes(r.dimensions), "(defaults)");
  EXPECT_TRUE(r.best().inexact.empty());
}

// A prefer_first_within dimension (the micro-batch, 3% here): exact, yet another value is taken
// only where it is faster by more than its share.
TEST(PlanSearch, APreferFirstDimensionLeavesItsFirstValueOnlyForMoreThanItsShare) {
  const std::vector<Dimension> dims = {
      Dimension{"GHT_OPT_STATE", "m/v", {{"fp32", true}, {"q8", false}}, std::nullopt},
      Dimension{"model.micro_batch", "micro-batch", {{"1", true}, {"2", true}}, std::nullopt, 0.03}};
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", 0, 0.01)});
  auto search = [&](double two) {
    return search_plans(dims, table_of({{"fp32/1/", {10.0, true}}, {"fp32/2/", {two, true}},
                                        {"q8/1/", {10.0, true}}, {"q8/2/", {two, true}}}),
                        ledger, {Tolerance::Kind::noise, 0});
  };
  const SearchResult close = search(9.8);  // 2% faster: the configured micro-batch stays
  EXPECT_EQ(close.best().changes(close.dimensions), "(defaults)");
  const SearchResult faster = search(9.5);  // 5% faster: taken, and still exact
  EXPECT_EQ(faster.best().changes(faster.dimensions), "-o model.micro_batch=2");
  EXPECT_TRUE(faster.best().inexact.empty());
}

TEST(PlanSearch, ExactRefusesWhenOnlyInexactPlansFitAndListsThemWithTheirSettings) {
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", -0.001, 0.01)});
  const SearchResult r = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::exact, 0});
  EXPECT_FALSE(r.chosen.has_value());
  EXPECT_THROW((void)r.best(), ght::logic_error);
  const std::string m = refusal_message(r, 1e6);
  EXPECT_NE(m.find("no plan within GHT_PLAN_TOLERANCE=exact fits"), std::string::npos) << m;
  EXPECT_NE(m.find("set GHT_OPT_STATE=q8 GHT_GRAD_ACCUM=bf16"), std::string::npos) << m;  // the fastest first
  EXPECT_NE(m.find("set GHT_OPT_STATE=q8 ("), std::string::npos) << m;
  const std::string table = format_search(r, 1e6, 989e12);
  EXPECT_NE(table.find("no plan within the tolerance fits"), std::string::npos) << table;
}

TEST(PlanSearch, APinnedDimensionIsSearchedAtTheUsersValueOnly) {
  const auto reg = registry_with({"GHT_OPT_STATE=fp32"});
  const Dimension pinned = make_dimension(reg, "GHT_OPT_STATE", "m/v", {{"fp32", true}, {"bf16", false}, {"q8", false}});
  ASSERT_EQ(pinned.values.size(), 1u);
  EXPECT_EQ(pinned.values[0].value, "fp32");
  EXPECT_EQ(pinned.pinned, "fp32");
  const Dimension open = make_dimension(reg, "GHT_OPT_STATE", "m/v", {{"fp32", true}, {"q8", false}}, false);
  EXPECT_EQ(open.values.size(), 2u);
  const auto unset = registry_with({});
  EXPECT_EQ(make_dimension(unset, "GHT_OPT_STATE", "m/v", {{"fp32", true}, {"q8", false}}).values.size(), 2u);
  // A pinned inexact value keeps its exactness; the search prices it.
  const auto q8 = registry_with({"GHT_OPT_STATE=Q8"});
  const Dimension d = make_dimension(q8, "GHT_OPT_STATE", "m/v", {{"fp32", true}, {"q8", false}});
  ASSERT_EQ(d.values.size(), 1u);
  EXPECT_EQ(d.values[0].value, "q8");
  EXPECT_FALSE(d.values[0].exact);
  // Pinned: with nothing else fitting, the search refuses (nothing within the pins fits).
  std::vector<Dimension> dims = two_dims();
  dims[0] = pinned;
  const SearchResult r = search_plans(dims, table_of(kTable), Ledger(), {Tolerance::Kind::noise, 0});
  EXPECT_FALSE(r.chosen.has_value());
  EXPECT_NE(refusal_message(r, 1e6).find("nothing fits at all"), std::string::npos);
}

TEST(PlanSearch, ThePlanSetsAValueOnlyWhereTheUserDidNot) {
  auto reg = registry_with({"GHT_GRAD_ACCUM=fp32"});
  EXPECT_FALSE(reg.set_planned("GHT_GRAD_ACCUM", "bf16"));
  EXPECT_EQ(reg.get_string(config::Key::GHT_GRAD_ACCUM), "fp32");
  EXPECT_TRUE(reg.set_planned("GHT_OPT_STATE", "q8"));
  EXPECT_EQ(reg.get_string(config::Key::GHT_OPT_STATE), "q8");
  EXPECT_EQ(reg.source(config::Key::GHT_OPT_STATE), config::Source::Plan);
  EXPECT_EQ(config::to_string(config::Source::Plan), "plan");
  EXPECT_THROW((void)reg.set_planned("GHT_OPT_STATE", "q4"), ght::config_error);
}

TEST(PlanSearch, ToleranceParsesItsThreeFormsAndNamesABadValue) {
  EXPECT_EQ(parse_tolerance("exact").kind, Tolerance::Kind::exact);
  EXPECT_EQ(parse_tolerance("Noise").kind, Tolerance::Kind::noise);
  const Tolerance t = parse_tolerance("0.01");
  EXPECT_EQ(t.kind, Tolerance::Kind::cost);
  EXPECT_DOUBLE_EQ(t.cost, 0.01);
  for (const char* bad : {"loose", "-0.1", "2", "0.01x", "nan"}) {
    try {
      (void)parse_tolerance(bad);
      ADD_FAILURE() << bad;
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("GHT_PLAN_TOLERANCE=") + bad), std::string::npos) << e.what();
    }
  }
}

TEST(PlanSearch, JsonListsEveryCandidateWithItsPrediction) {
  const Ledger ledger({verdict("GHT_OPT_STATE", "q8", -0.001, 0.01)});
  const SearchResult r = search_plans(two_dims(), table_of(kTable), ledger, {Tolerance::Kind::noise, 0});
  const std::string j = search_to_json(r, 1e6, 989e12);
  EXPECT_NE(j.find("\"tolerance\": \"noise\""), std::string::npos);
  EXPECT_NE(j.find("\"step_s\""), std::string::npos);
  EXPECT_NE(j.find("\"no ledger verdict"), std::string::npos);
}

TEST(AccuracyLedger, TheBuiltInLedgerParsesAndEachVerdictAgreesWithItsNumbers) {
  const Ledger& l = Ledger::builtin();
  ASSERT_FALSE(l.verdicts().empty());
  for (const Verdict& v : l.verdicts()) {
    EXPECT_EQ(v.within_noise, v.eval_loss_delta <= v.noise_band) << v.describe();
    EXPECT_GT(v.steps, 0) << v.describe();
    EXPECT_NE(config::find_option(v.option), nullptr) << v.option;
  }
}

TEST(AccuracyLedger, ABadFileIsRefusedNamingTheField) {
  const std::string ok = R"({"format": 1, "verdicts": [{"option": "GHT_OPT_STATE", "value": "q8", "model": "m",
    "params": 1e6, "steps": 10, "lr": 1e-3, "exact_seeds": 3, "eval_loss_delta": 0.5, "noise_band": 0.01,
    "within_noise": true, "measured": "2026-12-05", "source": "x"}]})";
  try {
    (void)Ledger::parse(ok, "f.json");
    ADD_FAILURE() << "a verdict that contradicts its numbers was accepted";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("f.json: verdicts[0]: within_noise is true"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)Ledger::parse("{", "f.json"), io_error);
  EXPECT_THROW((void)Ledger::parse(R"({"format": 1, "verdicts": [{"option": "GHT_NOPE"}]})", "f.json"), io_error);
  const Ledger two({verdict("GHT_OPT_STATE", "q8", 0.0, 0.01), [] {
                      Verdict big = verdict("GHT_OPT_STATE", "q8", 0.002, 0.01);
                      big.params = 1.5e9;
                      return big;
                    }()});
  ASSERT_NE(two.find("GHT_OPT_STATE", "q8"), nullptr);
  EXPECT_DOUBLE_EQ(two.find("GHT_OPT_STATE", "q8")->params, 1.5e9);  // the largest model speaks
  EXPECT_EQ(two.find("GHT_OPT_STATE", "bf16"), nullptr);
}

}  // namespace
}  // namespace ght::tier
