#pragma once
// Shared by the CPU and GPU optimizer tests: an fp64 AdamW reference, tolerance checks that
// print the first mismatches and the worst error, and two drivers that run ght::optimizer::AdamW
// on any path (10 steps against the reference; the non-finite guard with memcmp of all state).
// Where gradients and weights live is abstracted by `Mem`, so the GPU tests reuse the drivers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "alloc/tiered.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/bf16.hpp"

namespace ght::optimizer::test {

/// The machine's tiered allocator with the master on one tier and m and v on another (as a plan
/// would; different tiers: a region with part of its state on the host).
inline std::shared_ptr<alloc::tiered_allocator> split_state(TierKind master, TierKind moments) {
  std::shared_ptr<alloc::tiered_allocator> a = alloc::make_default_tiered_allocator();
  a->set_placement([master, moments](std::string_view, TensorClass cls) -> std::optional<TierKind> {
    if (cls == TensorClass::master) return master;
    if (cls == TensorClass::adam_m || cls == TensorClass::adam_v) return moments;
    return std::nullopt;
  });
  return a;
}
/// Master, m and v all placed on `t`.
inline std::shared_ptr<alloc::tiered_allocator> state_on(TierKind t) { return split_state(t, t); }
inline std::shared_ptr<alloc::tiered_allocator> host_state() { return state_on(TierKind::host); }
inline std::shared_ptr<alloc::tiered_allocator> hbm_state() { return state_on(TierKind::hbm); }

// ---- fp64 reference ------------------------------------------------------------------------

struct RefRegion {
  bool decay = true;
  std::vector<double> p, m, v;
};

/// One AdamW step in double precision with global-norm clipping (torch semantics).
/// Returns the grad norm; `taken` false when it is not finite (nothing changes then).
inline double ref_step(std::vector<RefRegion>& rs, const std::vector<std::vector<double>>& grads,
                       const AdamWHyper& h, double lr, std::int64_t t, bool* taken) {
  double ss = 0;
  for (const auto& g : grads) {
    for (double x : g) ss += x * x;
  }
  const double norm = std::sqrt(ss);
  *taken = std::isfinite(norm);
  if (!*taken) return norm;
  const double clip = h.max_grad_norm > 0 ? std::min(1.0, h.max_grad_norm / (norm + 1e-6)) : 1.0;
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(t));
  for (std::size_t r = 0; r < rs.size(); ++r) {
    RefRegion& R = rs[r];
    for (std::size_t i = 0; i < R.p.size(); ++i) {
      const double g = grads[r][i] * clip;
      R.m[i] = h.beta1 * R.m[i] + (1 - h.beta1) * g;
      R.v[i] = h.beta2 * R.v[i] + (1 - h.beta2) * g * g;
      if (R.decay) R.p[i] *= 1 - lr * h.weight_decay;
      R.p[i] -= (lr / bc1) * R.m[i] / (std::sqrt(R.v[i]) / std::sqrt(bc2) + h.eps);
    }
  }
  return norm;
}

/// |got - ref| <= atol + rtol·|ref| everywhere; on failure print the first mismatches and the
/// worst error.
inline ::testing::AssertionResult all_close(const std::string& what, const std::vector<float>& got,
                                            const std::vector<double>& ref, double rtol,
                                            double atol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  }
  std::size_t bad = 0, worst_i = 0;
  double worst = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    const double tol = atol + rtol * std::abs(ref[i]);
    if (!(err <= tol)) {
      if (bad < 5) {
        first += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " ref " +
                 std::to_string(ref[i]) + " err " + std::to_string(err) + " tol " +
                 std::to_string(tol);
      }
      ++bad;
    }
    if (!(err / (atol + rtol * std::abs(ref[i])) <= worst)) {
      worst = err / (atol + rtol * std::abs(ref[i]));
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                       << " elements out of tolerance" << first
                                       << "\n  worst at [" << worst_i << "]: " << worst
                                       << "x the tolerance";
}

// ---- where gradients and weights live --------------------------------------------------------

/// Memory the test hands to the optimizer. Host by default; the GPU tests add HBM and pinned.
struct Mem {
  virtual ~Mem() = default;
  virtual void* alloc(std::size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    return p;
  }
  virtual void release(void* p) { std::free(p); }
  virtual void upload(void* dst, const void* src, std::size_t bytes) {
    std::memcpy(dst, src, bytes);
  }
  virtual void download(void* dst, const void* src, std::size_t bytes) {
    std::memcpy(dst, src, bytes);
  }
};

struct Case {
  std::vector<std::size_t> sizes = {4099, 777, 65536 + 5};  // the last one splits across a team
  std::vector<bool> decay = {true, false, true};
  std::vector<double> grad_scale = {1.0, 0.05, 3.0};  ///< per region, to vary magnitudes
  GradType grad_type = GradType::bf16;
  AdamWHyper hyper;
  enum class Clip { active, inactive, disabled } clip = Clip::inactive;
  int steps = 10;
  std::uint32_t seed = 1234;
};

struct Buffers {
  Mem* gmem = nullptr;
  Mem* wmem = nullptr;
  std::vector<void*> grads, weights;
  ~Buffers() {
    for (void* g : grads) gmem->release(g);
    for (void* w : weights) wmem->release(w);
  }
};

/// Random gradients for every region: the values the optimizer sees (bf16-rounded if needed) as
/// doubles for the reference and as raw bytes for upload.
inline void make_grads(const Case& c, std::mt19937& rng, std::vector<std::vector<double>>& ref,
                       std::vector<std::vector<unsigned char>>& raw) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ref.assign(c.sizes.size(), {});
  raw.assign(c.sizes.size(), {});
  for (std::size_t r = 0; r < c.sizes.size(); ++r) {
    const std::size_t n = c.sizes[r];
    ref[r].resize(n);
    raw[r].resize(n * grad_type_size(c.grad_type));
    for (std::size_t i = 0; i < n; ++i) {
      const float x = nd(rng) * static_cast<float>(c.grad_scale[r]);
      if (c.grad_type == GradType::bf16) {
        const std::uint16_t b = float_to_bf16_bits(x);
        std::memcpy(raw[r].data() + 2 * i, &b, 2);
        ref[r][i] = bf16_bits_to_float(b);
      } else {
        std::memcpy(raw[r].data() + 4 * i, &x, 4);
        ref[r][i] = x;
      }
    }
  }
}

/// Build regions with weights and gradients in `gmem`/`wmem`, state from `alloc`, initial master
/// random (also loaded into the reference), m = v = 0.
inline std::unique_ptr<AdamW> make_optimizer(const Case& c, Mem& gmem, Mem& wmem,
                                             AdamWOptions opts,
                                             std::shared_ptr<alloc::tiered_allocator> alloc, Buffers& buf,
                                             std::vector<RefRegion>& ref, std::mt19937& rng) {
  buf.gmem = &gmem;
  buf.wmem = &wmem;
  std::vector<Region> regions;
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  ref.assign(c.sizes.size(), {});
  for (std::size_t r = 0; r < c.sizes.size(); ++r) {
    const std::size_t n = c.sizes[r];
    Region reg;
    reg.name = "region" + std::to_string(r);
    reg.n = n;
    reg.weight_decay = c.decay[r];
    reg.grad_type = c.grad_type;
    buf.grads.push_back(gmem.alloc(n * grad_type_size(c.grad_type)));
    buf.weights.push_back(wmem.alloc(n * sizeof(bf16)));
    reg.grad = buf.grads.back();
    reg.weight = buf.weights.back();
    regions.push_back(reg);
    ref[r].decay = c.decay[r];
    ref[r].p.resize(n);
    ref[r].m.assign(n, 0.0);
    ref[r].v.assign(n, 0.0);
  }
  opts.hyper = c.hyper;
  auto opt = std::make_unique<AdamW>(std::move(regions), opts, std::move(alloc));
  for (std::size_t r = 0; r < c.sizes.size(); ++r) {
    std::vector<float> p(c.sizes[r]);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] = ud(rng);
      ref[r].p[i] = p[i];
    }
    opt->load_state(r, p.data(), nullptr, nullptr);
  }
  return opt;
}

/// Each region on its expected path, and a gpu_link region in the link mode the options asked for.
inline void expect_paths(const AdamW& opt, const AdamWOptions& opts, const std::vector<Path>& expected) {
  ASSERT_EQ(expected.size(), opt.num_regions());
  for (std::size_t r = 0; r < expected.size(); ++r) {
    ASSERT_EQ(opt.path(r), expected[r]) << "region " << r;
    if (expected[r] == Path::gpu_link && opts.link_mode) {
      ASSERT_EQ(opt.link_mode(r), *opts.link_mode) << "region " << r;
    }
  }
}

inline double expected_norm(const std::vector<std::vector<double>>& g) {
  double ss = 0;
  for (const auto& v : g) {
    for (double x : v) ss += x * x;
  }
  return std::sqrt(ss);
}

/// 10 steps (Case::steps) against the fp64 reference, region r on path expected_paths[r] (the
/// optimizer's own choice, from where its state landed).
inline void run_reference_case(Case c, Mem& gmem, Mem& wmem, AdamWOptions opts,
                               std::shared_ptr<alloc::tiered_allocator> alloc, const std::vector<Path>& expected_paths) {
  std::mt19937 rng(c.seed);
  Buffers buf;
  std::vector<RefRegion> ref;
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  // Clip thresholds relative to the first step's norm: well below (active) or far above.
  {
    std::mt19937 probe(c.seed + 1);
    make_grads(c, probe, g_ref, g_raw);
    const double n0 = expected_norm(g_ref);
    c.hyper.max_grad_norm = c.clip == Case::Clip::active     ? 0.25 * n0
                            : c.clip == Case::Clip::inactive ? 1e6 * n0
                                                             : 0.0;
  }
  auto opt = make_optimizer(c, gmem, wmem, opts, alloc, buf, ref, rng);
  ASSERT_NO_FATAL_FAILURE(expect_paths(*opt, opts, expected_paths));
  std::vector<std::vector<float>> before(c.sizes.size());  // master before the last step
  for (int s = 1; s <= c.steps; ++s) {
    if (s == c.steps) {
      for (std::size_t r = 0; r < c.sizes.size(); ++r) {
        before[r].resize(c.sizes[r]);
        opt->save_state(r, before[r].data(), nullptr, nullptr);
      }
    }
    make_grads(c, rng, g_ref, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      gmem.upload(buf.grads[r], g_raw[r].data(), g_raw[r].size());
    }
    const double lr = 1e-3 * (1.0 + 0.3 * s);  // a different lr every step
    bool taken = false;
    const double ref_norm = ref_step(ref, g_ref, c.hyper, lr, s, &taken);
    ASSERT_TRUE(taken);
    const StepResult res = opt->step(lr);
    opt->synchronize();
    ASSERT_TRUE(res.taken);
    EXPECT_EQ(res.step, s);
    EXPECT_NEAR(res.grad_norm, ref_norm, 1e-6 * ref_norm);
    if (c.clip == Case::Clip::active) {
      EXPECT_LT(res.clip_coef, 0.9);
    } else {
      EXPECT_EQ(res.clip_coef, 1.0);
    }
  }
  EXPECT_EQ(opt->stats().steps_taken, c.steps);
  EXPECT_EQ(opt->stats().steps_skipped_nonfinite, 0);
  for (std::size_t r = 0; r < c.sizes.size(); ++r) {
    const std::size_t n = c.sizes[r];
    std::vector<float> p(n), m(n), v(n);
    opt->save_state(r, p.data(), m.data(), v.data());
    const double gs = c.grad_scale[r];
    const std::string tag = "region " + std::to_string(r) + " (" + std::string(to_string(expected_paths[r])) + ")";
    EXPECT_TRUE(all_close(tag + " master", p, ref[r].p, 2e-6, 2e-6));
    EXPECT_TRUE(all_close(tag + " m", m, ref[r].m, 1e-5, 1e-6 * gs));
    EXPECT_TRUE(all_close(tag + " v", v, ref[r].v, 1e-5, 1e-10 * gs * gs));
    // The bf16 weight is exactly the rounded master, or with a weight extrapolation x the
    // rounded p + x·(p − before), each fp32 operation rounded on its own.
    std::vector<std::uint16_t> w(n);
    wmem.download(w.data(), buf.weights[r], n * sizeof(bf16));
    const float x = static_cast<float>(c.hyper.weight_extrapolation);
    std::size_t mismatches = 0, moved = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float want = p[i];
      if (x != 0) {
        const volatile float d = p[i] - before[r][i];
        const volatile float e = x * d;
        want = p[i] + e;
        moved += float_to_bf16_bits(want) != float_to_bf16_bits(p[i]);
      }
      mismatches += w[i] != float_to_bf16_bits(want);
    }
    EXPECT_EQ(mismatches, 0u) << tag << ": bf16 weights differ from bf16_rn(" << (x != 0 ? "extrapolated " : "")
                              << "master)";
    if (x != 0) {
      EXPECT_GT(moved, n / 4) << tag << ": the extrapolation hardly moves the weights (a weak test)";
    }
  }
}

/// The same, every region on expected_path.
inline void run_reference_case(Case c, Mem& gmem, Mem& wmem, AdamWOptions opts,
                               std::shared_ptr<alloc::tiered_allocator> alloc, Path expected_path) {
  const std::vector<Path> paths(c.sizes.size(), expected_path);
  run_reference_case(std::move(c), gmem, wmem, std::move(opts), std::move(alloc), paths);
}

/// Snapshot of every byte the optimizer owns or writes.
struct Snapshot {
  std::vector<std::vector<float>> p, m, v;
  std::vector<std::vector<std::uint16_t>> w;
};

inline Snapshot snapshot(const AdamW& opt, Mem& wmem, const Buffers& buf) {
  Snapshot s;
  for (std::size_t r = 0; r < opt.num_regions(); ++r) {
    const std::size_t n = opt.region(r).n;
    s.p.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    s.w.emplace_back(n);
    opt.save_state(r, s.p.back().data(), s.m.back().data(), s.v.back().data());
    wmem.download(s.w.back().data(), buf.weights[r], n * sizeof(bf16));
  }
  return s;
}

inline bool bytes_equal(const Snapshot& a, const Snapshot& b) {
  auto eq = [](const auto& x, const auto& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (x[i].size() != y[i].size() ||
          std::memcmp(x[i].data(), y[i].data(), x[i].size() * sizeof(x[i][0])) != 0) {
        return false;
      }
    }
    return true;
  };
  return eq(a.p, b.p) && eq(a.m, b.m) && eq(a.v, b.v) && eq(a.w, b.w);
}

/// Two normal steps, then NaN, +Inf and -Inf injected into one gradient element (each skipped,
/// state byte-equal, counter incremented), then a normal step that is taken again.
inline void run_nonfinite_case(Case c, Mem& gmem, Mem& wmem, AdamWOptions opts,
                               std::shared_ptr<alloc::tiered_allocator> alloc, Path expected_path) {
  std::mt19937 rng(c.seed);
  Buffers buf;
  std::vector<RefRegion> ref;
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  c.hyper.max_grad_norm = 1.0;
  auto opt = make_optimizer(c, gmem, wmem, opts, alloc, buf, ref, rng);
  ASSERT_NO_FATAL_FAILURE(expect_paths(*opt, opts, std::vector<Path>(c.sizes.size(), expected_path)));
  auto upload = [&] {
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      gmem.upload(buf.grads[r], g_raw[r].data(), g_raw[r].size());
    }
  };
  for (int s = 0; s < 2; ++s) {
    make_grads(c, rng, g_ref, g_raw);
    upload();
    ASSERT_TRUE(opt->step(1e-3).taken);
    opt->synchronize();  // the update reads the gradients until it is done
  }
  opt->synchronize();
  const float bad[3] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (int k = 0; k < 3; ++k) {
    make_grads(c, rng, g_ref, g_raw);
    const std::size_t r = static_cast<std::size_t>(k) % c.sizes.size();
    const std::size_t i = c.sizes[r] / 2 + static_cast<std::size_t>(k);
    if (c.grad_type == GradType::bf16) {
      const std::uint16_t b = float_to_bf16_bits(bad[k]);
      std::memcpy(g_raw[r].data() + 2 * i, &b, 2);
    } else {
      std::memcpy(g_raw[r].data() + 4 * i, &bad[k], 4);
    }
    upload();
    const Snapshot before = snapshot(*opt, wmem, buf);
    const StepResult res = opt->step(1e-3);
    opt->synchronize();
    EXPECT_FALSE(res.taken) << "value " << bad[k];
    EXPECT_FALSE(std::isfinite(res.grad_norm));
    EXPECT_EQ(res.step, 2);
    EXPECT_EQ(opt->stats().steps_skipped_nonfinite, k + 1);
    EXPECT_EQ(opt->step_count(), 2);
    const Snapshot after = snapshot(*opt, wmem, buf);
    EXPECT_TRUE(bytes_equal(before, after)) << "state changed on a skipped step (value " << bad[k]
                                            << ", path " << to_string(expected_path) << ")";
  }
  make_grads(c, rng, g_ref, g_raw);
  upload();
  const Snapshot before = snapshot(*opt, wmem, buf);
  const StepResult res = opt->step(1e-3);
  opt->synchronize();
  EXPECT_TRUE(res.taken);
  EXPECT_EQ(res.step, 3);
  EXPECT_EQ(opt->stats().steps_skipped_nonfinite, 3);
  EXPECT_EQ(opt->stats().steps_taken, 3);
  EXPECT_FALSE(bytes_equal(before, snapshot(*opt, wmem, buf)));
}

// ---- speculation against the plain step ------------------------------------------------------

/// What begin_step finds on the middle step of a twins run.
enum class Outcome { kept, clipped, lr_changed, nonfinite };

inline std::string name_of(Outcome o) {
  switch (o) {
    case Outcome::kept: return "kept";
    case Outcome::clipped: return "clipped";
    case Outcome::lr_changed: return "lr_changed";
    case Outcome::nonfinite: return "nonfinite";
  }
  return "?";
}

/// Step s's gradients made special: scaled 1000x (clipped, when max_grad_norm is 10x the first
/// step's norm) or one NaN in region 1 (skipped).
inline void make_special(const Case& c, Outcome o, std::vector<std::vector<unsigned char>>& g_raw) {
  if (o == Outcome::clipped) {
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      for (std::size_t i = 0; i < c.sizes[r]; ++i) {
        if (c.grad_type == GradType::bf16) {
          std::uint16_t b;
          std::memcpy(&b, g_raw[r].data() + 2 * i, 2);
          b = float_to_bf16_bits(bf16_bits_to_float(b) * 1000.0f);
          std::memcpy(g_raw[r].data() + 2 * i, &b, 2);
        } else {
          float f;
          std::memcpy(&f, g_raw[r].data() + 4 * i, 4);
          f *= 1000.0f;
          std::memcpy(g_raw[r].data() + 4 * i, &f, 4);
        }
      }
    }
  }
  if (o == Outcome::nonfinite) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (c.grad_type == GradType::bf16) {
      const std::uint16_t b = float_to_bf16_bits(nan);
      std::memcpy(g_raw[1].data() + 2 * 5, &b, 2);
    } else {
      std::memcpy(g_raw[1].data() + 4 * 5, &nan, 4);
    }
  }
}

/// A run of six steps with the two special outcomes in it; runs that resume do so before step 4.
inline constexpr Outcome kSixSteps[6] = {Outcome::kept, Outcome::clipped, Outcome::kept,
                                        Outcome::nonfinite, Outcome::kept, Outcome::kept};
inline constexpr int kResumeBeforeStep = 4;

/// What a checkpoint and a resume do: `from`'s master, m, v, bf16 weights and step count into
/// `to` (a fresh optimizer over the same regions; weights in `wmem`).
inline void resume_into(const AdamW& from, const Buffers& bf, AdamW& to, Buffers& bt, Mem& wmem) {
  for (std::size_t r = 0; r < from.num_regions(); ++r) {
    const std::size_t n = from.region(r).n;
    std::vector<float> p(n), m(n), v(n);
    std::vector<std::uint16_t> w(n);
    from.save_state(r, p.data(), m.data(), v.data());
    to.load_state(r, p.data(), m.data(), v.data());
    wmem.download(w.data(), bf.weights[r], n * sizeof(bf16));
    wmem.upload(bt.weights[r], w.data(), n * sizeof(bf16));
  }
  to.set_step_count(from.step_count());
}

/// Two steps that must have decided alike (taken, step count, clip), and the outcome they had.
inline void expect_same_decision(const StepResult& a, const StepResult& b, Outcome o, int s) {
  EXPECT_EQ(a.taken, b.taken) << "step " << s;
  EXPECT_EQ(a.step, b.step) << "step " << s;
  EXPECT_EQ(a.clip_coef, b.clip_coef) << "step " << s;
  if (o == Outcome::clipped) {
    EXPECT_LT(a.clip_coef, 0.5) << "step " << s;
  }
  if (o == Outcome::nonfinite) {
    EXPECT_FALSE(a.taken) << "step " << s;
  }
}

/**
 * Two optimizers from the same seed: one steps normally (`plain`), the other (`spec`, with its
 * undo arena) speculates every region, last first as backward finishes them, before begin_step.
 * Three steps, compared byte for byte after each; `outcome` applies to the middle step, the
 * others are plain unclipped steps. Gradients and weights live in `mem`, state comes from a
 * fresh `make_alloc()` per optimizer.
 */
template <typename MakeAlloc>
void run_speculation_twins(Case c, Mem& mem, AdamWOptions plain, AdamWOptions spec_opts, MakeAlloc make_alloc,
                           Outcome outcome) {
  SCOPED_TRACE(std::string(c.grad_type == GradType::bf16 ? "bf16" : "fp32") + " gradients, " + name_of(outcome));
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  std::mt19937 probe(c.seed + 1);
  make_grads(c, probe, g_ref, g_raw);
  // Clipping only where asked: on the middle step of `clipped`, gradients are scaled up 1000x.
  c.hyper.max_grad_norm = 10 * expected_norm(g_ref);
  Buffers buf_ref, buf_spec;
  std::vector<RefRegion> unused;
  std::mt19937 rng_ref(c.seed), rng_spec(c.seed);
  auto ref = make_optimizer(c, mem, mem, plain, make_alloc(), buf_ref, unused, rng_ref);
  auto spec = make_optimizer(c, mem, mem, spec_opts, make_alloc(), buf_spec, unused, rng_spec);
  std::size_t total = 0;
  for (std::size_t n : c.sizes) total += n;

  std::mt19937 rng(c.seed + 2);
  for (int s = 1; s <= 3; ++s) {
    const bool special = s == 2;
    make_grads(c, rng, g_ref, g_raw);
    if (special) make_special(c, outcome, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      mem.upload(buf_ref.grads[r], g_raw[r].data(), g_raw[r].size());
      mem.upload(buf_spec.grads[r], g_raw[r].data(), g_raw[r].size());
    }
    const double lr = 1e-3 * (1.0 + 0.3 * s);
    const double spec_lr = special && outcome == Outcome::lr_changed ? 2 * lr : lr;
    for (std::size_t r = c.sizes.size(); r-- > 0;) {
      ASSERT_EQ(spec->speculate_region(r, spec_lr, nullptr), Speculation::done) << "region " << r;
    }
    EXPECT_EQ(spec->speculate_region(0, spec_lr, nullptr), Speculation::ineligible)
        << "a region speculated twice in one step";
    const StepResult a = ref->step(lr);
    const StepResult b = spec->step(lr);
    ref->synchronize();
    spec->synchronize();
    const bool undone = special && outcome != Outcome::kept;
    EXPECT_EQ(a.taken, b.taken) << "step " << s;
    EXPECT_EQ(a.step, b.step) << "step " << s;
    EXPECT_EQ(a.clip_coef, b.clip_coef) << "step " << s;
    if (std::isnan(a.grad_norm)) {
      EXPECT_TRUE(std::isnan(b.grad_norm)) << "step " << s;
    } else {
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    }
    EXPECT_EQ(b.speculated_params, total) << "step " << s;
    EXPECT_EQ(b.speculation_undone, undone) << "step " << s;
    if (special && outcome == Outcome::clipped) {
      EXPECT_LT(a.clip_coef, 0.5);
    }
    if (special && outcome == Outcome::nonfinite) {
      EXPECT_FALSE(a.taken);
    }
    EXPECT_TRUE(bytes_equal(snapshot(*ref, mem, buf_ref), snapshot(*spec, mem, buf_spec)))
        << "step " << s << ": speculative and plain steps differ";
  }
  EXPECT_EQ(spec->stats().steps_speculated, 3);
  EXPECT_EQ(spec->stats().speculations_undone, outcome == Outcome::kept ? 0 : 1);
}

}  // namespace ght::optimizer::test
