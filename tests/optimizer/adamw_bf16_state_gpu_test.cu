// bf16 m and v on the GPU: adamw_gpu against adamw_cpu bit for bit (vector and scalar kernels,
// bf16 and fp32 gradients, a span starting inside its region), and every GPU path of AdamW
// (device, gpu_link zero_copy and dma, in several chunks) against the cpu path, byte for byte,
// unclipped and clipped. Skips without a GPU; with one, every comparison checks state that
// changed. Speculation with bf16 state: adamw_speculation_test.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <utility>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16_state_util.hpp"
#include "optimizer/gpu_mem.hpp"

namespace ght::optimizer {
namespace {

using test::DeviceMem;

TEST(Bf16StateGpu, KernelEqualsTheHostKernelBitForBit) {
  GHT_REQUIRE_GPU();
  for (const std::size_t n : {std::size_t{5001}, (std::size_t{1} << 20) + 3}) {
    // x: the weight extrapolation (the delayed update's prediction), 0 = the plain bf16 weight
    for (const auto& [t, x] : std::initializer_list<std::pair<GradType, double>>{
             {GradType::bf16, 0.0}, {GradType::fp32, 0.0}, {GradType::bf16, 2.0}, {GradType::fp32, 0.5}}) {
      const test::Bf16StateInputs in = test::random_bf16_state(n, t, 21);
      AdamWHyper hyper;
      hyper.weight_extrapolation = x;
      const StepScalars k = make_step_scalars(hyper, 1e-2, 9, true, 0.7);
      const std::uint64_t key = round_key("layer5.expert2"), first = 1000003;
      // Host result.
      test::Bf16StateInputs h = in;
      std::vector<bf16> hw(n);
      AdamWSpan hs{h.p.data(), h.m.data(), h.v.data(), h.g.data(), t, hw.data(), n};
      hs.state = StateType::bf16;
      hs.key = key;
      hs.first = first;
      adamw_cpu(hs, k, 2);
      ASSERT_NE(h.v, in.v) << "the host update changed nothing: the comparison would be vacuous";
      const std::size_t gs = grad_type_size(t);
      for (const std::size_t shift : {0u, 1u}) {  // 1 element breaks 16-byte alignment: scalar kernel
        SCOPED_TRACE("n " + std::to_string(n) + " grad " + (t == GradType::bf16 ? "bf16" : "fp32") + " shift " +
                     std::to_string(shift) + " extrapolation " + std::to_string(x));
        DeviceMem dev;
        auto* dp = static_cast<float*>(dev.alloc((n + 1) * 4)) + shift;
        auto* dm = static_cast<std::uint16_t*>(dev.alloc((n + 1) * 2)) + shift;
        auto* dv = static_cast<std::uint16_t*>(dev.alloc((n + 1) * 2)) + shift;
        auto* dg = static_cast<unsigned char*>(dev.alloc((n + 1) * gs)) + shift * gs;
        auto* dw = static_cast<bf16*>(dev.alloc((n + 1) * 2)) + shift;
        dev.upload(dp, in.p.data(), n * 4);
        dev.upload(dm, in.m.data(), n * 2);
        dev.upload(dv, in.v.data(), n * 2);
        dev.upload(dg, in.g.data(), n * gs);
        AdamWSpan ds{dp, dm, dv, dg, t, dw, n};
        ds.state = StateType::bf16;
        ds.key = key;
        ds.first = first;
        adamw_gpu(ds, k, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> rp(n);
        std::vector<std::uint16_t> rm(n), rv(n), rw(n);
        dev.download(rp.data(), dp, n * 4);
        dev.download(rm.data(), dm, n * 2);
        dev.download(rv.data(), dv, n * 2);
        dev.download(rw.data(), dw, n * 2);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const bool ok = std::memcmp(&rp[i], &h.p[i], 4) == 0 && rm[i] == h.m[i] && rv[i] == h.v[i] &&
                          rw[i] == hw[i].bits;
          if (!ok && bad++ < 5) {
            ADD_FAILURE() << "[" << i << "] p " << rp[i] << "/" << h.p[i] << " m " << rm[i] << "/" << h.m[i] << " v "
                          << rv[i] << "/" << h.v[i] << " w " << rw[i] << "/" << hw[i].bits;
          }
        }
        EXPECT_EQ(bad, 0u) << "elements where the GPU differs from adamw_cpu";
        dev.release(dp - shift);
        dev.release(dm - shift);
        dev.release(dv - shift);
        dev.release(dg - shift * gs);
        dev.release(dw - shift);
      }
    }
  }
}

TEST(Bf16StateGpu, EveryGpuPathEqualsTheCpuPathByteForByte) {
  GHT_REQUIRE_GPU();
  const std::vector<std::size_t> sizes = {5000, 70001, 3};
  for (const float scale : {1.0f, 1000.0f}) {  // unclipped, clipped
    test::Mem host;
    AdamWOptions cpu;
    cpu.path = PathChoice::cpu;
    const test::RunBytes want = test::run_bf16_state(cpu, host, host, test::host_state(), sizes, 4, scale);
    struct GpuCase {
      const char* name;
      PathChoice path;
      LinkMode mode;
      bool hbm;
    };
    for (const GpuCase& c : {GpuCase{"device", PathChoice::device, LinkMode::zero_copy, true},
                             GpuCase{"gpu_link zero_copy", PathChoice::gpu_link, LinkMode::zero_copy, false},
                             GpuCase{"gpu_link dma", PathChoice::gpu_link, LinkMode::dma, false}}) {
      SCOPED_TRACE(std::string(c.name) + (scale > 1 ? " clipped" : " unclipped"));
      DeviceMem dev;
      // 1024-parameter chunks: most of each region is updated by spans that start inside it.
      const AdamWOptions o = test::options(c.path, 1024, 0, c.mode);
      const test::RunBytes got =
          test::run_bf16_state(o, dev, dev, c.hbm ? test::hbm_state() : test::host_state(), sizes, 4, scale);
      EXPECT_TRUE(test::same_bytes(got, want));
    }
  }
}

}  // namespace
}  // namespace ght::optimizer
