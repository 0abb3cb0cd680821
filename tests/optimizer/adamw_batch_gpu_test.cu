// Batched GPU launches give the bytes of one launch per span: AdamWBatch against adamw_gpu span
// by span (fp32 and bf16 state, bf16 and fp32 gradients, tails, unaligned spans, spans without a
// weight, three distinct scalar sets, small and full batches), DeviceSumsq's batched sums against
// one launch per buffer, and AdamW's update_all at GHT_OPT_BATCH 1 against 32 on the device and
// gpu_link zero-copy paths, and update_all's `launched` never reporting a region before its last
// chunk is queued. Skips without a GPU; with one, every comparison checks state that changed and
// batches that held several spans.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16.hpp"
#include "optimizer/bf16_state_util.hpp"
#include "optimizer/gpu_mem.hpp"

namespace ght::optimizer {
namespace {

using test::DeviceMem;

// One span's device buffers, its inputs and what came back.
struct SpanBufs {
  std::size_t n = 0, shift = 0;  // shift: elements past a 256-byte boundary (1 breaks alignment)
  bool weight = true;
  int scalars = 0;  // which of the test's StepScalars
  void* base[5] = {};  // master, m, v, grad, weight allocations
  AdamWSpan span;
  std::vector<unsigned char> in[4];  // master, m, v, grad bytes
};

std::vector<unsigned char> bytes_back(DeviceMem& dev, const void* p, std::size_t n) {
  std::vector<unsigned char> out(n);
  dev.download(out.data(), p, n);
  return out;
}

void check_batch_against_single_launches(StateType st, GradType gt) {
  const std::size_t ss = state_bytes(st, 1), gs = grad_type_size(gt);
  // Sizes with tails (n % 8), one under a vector, unaligned spans, spans without a weight (the
  // batch's weight-or-not changes), and a third scalar set in the middle (a batch holds two).
  struct Shape {
    std::size_t n, shift;
    bool weight;
    int scalars;
  };
  std::vector<Shape> shapes;
  for (int i = 0; i < 45; ++i) {
    const std::size_t n = i % 9 == 4 ? 5 : 1000 + 611 * static_cast<std::size_t>(i) + (i % 3 == 1 ? i % 8 : 0);
    shapes.push_back({n, i % 11 == 7 ? 1u : 0u, i % 13 != 5, i == 20 ? 2 : i % 2});
  }
  AdamWHyper h;
  h.weight_extrapolation = 0.5;
  const StepScalars ks[3] = {make_step_scalars(h, 1e-2, 7, true, 0.8), make_step_scalars(h, 1e-2, 7, false, 0.8),
                             make_step_scalars(h, 3e-3, 7, true, 1.0)};
  DeviceMem dev;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<SpanBufs> spans(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    SpanBufs& b = spans[i];
    b.n = shapes[i].n;
    b.shift = shapes[i].shift;
    b.weight = shapes[i].weight;
    b.scalars = shapes[i].scalars;
    const std::size_t es[4] = {4, ss, ss, gs};
    for (int a = 0; a < 4; ++a) {
      b.in[a].resize(b.n * es[a]);
      for (std::size_t e = 0; e < b.n; ++e) {
        float x = nd(rng);
        if (a == 1) x *= 0.1f;
        if (a == 2) x = 0.01f * x * x;
        if (a == 3) x *= 0.05f;
        if (es[a] == 4) {
          std::memcpy(&b.in[a][e * 4], &x, 4);
        } else {
          const std::uint16_t bits = float_to_bf16_bits(x);
          std::memcpy(&b.in[a][e * 2], &bits, 2);
        }
      }
    }
    b.span.grad_type = gt;
    b.span.state = st;
    b.span.n = b.n;
    b.span.key = round_key("span" + std::to_string(i));
    b.span.first = 64 * i;
  }
  // Upload every span's inputs (and zero its weight); returns the pointers in b.span.
  auto reset = [&] {
    for (SpanBufs& b : spans) {
      const std::size_t es[5] = {4, ss, ss, gs, 2};
      void* p[5];
      for (int a = 0; a < 5; ++a) {
        if (b.base[a] == nullptr) b.base[a] = dev.alloc((b.n + 1) * es[a]);
        p[a] = static_cast<unsigned char*>(b.base[a]) + b.shift * es[a];
        if (a < 4) dev.upload(p[a], b.in[a].data(), b.in[a].size());
      }
      ASSERT_EQ(cudaMemset(p[4], 0, b.n * 2), cudaSuccess);
      b.span.master = static_cast<float*>(p[0]);
      b.span.m = p[1];
      b.span.v = p[2];
      b.span.grad = p[3];
      b.span.weight = b.weight ? static_cast<bf16*>(p[4]) : nullptr;
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  auto result = [&] {
    std::vector<std::vector<unsigned char>> out;
    for (const SpanBufs& b : spans) {
      out.push_back(bytes_back(dev, b.span.master, b.n * 4));
      out.push_back(bytes_back(dev, b.span.m, b.n * ss));
      out.push_back(bytes_back(dev, b.span.v, b.n * ss));
      if (b.weight) out.push_back(bytes_back(dev, b.span.weight, b.n * 2));
    }
    return out;
  };
  reset();
  for (const SpanBufs& b : spans) adamw_gpu(b.span, ks[b.scalars], nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want = result();
  ASSERT_NE(want[0], spans[0].in[0]) << "the update changed nothing: the comparison would be vacuous";
  for (const int max_spans : {kAdamWBatchSpans, 3}) {
    SCOPED_TRACE("max_spans " + std::to_string(max_spans));
    reset();
    AdamWBatch batch(nullptr, max_spans);
    for (const SpanBufs& b : spans) batch.add(b.span, ks[b.scalars]);
    batch.flush();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = result();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "array " << i << " differs";
    // Batching happened: fewer launches than spans (the per-span run launched one or two each).
    if (max_spans == kAdamWBatchSpans) EXPECT_LT(batch.launches(), spans.size()) << "every span launched on its own";
  }
  for (SpanBufs& b : spans) {
    for (void* p : b.base) dev.release(p);
  }
}

TEST(AdamWBatchKernel, EqualsOneLaunchPerSpanByteForByte) {
  GHT_REQUIRE_GPU();
  for (const StateType st : {StateType::fp32, StateType::bf16}) {
    for (const GradType gt : {GradType::bf16, GradType::fp32}) {
      SCOPED_TRACE(std::string("state ") + to_string(st) + ", grad " + (gt == GradType::bf16 ? "bf16" : "fp32"));
      check_batch_against_single_launches(st, gt);
    }
  }
}

TEST(DeviceSumsqBatch, EqualsOneLaunchPerBuffer) {
  GHT_REQUIRE_GPU();
  // 70 buffers (more than one batch), fp32 and bf16 in runs (each change of type launches).
  DeviceMem dev;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  struct Buf {
    void* base;
    void* p;
    GradType t;
    std::size_t n;
  };
  std::vector<Buf> bufs;
  for (int i = 0; i < 70; ++i) {
    const GradType t = (i / 10) % 2 == 0 ? GradType::fp32 : GradType::bf16;
    const std::size_t n = 17 + 4099 * static_cast<std::size_t>(i % 7) + static_cast<std::size_t>(i);
    std::vector<unsigned char> host(n * grad_type_size(t));
    for (std::size_t e = 0; e < n; ++e) {
      const float x = nd(rng);
      if (t == GradType::fp32) {
        std::memcpy(&host[e * 4], &x, 4);
      } else {
        const std::uint16_t b = float_to_bf16_bits(x);
        std::memcpy(&host[e * 2], &b, 2);
      }
    }
    void* p = dev.alloc(host.size() + 16);
    void* q = static_cast<unsigned char*>(p) + (i % 5 == 3 ? grad_type_size(t) : 0);  // some unaligned
    dev.upload(q, host.data(), host.size());
    bufs.push_back({p, q, t, n});
  }
  const auto a = alloc::make_default_tiered_allocator();
  DeviceSumsq s(*a, nullptr);
  s.reset(nullptr);
  for (const Buf& b : bufs) s.add(b.p, b.t, b.n, nullptr);
  const double batched = s.finish(nullptr);
  s.reset(nullptr);
  for (const Buf& b : bufs) {
    s.add(b.p, b.t, b.n, nullptr);
    s.flush();  // one launch per buffer, as before batching
  }
  const double one_by_one = s.finish(nullptr);
  EXPECT_GT(batched, 0.0);
  EXPECT_EQ(std::memcmp(&batched, &one_by_one, sizeof(double)), 0) << batched << " vs " << one_by_one;
  for (const Buf& b : bufs) dev.release(b.base);
}

TEST(AdamWBatchSpans, UpdateAllGivesTheSameBytesAtEveryBatchSize) {
  GHT_REQUIRE_GPU();
  std::vector<std::size_t> sizes;
  for (int r = 0; r < 40; ++r) sizes.push_back(3000 + 977 * static_cast<std::size_t>(r % 9) + static_cast<std::size_t>(r % 8));
  for (const StateType st : {StateType::fp32, StateType::bf16}) {
    struct PathCase {
      const char* name;
      PathChoice path;
      bool hbm;
    };
    for (const PathCase& c : {PathCase{"device", PathChoice::device, true},
                              PathCase{"gpu_link zero_copy", PathChoice::gpu_link, false}}) {
      for (const float scale : {1.0f, 1000.0f}) {  // unclipped, clipped
        SCOPED_TRACE(std::string(c.name) + " " + to_string(st) + (scale > 1 ? " clipped" : " unclipped"));
        test::RunBytes runs[2];
        const int batch[2] = {1, kAdamWBatchSpans};
        for (int i = 0; i < 2; ++i) {
          DeviceMem dev;
          AdamWOptions o = test::options(c.path, 2048, 0, LinkMode::zero_copy);  // several chunks per region
          o.state_type = st;
          o.batch_spans = batch[i];
          runs[i] = test::run_bf16_state(o, dev, dev, c.hbm ? test::hbm_state() : test::host_state(), sizes, 3, scale);
        }
        ASSERT_NE(runs[0].m[0][0], 0.0f) << "the update changed nothing: the comparison would be vacuous";
        EXPECT_TRUE(test::same_bytes(runs[1], runs[0]));
      }
    }
  }
}

// update_all(launched) reports a region only once every chunk of it is queued: a consumer that
// waits for region_event(r) from inside the callback (what the CUDA trainer's next forward does,
// on another thread) reads the region's final state, also where the batch is flushed in the
// middle of a region (batches of 2 spans, regions of 5 chunks). Reported early, the copy below
// would run before the region's later chunks were even launched.
TEST(AdamWBatchSpans, LaunchedReportsARegionOnlyOnceAllItsChunksAreQueued) {
  GHT_REQUIRE_GPU();
  DeviceMem dev;
  constexpr std::size_t kChunk = 2048, kN = 5 * kChunk - 100;
  constexpr int kRegions = 4;
  std::vector<void*> grads;
  std::vector<Region> regions;
  for (int r = 0; r < kRegions; ++r) {
    std::vector<float> g(kN, 0.25f + 0.01f * static_cast<float>(r));
    grads.push_back(dev.alloc(kN * sizeof(float)));
    dev.upload(grads.back(), g.data(), kN * sizeof(float));
    regions.push_back(Region{"r" + std::to_string(r), kN, true, nullptr, grads.back(), GradType::fp32});
  }
  AdamWOptions o = test::options(PathChoice::device, kChunk);
  o.batch_spans = 2;
  AdamW opt(regions, o, test::hbm_state());
  const std::vector<float> zeros(kN, 0.0f);
  for (int r = 0; r < kRegions; ++r) opt.load_state(static_cast<std::size_t>(r), zeros.data(), zeros.data(), zeros.data());
  cudaStream_t probe = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::vector<float>> seen(kRegions, std::vector<float>(kN)), done(kRegions, std::vector<float>(kN));
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(opt.begin_step(1e-2).taken);
    std::vector<std::size_t> order;
    opt.update_all([&](std::size_t r) {
      order.push_back(r);
      GHT_CUDA_TRY(cudaStreamWaitEvent(probe, opt.region_event(r), 0));
      GHT_CUDA_TRY(cudaMemcpyAsync(seen[r].data(), opt.state(r, TensorClass::master).device, kN * sizeof(float),
                                   cudaMemcpyDeviceToHost, probe));
    });
    GHT_CUDA_TRY(cudaStreamSynchronize(probe));
    opt.synchronize();
    EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3})) << "step " << step;
    for (int r = 0; r < kRegions; ++r) {
      dev.download(done[r].data(), opt.state(r, TensorClass::master).device, kN * sizeof(float));
      EXPECT_EQ(std::memcmp(seen[r].data(), done[r].data(), kN * sizeof(float)), 0)
          << "step " << step << ", region " << r << ": read before its last chunks were queued";
    }
  }
  ASSERT_NE(done[0][kN - 1], 0.0f);  // master moved (loaded as 0, updated twice): not vacuous
  (void)cudaStreamDestroy(probe);
  for (void* g : grads) dev.release(g);
}

}  // namespace
}  // namespace ght::optimizer
