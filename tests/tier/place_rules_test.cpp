// GHT_PLACE: the grammar, its error messages (naming the rule, its number and its offset), glob
// matching and the selection semantics (class vs name globs, experts[hot:N], later rules win).
#include <gtest/gtest.h>

#include "tier/place_rules.hpp"

namespace ght::tier {
namespace {

std::string error_of(std::string_view text) {
  try {
    (void)parse_place_rules(text);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(PlaceRules, ParsesTheIssueExample) {
  const auto rules = parse_place_rules("master=host,adam_*=host,grad=hbm,experts[hot:8].weight=hbm");
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[0].kind, PlaceRule::Kind::class_glob);
  EXPECT_EQ(rules[0].glob, "master");
  EXPECT_EQ(rules[0].target, RuleTarget::host);
  EXPECT_EQ(rules[1].glob, "adam_*");
  EXPECT_EQ(rules[1].offset, 12u);
  EXPECT_EQ(rules[2].target, RuleTarget::hbm);
  EXPECT_EQ(rules[3].kind, PlaceRule::Kind::experts);
  EXPECT_EQ(rules[3].experts, PlaceRule::ExpertSet::hot);
  EXPECT_EQ(rules[3].count, 8);
  EXPECT_EQ(rules[3].glob, "weight");
  EXPECT_EQ(rules[3].number, 4);
  EXPECT_EQ(rules[3].describe(), "GHT_PLACE rule 4 'experts[hot:8].weight=hbm'");
}

TEST(PlaceRules, SelectorKindsAndWhitespace) {
  const auto rules = parse_place_rules(
      "  layer3.* = host , name:weight=hbm, class:ADAM_M=Host,experts[cold:2].*=recompute,"
      "experts[*].grad=stream, *=keep");
  ASSERT_EQ(rules.size(), 6u);
  EXPECT_EQ(rules[0].kind, PlaceRule::Kind::name_glob);  // matches no class name
  EXPECT_EQ(rules[0].glob, "layer3.*");
  EXPECT_EQ(rules[0].text, "layer3.* = host");
  EXPECT_EQ(rules[0].offset, 2u);
  EXPECT_EQ(rules[1].kind, PlaceRule::Kind::name_glob);  // forced by name:
  EXPECT_EQ(rules[1].glob, "weight");
  EXPECT_EQ(rules[2].kind, PlaceRule::Kind::class_glob);
  EXPECT_EQ(rules[2].target, RuleTarget::host);
  EXPECT_EQ(rules[3].experts, PlaceRule::ExpertSet::cold);
  EXPECT_EQ(rules[3].target, RuleTarget::recompute);
  EXPECT_EQ(rules[4].experts, PlaceRule::ExpertSet::all);
  EXPECT_EQ(rules[4].target, RuleTarget::stream);
  EXPECT_EQ(rules[5].kind, PlaceRule::Kind::class_glob);
  EXPECT_TRUE(parse_place_rules("").empty());
  EXPECT_TRUE(parse_place_rules("   ").empty());
}

TEST(PlaceRules, MalformedRulesAreNamed) {
  EXPECT_EQ(error_of("master=host,adam_*=hostt"),
            "GHT_PLACE rule 2 'adam_*=hostt' (at character 13): unknown target 'hostt'; expected "
            "hbm, host, keep, recompute, stream or accumulate");
  EXPECT_EQ(error_of("master"),
            "GHT_PLACE rule 1 'master' (at character 1): missing '='; expected selector=target, e.g. master=host");
  EXPECT_NE(error_of("master=host,").find("GHT_PLACE rule 2 '' (at character 13): empty rule"), std::string::npos);
  EXPECT_NE(error_of("a=b=c").find("more than one '='"), std::string::npos);
  EXPECT_NE(error_of("=host").find("empty selector"), std::string::npos);
  EXPECT_NE(error_of("grad=hbm,experts[hot:x].weight=hbm").find("rule 2 'experts[hot:x].weight=hbm'"),
            std::string::npos);
  EXPECT_NE(error_of("experts[hot:0].weight=hbm").find("needs a whole number of experts >= 1"), std::string::npos);
  EXPECT_NE(error_of("experts[hot:8.weight=hbm").find("missing ']'"), std::string::npos);
  EXPECT_NE(error_of("experts[warm:8].weight=hbm").find("unknown expert set 'warm:8'"), std::string::npos);
  EXPECT_NE(error_of("experts[hot:8]=hbm").find("must be followed by '.<class>'"), std::string::npos);
  EXPECT_NE(error_of("experts[hot:8].wieght=hbm").find("'wieght' matches no tensor class"), std::string::npos);
  EXPECT_NE(error_of("class:mastr=host").find("'mastr' matches no tensor class"), std::string::npos);
  EXPECT_NE(error_of("layer[3]=host").find("brackets are only valid in experts[...]"), std::string::npos);
  EXPECT_NE(error_of("lay er=host").find("contains blanks"), std::string::npos);
}

TEST(PlaceRules, GlobMatching) {
  EXPECT_TRUE(glob_match("adam_*", "adam_m"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b*c", "axxbyyc"));
  EXPECT_FALSE(glob_match("a*b*c", "axxbyy"));
  EXPECT_TRUE(glob_match("l?.e*", "l3.e17"));
  EXPECT_FALSE(glob_match("l?.e*", "l13.e17"));
  EXPECT_FALSE(glob_match("ADAM_*", "adam_m"));
  EXPECT_TRUE(glob_match("ADAM_*", "adam_m", true));
  EXPECT_TRUE(glob_match("*.*.weight", "layer1.expert2.weight"));
  EXPECT_FALSE(glob_match("", "x"));
}

Region region(const std::string& name, TensorClass cls, int layer = -1, int expert = -1, double f = 0) {
  Region r;
  r.name = name;
  r.cls = cls;
  r.bytes = 100;
  r.layer = layer;
  r.expert = expert;
  r.routing_frequency = f;
  return r;
}

TEST(PlaceRules, MatchingSemantics) {
  std::vector<Region> rs;
  // Layer 0: expert 2 hottest, then 0, then 1 and 3 tied (lower id first).
  const double f0[] = {0.3, 0.1, 0.5, 0.1};
  const double f1[] = {0.2, 0.2, 0.2, 0.4};
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      const double f = l == 0 ? f0[e] : f1[e];
      const std::string base = "layer" + std::to_string(l) + ".expert" + std::to_string(e);
      rs.push_back(region(base + ".weight", TensorClass::weight, l, e, f));
      rs.push_back(region(base + ".master", TensorClass::master, l, e, f));
    }
  }
  rs.push_back(region("embed.weight", TensorClass::weight));
  rs.push_back(region("layer0.activation", TensorClass::activation, 0));

  auto m = match_place_rules(parse_place_rules("experts[hot:2].weight=hbm"), rs);
  auto idx = [&](const std::string& n) {
    for (std::size_t i = 0; i < rs.size(); ++i) {
      if (rs[i].name == n) return m[i];
    }
    return -2;
  };
  EXPECT_EQ(idx("layer0.expert2.weight"), 0);
  EXPECT_EQ(idx("layer0.expert0.weight"), 0);
  EXPECT_EQ(idx("layer0.expert1.weight"), -1);
  EXPECT_EQ(idx("layer0.expert2.master"), -1);  // class weight only
  EXPECT_EQ(idx("layer1.expert3.weight"), 0);
  EXPECT_EQ(idx("layer1.expert0.weight"), 0);   // tie at 0.2: lower ids first
  EXPECT_EQ(idx("layer1.expert1.weight"), -1);
  EXPECT_EQ(idx("embed.weight"), -1);           // not an expert

  m = match_place_rules(parse_place_rules("experts[cold:1].*=host"), rs);
  EXPECT_EQ(idx("layer0.expert1.weight"), 0);
  EXPECT_EQ(idx("layer0.expert1.master"), 0);
  EXPECT_EQ(idx("layer0.expert3.weight"), -1);
  EXPECT_EQ(idx("layer1.expert0.master"), 0);

  // Later rules win; class globs and name globs.
  m = match_place_rules(parse_place_rules("weight=host,*.expert1.*=hbm,layer1.*=host"), rs);
  EXPECT_EQ(idx("embed.weight"), 0);
  EXPECT_EQ(idx("layer0.expert1.weight"), 1);
  EXPECT_EQ(idx("layer0.expert1.master"), 1);
  EXPECT_EQ(idx("layer1.expert1.weight"), 2);
  EXPECT_EQ(idx("layer0.activation"), -1);

  // A rule matching nothing is an error naming it.
  try {
    (void)match_place_rules(parse_place_rules("weight=host,grad=hbm"), rs);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("GHT_PLACE rule 2 'grad=hbm' (at character 13) matches no region"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlaceRules, TargetsMustFitTheRegion) {
  Region act = region("act", TensorClass::activation);
  act.recompute_bytes = 10;
  act.host_allowed = false;
  Region grad = region("g", TensorClass::grad);
  Region w = region("w", TensorClass::weight);
  auto allowed = [](const char* text, const Region& r) {
    return placements_allowed_by(parse_place_rules(text)[0], r);
  };
  EXPECT_EQ(allowed("activation=hbm", act),
            (std::vector<Placement>{{TierKind::hbm, Mode::recompute}, {TierKind::hbm, Mode::keep}}));
  EXPECT_EQ(allowed("activation=keep", act), (std::vector<Placement>{{TierKind::hbm, Mode::keep}}));
  EXPECT_EQ(allowed("activation=recompute", act), (std::vector<Placement>{{TierKind::hbm, Mode::recompute}}));
  EXPECT_EQ(allowed("grad=stream", grad), (std::vector<Placement>{{TierKind::host, Mode::stream}}));
  EXPECT_EQ(allowed("grad=accumulate", grad), (std::vector<Placement>{{TierKind::hbm, Mode::accumulate}}));
  EXPECT_EQ(allowed("weight=host", w), (std::vector<Placement>{{TierKind::host, Mode::none}}));
  EXPECT_THROW((void)allowed("activation=host", act), config_error);
  EXPECT_THROW((void)allowed("weight=stream", w), config_error);
  EXPECT_THROW((void)allowed("weight=recompute", w), config_error);
  EXPECT_THROW((void)allowed("weight=accumulate", w), config_error);
  try {
    (void)allowed("activation=host", act);
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("region 'act' (class activation) does not allow the host tier"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ght::tier
