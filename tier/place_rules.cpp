#include "tier/place_rules.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <utility>

namespace ght::tier {

namespace {

constexpr std::array<std::string_view, 6> kTargetNames = {"hbm",       "host",   "keep",
                                                          "recompute", "stream", "accumulate"};

char lower_ascii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Trim, reporting how many characters were dropped on the left.
std::string_view trim(std::string_view s, std::size_t* left = nullptr) {
  std::size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  if (left != nullptr) *left = b;
  return s.substr(b, e - b);
}

std::string class_list() {
  std::string s;
  for (int i = 0; i < kNumTensorClasses; ++i) {
    s += (i ? ", " : "") + std::string(to_string(static_cast<TensorClass>(i)));
  }
  return s;
}

bool glob_matches_any_class(std::string_view glob) {
  for (int i = 0; i < kNumTensorClasses; ++i) {
    if (glob_match(glob, to_string(static_cast<TensorClass>(i)), true)) return true;
  }
  return false;
}

[[noreturn]] void rule_error(int number, std::string_view text, std::size_t offset,
                             const std::string& why) {
  throw config_error("GHT_PLACE rule " + std::to_string(number) + " '" + std::string(text) +
                     "' (at character " + std::to_string(offset + 1) + "): " + why);
}

bool valid_glob(std::string_view g) {
  if (g.empty()) return false;
  return std::none_of(g.begin(), g.end(), [](char c) {
    return is_space(c) || c == '=' || c == ',' || c == '[' || c == ']';
  });
}

PlaceRule parse_one(std::string_view raw, int number, std::size_t offset) {
  std::size_t left = 0;
  const std::string_view text = trim(raw, &left);
  offset += left;
  PlaceRule r;
  r.text = std::string(text);
  r.number = number;
  r.offset = offset;
  if (text.empty()) rule_error(number, text, offset, "empty rule; expected selector=target");
  const auto eq = text.find('=');
  if (eq == std::string_view::npos) {
    rule_error(number, text, offset, "missing '='; expected selector=target, e.g. master=host");
  }
  if (text.find('=', eq + 1) != std::string_view::npos) {
    rule_error(number, text, offset, "more than one '='; separate rules with ','");
  }
  const std::string_view sel = trim(text.substr(0, eq));
  const std::string_view tgt = trim(text.substr(eq + 1));

  bool found = false;
  for (std::size_t i = 0; i < kTargetNames.size(); ++i) {
    std::string t(tgt);
    std::transform(t.begin(), t.end(), t.begin(), lower_ascii);
    if (t == kTargetNames[i]) {
      r.target = static_cast<RuleTarget>(i);
      found = true;
    }
  }
  if (!found) {
    rule_error(number, text, offset,
               "unknown target '" + std::string(tgt) +
                   "'; expected hbm, host, keep, recompute, stream or accumulate");
  }
  if (sel.empty()) rule_error(number, text, offset, "empty selector before '='");

  auto starts_with = [&](std::string_view p) {
    if (sel.size() < p.size()) return false;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (lower_ascii(sel[i]) != p[i]) return false;
    }
    return true;
  };
  if (starts_with("experts[")) {
    const auto close = sel.find(']');
    if (close == std::string_view::npos) {
      rule_error(number, text, offset, "missing ']' in experts[...]");
    }
    const std::string_view set = trim(sel.substr(8, close - 8));
    const std::string_view rest = sel.substr(close + 1);
    if (set == "*") {
      r.experts = PlaceRule::ExpertSet::all;
    } else {
      const auto colon = set.find(':');
      const std::string_view which = colon == std::string_view::npos ? set : set.substr(0, colon);
      if (which == "hot") {
        r.experts = PlaceRule::ExpertSet::hot;
      } else if (which == "cold") {
        r.experts = PlaceRule::ExpertSet::cold;
      } else {
        rule_error(number, text, offset,
                   "unknown expert set '" + std::string(set) +
                       "'; expected experts[hot:N], experts[cold:N] or experts[*]");
      }
      const std::string_view n = colon == std::string_view::npos ? std::string_view{}
                                                                 : trim(set.substr(colon + 1));
      int count = 0;
      const auto res = std::from_chars(n.data(), n.data() + n.size(), count);
      if (n.empty() || res.ec != std::errc{} || res.ptr != n.data() + n.size() || count < 1) {
        rule_error(number, text, offset,
                   "'" + std::string(set) + "' needs a whole number of experts >= 1, e.g. hot:8");
      }
      r.count = count;
    }
    if (rest.size() < 2 || rest[0] != '.') {
      rule_error(number, text, offset,
                 "experts[...] must be followed by '.<class>', e.g. experts[hot:8].weight");
    }
    r.kind = PlaceRule::Kind::experts;
    r.glob = std::string(rest.substr(1));
    if (!valid_glob(r.glob) || !glob_matches_any_class(r.glob)) {
      rule_error(number, text, offset,
                 "'" + r.glob + "' matches no tensor class; classes are " + class_list());
    }
    return r;
  }
  if (sel.find('[') != std::string_view::npos || sel.find(']') != std::string_view::npos) {
    rule_error(number, text, offset, "brackets are only valid in experts[...]");
  }
  if (starts_with("class:")) {
    r.kind = PlaceRule::Kind::class_glob;
    r.glob = std::string(trim(sel.substr(6)));
    if (!valid_glob(r.glob) || !glob_matches_any_class(r.glob)) {
      rule_error(number, text, offset,
                 "'" + r.glob + "' matches no tensor class; classes are " + class_list());
    }
    return r;
  }
  if (starts_with("name:")) {
    r.kind = PlaceRule::Kind::name_glob;
    r.glob = std::string(trim(sel.substr(5)));
  } else {
    r.glob = std::string(sel);
    r.kind = glob_matches_any_class(r.glob) ? PlaceRule::Kind::class_glob
                                            : PlaceRule::Kind::name_glob;
  }
  if (!valid_glob(r.glob)) {
    rule_error(number, text, offset, "selector '" + r.glob + "' is empty or contains blanks");
  }
  return r;
}

}  // namespace

std::string_view to_string(RuleTarget t) noexcept { return kTargetNames[static_cast<int>(t)]; }

std::string PlaceRule::describe() const {
  return "GHT_PLACE rule " + std::to_string(number) + " '" + text + "'";
}

bool glob_match(std::string_view p, std::string_view s, bool ignore_case) noexcept {
  auto eq = [&](char a, char b) {
    return ignore_case ? lower_ascii(a) == lower_ascii(b) : a == b;
  };
  // Iterative matcher with one backtrack point: linear in practice, no recursion.
  std::size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || (p[pi] != '*' && eq(p[pi], s[si])))) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<PlaceRule> parse_place_rules(std::string_view text) {
  std::vector<PlaceRule> rules;
  if (trim(text).empty()) return rules;
  std::size_t start = 0;
  int number = 1;
  while (true) {
    const auto comma = text.find(',', start);
    const std::size_t end = comma == std::string_view::npos ? text.size() : comma;
    rules.push_back(parse_one(text.substr(start, end - start), number++, start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return rules;
}

std::vector<int> match_place_rules(const std::vector<PlaceRule>& rules,
                                   const std::vector<Region>& regions) {
  std::vector<int> match(regions.size(), -1);
  // Expert ranking per layer, only when a rule needs it: (layer) -> experts by frequency.
  std::map<int, std::vector<std::pair<double, int>>> by_layer;
  const bool need_rank = std::any_of(rules.begin(), rules.end(), [](const PlaceRule& r) {
    return r.kind == PlaceRule::Kind::experts && r.experts != PlaceRule::ExpertSet::all;
  });
  if (need_rank) {
    std::map<std::pair<int, int>, double> freq;
    for (const Region& g : regions) {
      if (g.expert < 0) continue;
      auto [it, fresh] = freq.try_emplace({g.layer, g.expert}, g.routing_frequency);
      if (!fresh) it->second = std::max(it->second, g.routing_frequency);
    }
    for (const auto& [key, f] : freq) by_layer[key.first].push_back({f, key.second});
  }
  auto rank_set = [&](const PlaceRule& rule) {
    std::map<int, std::vector<int>> chosen;  // layer -> expert ids in the set
    for (auto [layer, list] : by_layer) {
      std::sort(list.begin(), list.end(), [&](const auto& a, const auto& b) {
        if (a.first != b.first) {
          return rule.experts == PlaceRule::ExpertSet::hot ? a.first > b.first : a.first < b.first;
        }
        return a.second < b.second;
      });
      const std::size_t n = std::min<std::size_t>(list.size(), static_cast<std::size_t>(rule.count));
      for (std::size_t i = 0; i < n; ++i) chosen[layer].push_back(list[i].second);
    }
    return chosen;
  };
  for (std::size_t ri = 0; ri < rules.size(); ++ri) {
    const PlaceRule& rule = rules[ri];
    std::map<int, std::vector<int>> set;
    if (rule.kind == PlaceRule::Kind::experts && rule.experts != PlaceRule::ExpertSet::all) {
      set = rank_set(rule);
    }
    bool any = false;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const Region& g = regions[i];
      bool hit = false;
      switch (rule.kind) {
        case PlaceRule::Kind::class_glob:
          hit = glob_match(rule.glob, to_string(g.cls), true);
          break;
        case PlaceRule::Kind::name_glob:
          hit = glob_match(rule.glob, g.name);
          break;
        case PlaceRule::Kind::experts:
          if (g.expert >= 0 && glob_match(rule.glob, to_string(g.cls), true)) {
            if (rule.experts == PlaceRule::ExpertSet::all) {
              hit = true;
            } else {
              const auto it = set.find(g.layer);
              hit = it != set.end() &&
                    std::find(it->second.begin(), it->second.end(), g.expert) != it->second.end();
            }
          }
          break;
      }
      if (hit) {
        match[i] = static_cast<int>(ri);
        any = true;
      }
    }
    if (!any) {
      std::string example = regions.empty() ? std::string("(no regions)") : "'" + regions.front().name + "'";
      throw config_error(rule.describe() + " (at character " + std::to_string(rule.offset + 1) +
                         ") matches no region; classes are " + class_list() +
                         ", region names look like " + example);
    }
  }
  return match;
}

std::vector<Placement> placements_allowed_by(const PlaceRule& rule, const Region& r) {
  const std::vector<Placement> all = placements(r);
  auto fail = [&](const std::string& why) -> std::vector<Placement> {
    throw config_error(rule.describe() + " (at character " + std::to_string(rule.offset + 1) +
                       "): region '" + r.name + "' (class " + std::string(to_string(r.cls)) +
                       ") " + why);
  };
  const bool is_grad = r.cls == TensorClass::grad;
  const bool can_recompute = r.recompute_bytes.has_value();
  std::vector<Placement> out;
  auto keep_if = [&](auto pred) {
    for (const Placement& p : all) {
      if (pred(p)) out.push_back(p);
    }
  };
  switch (rule.target) {
    case RuleTarget::hbm:
    case RuleTarget::accumulate:
      if (rule.target == RuleTarget::accumulate && !is_grad) fail("is not a gradient; accumulate applies to grad regions");
      keep_if([](const Placement& p) { return p.tier == TierKind::hbm; });
      if (out.empty()) fail("does not allow HBM");
      break;
    case RuleTarget::host:
    case RuleTarget::stream:
      if (rule.target == RuleTarget::stream && !is_grad) fail("is not a gradient; stream applies to grad regions");
      keep_if([](const Placement& p) { return p.tier == TierKind::host; });
      if (out.empty()) fail("does not allow the host tier");
      break;
    case RuleTarget::keep:
      if (!can_recompute) fail("cannot be recomputed; keep and recompute apply to activations");
      keep_if([](const Placement& p) { return p.tier == TierKind::hbm && p.mode != Mode::recompute; });
      if (out.empty()) fail("does not allow HBM");
      break;
    case RuleTarget::recompute:
      if (!can_recompute) fail("cannot be recomputed; keep and recompute apply to activations");
      keep_if([](const Placement& p) { return p.mode == Mode::recompute; });
      if (out.empty()) fail("does not allow HBM");
      break;
  }
  return out;
}

}  // namespace ght::tier
