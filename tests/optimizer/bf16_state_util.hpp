#pragma once
// Shared by the bf16- and q8-state optimizer tests (host and GPU): random inputs for one AdamW span with
// bf16 m and v, and a driver that runs ght::optimizer::AdamW for a few steps on any path and
// returns every byte of its state and weights, so paths can be compared for equality.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/bf16.hpp"

namespace ght::optimizer::test {

/// Three steps of `opt` on random bf16 gradients `g` (step 2 large enough to clip), each copied
/// to `ref_g` first; after each step `on_step` gets the scalars the step used, so that a test can
/// run the kernel on its reference span with the same ones.
template <class OnStep>
void three_steps_second_clipped(AdamW& opt, std::vector<std::uint16_t>& g, void* ref_g, OnStep on_step) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (int s = 1; s <= 3; ++s) {
    for (auto& x : g) x = float_to_bf16_bits(nd(rng) * (s == 2 ? 10.0f : 1e-3f));
    std::memcpy(ref_g, g.data(), 2 * g.size());
    const StepResult res = opt.step(1e-3);
    ASSERT_TRUE(res.taken);
    if (s == 2) {
      EXPECT_LT(res.clip_coef, 1.0);
    }
    on_step(make_step_scalars(opt.hyper(), 1e-3, s, true, res.clip_coef));
  }
}

/// Inputs of one span: fp32 master, bf16 m and v, gradients of either type (as raw bytes).
struct Bf16StateInputs {
  std::vector<float> p;
  std::vector<std::uint16_t> m, v;
  std::vector<unsigned char> g;  ///< n elements of grad_type
  GradType grad_type = GradType::bf16;
  std::size_t n = 0;
};

inline Bf16StateInputs random_bf16_state(std::size_t n, GradType t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Bf16StateInputs in;
  in.n = n;
  in.grad_type = t;
  in.p.resize(n);
  in.m.resize(n);
  in.v.resize(n);
  in.g.resize(n * grad_type_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    in.p[i] = nd(rng);
    in.m[i] = float_to_bf16_bits(0.1f * nd(rng));
    in.v[i] = float_to_bf16_bits(0.01f * std::abs(nd(rng)));
    const float g = nd(rng) * (i % 5 == 0 ? 1e-3f : 1.0f);  // small ones round differently
    if (t == GradType::bf16) {
      const std::uint16_t b = float_to_bf16_bits(g);
      std::memcpy(in.g.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(in.g.data() + 4 * i, &g, 4);
    }
  }
  return in;
}

/// What a run of AdamW leaves: per region master, m and v (save_state: m and v widened from
/// bf16, or dequantized from q8) and the bf16 weights.
struct RunBytes {
  std::vector<std::vector<float>> p, m, v;
  std::vector<std::vector<std::uint16_t>> w;
};

/// Regions of these sizes with deterministic gradients (bf16) and weights in `mem`, `steps`
/// steps of AdamW with bf16 state (or base.state_type where set: q8 too) at a varying lr; clip_scale multiplies every gradient (large:
/// the clip is active). Gradients change every step.
inline RunBytes run_bf16_state(const AdamWOptions& base, Mem& gmem, Mem& wmem,
                               std::shared_ptr<alloc::tiered_allocator> alloc,
                               const std::vector<std::size_t>& sizes, int steps, float clip_scale) {
  AdamWOptions o = base;
  if (!o.state_type) o.state_type = StateType::bf16;
  std::vector<Region> regions;
  std::vector<void*> grads, weights;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    Region d;
    d.name = "region" + std::to_string(r);
    d.n = sizes[r];
    d.weight_decay = r % 2 == 0;
    d.grad_type = GradType::bf16;
    grads.push_back(gmem.alloc(sizes[r] * 2));
    weights.push_back(wmem.alloc(sizes[r] * 2));
    d.grad = grads.back();
    d.weight = weights.back();
    regions.push_back(d);
  }
  RunBytes out;
  {
    AdamW opt(regions, o, std::move(alloc));
    std::mt19937 rng(77);
    std::normal_distribution<float> nd;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      std::vector<float> p(sizes[r]);
      for (float& x : p) x = nd(rng);
      opt.load_state(r, p.data(), nullptr, nullptr);
    }
    for (int s = 1; s <= steps; ++s) {
      for (std::size_t r = 0; r < sizes.size(); ++r) {
        std::vector<std::uint16_t> g(sizes[r]);
        for (auto& x : g) x = float_to_bf16_bits(clip_scale * nd(rng) * (r == 1 ? 1e-3f : 1e-2f));
        gmem.upload(grads[r], g.data(), g.size() * 2);
      }
      (void)opt.step(1e-3 * s);
      opt.synchronize();
    }
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      out.p.emplace_back(sizes[r]);
      out.m.emplace_back(sizes[r]);
      out.v.emplace_back(sizes[r]);
      out.w.emplace_back(sizes[r]);
      opt.save_state(r, out.p.back().data(), out.m.back().data(), out.v.back().data());
      wmem.download(out.w.back().data(), weights[r], sizes[r] * 2);
    }
  }
  for (void* g : grads) gmem.release(g);
  for (void* w : weights) wmem.release(w);
  return out;
}

/// Byte equality of two runs, naming the first differing region, array and element.
inline ::testing::AssertionResult same_bytes(const RunBytes& a, const RunBytes& b) {
  auto cmp = [](const char* what, std::size_t r, const auto& x, const auto& y) -> std::string {
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::memcmp(&x[i], &y[i], sizeof x[i]) != 0) {
        return std::string(what) + " of region " + std::to_string(r) + " differs first at [" +
               std::to_string(i) + "]: " + std::to_string(static_cast<double>(x[i])) + " vs " +
               std::to_string(static_cast<double>(y[i]));
      }
    }
    return {};
  };
  if (a.p.size() != b.p.size() || a.p.empty()) return ::testing::AssertionFailure() << "no regions or a size mismatch";
  for (std::size_t r = 0; r < a.p.size(); ++r) {
    for (const std::string& e : {cmp("master", r, a.p[r], b.p[r]), cmp("m", r, a.m[r], b.m[r]),
                                 cmp("v", r, a.v[r], b.v[r]), cmp("weight", r, a.w[r], b.w[r])}) {
      if (!e.empty()) return ::testing::AssertionFailure() << e;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ght::optimizer::test
