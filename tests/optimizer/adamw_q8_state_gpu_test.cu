// q8 m and v on the GPU: adamw_gpu against adamw_cpu bit for bit (the vector kernel and the
// scalar one, bf16 and fp32 gradients, with and without weight extrapolation, a partial last
// block), and every GPU path of AdamW (device, gpu_link zero_copy and dma, in several chunks)
// against the cpu path, byte for byte, unclipped and clipped. Skips without a GPU; with one,
// every comparison checks state that changed. Speculation with q8 state: adamw_speculation_test.cu;
// the split: adamw_split_test.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16_state_util.hpp"
#include "optimizer/gpu_mem.hpp"
#include "optimizer/q8_state_util.hpp"

namespace ght::optimizer {
namespace {

using test::DeviceMem;

TEST(Q8StateGpu, KernelEqualsTheHostKernelBitForBit) {
  GHT_REQUIRE_GPU();
  for (const std::size_t n : {std::size_t{256 * 20 + 77}, (std::size_t{1} << 20) + 3}) {
    for (const auto& [t, x] : std::initializer_list<std::pair<GradType, double>>{
             {GradType::bf16, 0.0}, {GradType::fp32, 0.0}, {GradType::bf16, 2.0}, {GradType::fp32, 0.5}}) {
      const test::Q8StateInputs in = test::random_q8_state(n, t, 21);
      AdamWHyper hyper;
      hyper.weight_extrapolation = x;
      const StepScalars k = make_step_scalars(hyper, 1e-2, 9, true, 0.7);
      test::Q8StateInputs h = in;
      std::vector<bf16> hw(n);
      adamw_cpu(test::q8_span(h, hw.data()), k, 2);
      ASSERT_NE(h.v, in.v) << "the host update changed nothing: the comparison would be vacuous";
      const std::size_t gs = grad_type_size(t), qb = state_bytes(StateType::q8, n);
      // shift 1 element of master, gradient and weight breaks their 16-byte alignment: the
      // scalar loads (the records stay 4-byte aligned, as the optimizer keeps them).
      for (const std::size_t shift : {0u, 1u}) {
        SCOPED_TRACE("n " + std::to_string(n) + " grad " + (t == GradType::bf16 ? "bf16" : "fp32") + " shift " +
                     std::to_string(shift) + " extrapolation " + std::to_string(x));
        DeviceMem dev;
        auto* dp = static_cast<float*>(dev.alloc((n + 1) * 4)) + shift;
        auto* dm = static_cast<std::uint8_t*>(dev.alloc(qb + 4)) + 4 * shift;
        auto* dv = static_cast<std::uint8_t*>(dev.alloc(qb + 4)) + 4 * shift;
        auto* dg = static_cast<unsigned char*>(dev.alloc((n + 1) * gs)) + shift * gs;
        auto* dw = static_cast<bf16*>(dev.alloc((n + 1) * 2)) + shift;
        dev.upload(dp, in.p.data(), n * 4);
        dev.upload(dm, in.m.data(), qb);
        dev.upload(dv, in.v.data(), qb);
        dev.upload(dg, in.g.data(), n * gs);
        AdamWSpan ds{dp, dm, dv, dg, t, dw, n};
        ds.state = StateType::q8;
        adamw_gpu(ds, k, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> rp(n);
        std::vector<std::uint8_t> rm(qb), rv(qb);
        std::vector<std::uint16_t> rw(n);
        dev.download(rp.data(), dp, n * 4);
        dev.download(rm.data(), dm, qb);
        dev.download(rv.data(), dv, qb);
        dev.download(rw.data(), dw, n * 2);
        EXPECT_EQ(0, std::memcmp(rp.data(), h.p.data(), n * 4)) << "master";
        EXPECT_EQ(rm, h.m) << "m records (codes and scales)";
        EXPECT_EQ(rv, h.v) << "v records (codes and scales)";
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) bad += rw[i] != hw[i].bits;
        EXPECT_EQ(bad, 0u) << "bf16 weights where the GPU differs from adamw_cpu";
        dev.release(dp - shift);
        dev.release(dm - 4 * shift);
        dev.release(dv - 4 * shift);
        dev.release(dg - shift * gs);
        dev.release(dw - shift);
      }
    }
  }
}

TEST(Q8StateGpu, EveryGpuPathEqualsTheCpuPathByteForByte) {
  GHT_REQUIRE_GPU();
  const std::vector<std::size_t> sizes = {5000, 70001, 3};
  for (const float scale : {1.0f, 1000.0f}) {  // unclipped, clipped
    test::Mem host;
    AdamWOptions cpu;
    cpu.path = PathChoice::cpu;
    cpu.state_type = StateType::q8;
    const test::RunBytes want = test::run_bf16_state(cpu, host, host, test::host_state(), sizes, 4, scale);
    struct GpuCase {
      const char* name;
      PathChoice path;
      LinkMode mode;
      TierKind master, moments;
    };
    constexpr TierKind kHbm = TierKind::hbm, kHost = TierKind::host;
    for (const GpuCase& c : {GpuCase{"device", PathChoice::device, LinkMode::zero_copy, kHbm, kHbm},
                             GpuCase{"gpu_link zero_copy", PathChoice::gpu_link, LinkMode::zero_copy, kHost, kHost},
                             GpuCase{"gpu_link dma", PathChoice::gpu_link, LinkMode::dma, kHost, kHost},
                             GpuCase{"gpu_link dma, m and v on the host", PathChoice::gpu_link, LinkMode::dma, kHbm, kHost},
                             GpuCase{"gpu_link dma, master on the host", PathChoice::gpu_link, LinkMode::dma, kHost, kHbm}}) {
      SCOPED_TRACE(std::string(c.name) + (scale > 1 ? " clipped" : " unclipped"));
      DeviceMem dev;
      // 1000-parameter chunks round down to 768 (whole 256-element blocks): most of each region
      // is updated by spans that start inside it.
      AdamWOptions o = test::options(c.path, 1000, 0, c.mode);
      o.state_type = StateType::q8;
      const test::RunBytes got =
          test::run_bf16_state(o, dev, dev, test::split_state(c.master, c.moments), sizes, 4, scale);
      EXPECT_TRUE(test::same_bytes(got, want));
    }
  }
}

}  // namespace
}  // namespace ght::optimizer
