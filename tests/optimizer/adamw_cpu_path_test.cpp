// The cpu path's worker thread and its speculation, on the host (GPU cases of both:
// adamw_split_test.cu): the worker runs jobs in order and reports a failure to every waiter; an
// optimizer whose cpu regions run on the worker gives the bytes of one that runs them on the
// calling thread (clip, non-finite skip and resume included); speculation of cpu regions against
// the plain step in every outcome, with the worker and without; the host undo arena's limits.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/expect.hpp"
#include "common/registry.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {
namespace {

using test::Case;
using test::Outcome;

// ---- the worker ---------------------------------------------------------------------------------

detail::CpuJob job_for(std::size_t region) {
  detail::CpuJob j;
  j.region = region;
  return j;
}

TEST(CpuWorker, RunsJobsInOrderAndWaitsForATicket) {
  std::mutex mu;
  std::vector<std::size_t> ran;
  std::atomic<bool> release{false};
  detail::CpuWorker w(-1, [&](const detail::CpuJob& j, const detail::CpuWorker::Peek& peek) {
    if (j.region == 0) {
      while (!release.load()) std::this_thread::yield();  // hold the queue until all are pushed
      const detail::CpuJob* next = peek();
      ASSERT_NE(next, nullptr);  // the next job is visible to prefetch
      EXPECT_EQ(next->region, 1u);
    }
    std::lock_guard<std::mutex> lk(mu);
    ran.push_back(j.region);
  });
  std::vector<std::uint64_t> tickets;
  for (std::size_t r = 0; r < 5; ++r) tickets.push_back(w.push(job_for(r)));
  for (std::size_t i = 1; i < tickets.size(); ++i) EXPECT_GT(tickets[i], tickets[i - 1]);
  release = true;
  w.wait(tickets[2]);
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_GE(ran.size(), 3u);
  }
  w.drain();
  EXPECT_EQ(ran, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  w.wait(tickets[0]);  // long done: returns at once
}

TEST(CpuWorker, AFailureReachesEveryWaiterAndDropsTheRest) {
  std::atomic<int> ran{0};
  std::atomic<bool> release{false};
  detail::CpuWorker w(-1, [&](const detail::CpuJob& j, const detail::CpuWorker::Peek&) {
    while (!release.load()) std::this_thread::yield();  // until all three are pushed
    if (j.region == 1) throw ght::logic_error("job for region 1 failed");
    ++ran;
  });
  const std::uint64_t a = w.push(job_for(0));
  const std::uint64_t b = w.push(job_for(1));
  const std::uint64_t c = w.push(job_for(2));
  release = true;
  w.wait(a);
  EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { w.wait(b); }), "region 1 failed");
  EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { w.wait(c); }), "region 1 failed");
  EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { w.drain(); }), "region 1 failed");
  EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { (void)w.push(job_for(3)); }), "region 1 failed");
  EXPECT_EQ(ran.load(), 1);  // job 2 was dropped
}

// ---- the optimizer with its worker --------------------------------------------------------------

AdamWOptions cpu_options(std::optional<bool> worker, std::size_t host_arena = 0) {
  AdamWOptions o;
  o.path = PathChoice::cpu;
  o.cpu_worker = worker;
  o.speculate_host_bytes = host_arena;
  return o;
}

// The same steps on the calling thread and on the worker, one of them clipped, one skipped,
// then a resume of the worker's optimizer from saved state: every byte equal after each step.
TEST(AdamWCpuWorker, SameBytesAsTheCallingThreadWithClipSkipAndResume) {
  for (GradType gt : {GradType::bf16, GradType::fp32}) {
    SCOPED_TRACE(gt == GradType::bf16 ? "bf16 gradients" : "fp32 gradients");
    Case c;
    c.grad_type = gt;
    test::Mem host;
    std::vector<std::vector<double>> g_ref;
    std::vector<std::vector<unsigned char>> g_raw;
    std::mt19937 probe(c.seed + 1);
    test::make_grads(c, probe, g_ref, g_raw);
    c.hyper.max_grad_norm = 10 * test::expected_norm(g_ref);
    test::Buffers buf_a, buf_b, buf_r;
    std::vector<test::RefRegion> unused;
    std::mt19937 rng_a(c.seed), rng_b(c.seed), rng_r(c.seed);
    auto a = test::make_optimizer(c, host, host, cpu_options(false), test::host_state(), buf_a, unused, rng_a);
    auto b = test::make_optimizer(c, host, host, cpu_options(true), test::host_state(), buf_b, unused, rng_b);
    std::unique_ptr<AdamW> resumed;
    std::mt19937 rng(c.seed + 2);
    for (int s = 0; s < 6; ++s) {
      const Outcome o = test::kSixSteps[s];
      if (s == test::kResumeBeforeStep) {
        // Resume b's state into a fresh optimizer (what a checkpoint does), which continues.
        resumed = test::make_optimizer(c, host, host, cpu_options(true), test::host_state(), buf_r, unused, rng_r);
        test::resume_into(*b, buf_b, *resumed, buf_r, host);
      }
      test::make_grads(c, rng, g_ref, g_raw);
      test::make_special(c, o, g_raw);
      for (std::size_t r = 0; r < c.sizes.size(); ++r) {
        std::memcpy(buf_a.grads[r], g_raw[r].data(), g_raw[r].size());
        std::memcpy(buf_b.grads[r], g_raw[r].data(), g_raw[r].size());
        if (resumed) std::memcpy(buf_r.grads[r], g_raw[r].data(), g_raw[r].size());
      }
      const double lr = 1e-3 * (1 + s);
      const StepResult ra = a->step(lr);
      AdamW& other = resumed ? *resumed : *b;
      const StepResult rb = other.step(lr);
      other.synchronize();  // the worker's updates are asynchronous: gradients stay until here
      test::expect_same_decision(ra, rb, o, s);
      EXPECT_TRUE(test::bytes_equal(test::snapshot(*a, host, buf_a),
                                    test::snapshot(other, host, resumed ? buf_r : buf_b)))
          << "step " << s << ": the worker's update differs from the calling thread's";
    }
  }
}

// Host-only regions run on the calling thread by default: update_region returns with the update
// done, so a caller may overwrite the gradients right away (the CPU backend does).
TEST(AdamWCpuWorker, HostOnlyRegionsAreUpdatedOnTheCallingThreadByDefault) {
  std::vector<float> g(4096, 0.25f), before(4096), after(4096);
  AdamW opt({Region{"a", 4096, true, nullptr, g.data(), GradType::fp32}}, cpu_options(std::nullopt));
  opt.save_state(0, before.data(), nullptr, nullptr);
  ASSERT_TRUE(opt.begin_step(1e-2).taken);
  opt.update_region(0);
  const auto* master = static_cast<const float*>(opt.state(0, TensorClass::master).host);
  std::memcpy(after.data(), master, after.size() * sizeof(float));  // no synchronize
  EXPECT_NE(std::memcmp(before.data(), after.data(), after.size() * sizeof(float)), 0);
}

// update_all(launched): every region reported once, in the order they were handed over (cpu
// regions first, then the rest), also on a skipped (non-finite) step, and never before its
// update was handed over; a region updated earlier by update_region is not reported again.
TEST(AdamWUpdateAll, ReportsEachRegionOnceAsItIsHandedOver) {
  for (std::optional<bool> worker : {std::optional<bool>{false}, std::optional<bool>{true}}) {
    std::vector<std::vector<float>> g(3, std::vector<float>(256, 0.125f));
    AdamW opt({Region{"a", 256, true, nullptr, g[0].data(), GradType::fp32},
               Region{"b", 256, false, nullptr, g[1].data(), GradType::fp32},
               Region{"c", 256, true, nullptr, g[2].data(), GradType::fp32}},
              cpu_options(worker));
    for (const bool finite : {true, false}) {
      if (!finite) g[1][7] = std::numeric_limits<float>::quiet_NaN();
      const StepResult res = opt.begin_step(1e-3);
      ASSERT_EQ(res.taken, finite);
      std::vector<std::size_t> seen;
      opt.update_all([&](std::size_t r) {
        seen.push_back(r);
        (void)opt.region_event(r);  // callable from here on (a cpu region waits for the worker)
      });
      EXPECT_EQ(seen, (std::vector<std::size_t>{0, 1, 2})) << "worker " << *worker << ", finite " << finite;
      opt.synchronize();
    }
    g[1][7] = 0.125f;
    ASSERT_TRUE(opt.begin_step(1e-3).taken);
    opt.update_region(1);
    std::vector<std::size_t> seen;
    opt.update_all([&](std::size_t r) { seen.push_back(r); });
    EXPECT_EQ(seen, (std::vector<std::size_t>{0, 2})) << "worker " << *worker;
    opt.synchronize();
  }
}

// ---- speculation of cpu regions -----------------------------------------------------------------

TEST(CpuSpeculation, BytesEqualThePlainStepWhateverBeginStepDecides) {
  for (std::optional<bool> worker : {std::optional<bool>(false), std::optional<bool>(true)}) {
    for (StateType st : {StateType::fp32, StateType::bf16, StateType::q8}) {
      for (GradType gt : {GradType::bf16, GradType::fp32}) {
        SCOPED_TRACE(std::string(*worker ? "worker" : "calling thread") + ", state " + to_string(st));
        for (Outcome o : {Outcome::kept, Outcome::clipped, Outcome::lr_changed, Outcome::nonfinite}) {
          Case c;
          c.grad_type = gt;
          test::Mem host;
          AdamWOptions plain = cpu_options(worker);
          plain.state_type = st;
          AdamWOptions spec = cpu_options(worker, std::size_t{16} << 20);
          spec.state_type = st;
          test::run_speculation_twins(c, host, plain, spec, [] { return test::host_state(); }, o);
        }
      }
    }
  }
}

TEST(CpuSpeculation, TheHostArenaLimitsItAndCancelRestoresEveryByte) {
  Case c;
  c.sizes = {100000, 2000};
  c.decay = {true, false};
  c.grad_scale = {1.0, 1.0};
  test::Mem host;
  for (bool worker : {false, true}) {
    SCOPED_TRACE(worker ? "worker" : "calling thread");
    std::mt19937 rng(3);
    std::vector<test::RefRegion> unused;
    test::Buffers buf;
    // 1 MiB holds the 2000-parameter region (30 KB with its weight) but not the other (1.4 MB).
    auto opt = test::make_optimizer(c, host, host, cpu_options(worker, std::size_t{1} << 20), test::host_state(),
                                    buf, unused, rng);
    EXPECT_EQ(opt->speculate_host_capacity(), std::size_t{1} << 20);
    EXPECT_EQ(opt->speculate_capacity(), 0u);  // no HBM arena for cpu regions
    std::vector<std::vector<double>> g_ref;
    std::vector<std::vector<unsigned char>> g_raw;
    test::make_grads(c, rng, g_ref, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) std::memcpy(buf.grads[r], g_raw[r].data(), g_raw[r].size());
    ASSERT_TRUE(opt->step(1e-3).taken);  // m and v non-zero
    opt->synchronize();
    const test::Snapshot before = test::snapshot(*opt, host, buf);
    EXPECT_EQ(opt->speculate_region(0, 1e-3, nullptr), Speculation::no_room);
    EXPECT_EQ(opt->speculate_region(1, 1e-3, nullptr), Speculation::done);
    std::vector<float> tmp(c.sizes[0]);
    EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { opt->save_state(0, tmp.data(), nullptr, nullptr); }),
                    "wait for begin_step or cancel_speculation");
    EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { (void)opt->speculate_region(0, 2e-3, nullptr); }),
                    "lr differs");
    opt->cancel_speculation();
    opt->synchronize();
    EXPECT_TRUE(test::bytes_equal(before, test::snapshot(*opt, host, buf))) << "cancel did not restore the state";
    const StepResult res = opt->step(1e-3);
    EXPECT_EQ(res.speculated_params, 0u);
    EXPECT_EQ(res.step, 2);
  }
  // Without a host arena (the default), cpu regions have no room; a GHT_OPT_SPECULATE HBM arena is
  // not theirs.
  std::vector<float> g(64, 0.5f);
  AdamWOptions o = cpu_options(std::nullopt);
  o.speculate_host_bytes.reset();
  o.speculate_bytes = std::size_t{1} << 30;
  AdamW opt({Region{"a", 64, true, nullptr, g.data(), GradType::fp32}}, o);
  EXPECT_EQ(opt.speculate_host_capacity(), 0u);
  EXPECT_EQ(opt.speculate_capacity(), 0u);
  EXPECT_EQ(opt.speculate_region(0, 1e-3, nullptr), Speculation::no_room);
  EXPECT_THROW((void)opt.speculate_region(0, -1.0, nullptr), ght::logic_error);  // bad lr named
}

// ---- the split: what needs no GPU ----------------------------------------------------------------

TEST(AdamWDma, TakesRegionsWithAnyHostArrayThatEachSideCanReach) {
  int host_word = 0, hbm_word = 0;
  const StateBuffer host{&host_word, &host_word, TierKind::host};
  const StateBuffer hbm{nullptr, &hbm_word, TierKind::hbm};
  const StateBuffer unreachable_hbm{nullptr, nullptr, TierKind::hbm};
  const StateBuffer no_cpu_address{nullptr, &host_word, TierKind::host};
  auto reachable = [](StateBuffer a, StateBuffer b, StateBuffer c) {
    const StateBuffer st[3] = {a, b, c};
    return detail::dma_reachable(st);
  };
  EXPECT_TRUE(reachable(host, host, host));
  EXPECT_TRUE(reachable(hbm, host, host));   // master in HBM, m and v copied
  EXPECT_TRUE(reachable(host, hbm, hbm));    // master copied, m and v in HBM
  EXPECT_FALSE(reachable(hbm, hbm, hbm));    // nothing crosses: the device path
  EXPECT_FALSE(reachable(hbm, host, no_cpu_address));
  EXPECT_FALSE(reachable(unreachable_hbm, host, host));
}

TEST(AdamWSplit, ChoiceAndShareAreChecked) {
  EXPECT_EQ(parse_path_choice("SPLIT"), PathChoice::split);
  EXPECT_EQ(to_string(PathChoice::split), "split");
  std::vector<float> g(64, 0.5f);
  const Region a{"a", 64, true, nullptr, g.data(), GradType::fp32};
  if (!detail::gpu_available()) {
    AdamWOptions o;
    o.path = PathChoice::split;
    EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { AdamW opt({a}, o); }),
                    "GHT_OPTIMIZER=split needs a GPU");
  }
  {
    // A share given without the split is a mistake worth naming.
    ght::test::ScopedFlag share("GHT_OPT_CPU_SHARE", "0.25");
    ght::test::ScopedFlag choice("GHT_OPTIMIZER", "cpu");
    EXPECT_CONTAINS(ght::test::error_of<ght::config_error>([&] { AdamW opt({a}); }),
                    "GHT_OPT_CPU_SHARE=0.25 applies only with GHT_OPTIMIZER=split");
  }
  {
    // Set programmatically, the choice is the caller's: the environment's share is not checked.
    ght::test::ScopedFlag share("GHT_OPT_CPU_SHARE", "0.25");
    AdamW opt({a}, cpu_options(std::nullopt));
    EXPECT_FALSE(opt.split_cpu_share().has_value());
  }
}

}  // namespace
}  // namespace ght::optimizer
