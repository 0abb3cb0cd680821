// GPU paths of the optimizer (gpu_link, device, cpu with device gradients and weights) against
// the fp64 reference, the non-finite guard on each, the bf16 conversion against the hardware,
// the device sum of squares and the staged gradient pipeline. Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu.hpp"
#include "optimizer/accumulate.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16.hpp"
#include "optimizer/gpu_mem.hpp"
#include "tier/cuda_check.hpp"

namespace ght::optimizer {
namespace {

using test::Case;

using test::DeviceMem;
using test::options;
using test::PinnedMem;

// ---- bf16 ----------------------------------------------------------------------------------

__global__ void bf16_compare_kernel(unsigned long long* mismatches, unsigned* first) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long u = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       u < (1ull << 32); u += stride) {
    const float x = __uint_as_float(static_cast<unsigned>(u));
    const unsigned short hw = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    if (hw != float_to_bf16_bits(x)) {
      if (atomicAdd(mismatches, 1ull) == 0) *first = static_cast<unsigned>(u);
    }
  }
}

TEST(OptimizerGpu, PortableBf16EqualsHardwareConversionForAllFloats) {
  GHT_REQUIRE_GPU();
  unsigned long long* mism = nullptr;
  unsigned* first = nullptr;
  ASSERT_EQ(cudaMallocManaged(&mism, sizeof *mism), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&first, sizeof *first), cudaSuccess);
  *mism = 0;
  *first = 0;
  bf16_compare_kernel<<<4096, 256>>>(mism, first);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(*mism, 0ull) << "first mismatch at bits 0x" << std::hex << *first;
  (void)cudaFree(mism);
  (void)cudaFree(first);
}

// ---- reference comparisons per path --------------------------------------------------------

struct GpuCase {
  GradType grad_type;
  Case::Clip clip;
};

class OptimizerGpuReference : public ::testing::TestWithParam<GpuCase> {
 protected:
  // The reference case with this instance's gradient type and clipping.
  static Case param_case() {
    Case c;
    c.grad_type = GetParam().grad_type;
    c.clip = GetParam().clip;
    return c;
  }
};

TEST_P(OptimizerGpuReference, GpuLinkWithDeviceGradients) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  // Small chunks: several launches and events per region, odd tails.
  test::run_reference_case(c, dev, dev, options(PathChoice::gpu_link, 1000),
                           test::host_state(), Path::gpu_link);
}

TEST_P(OptimizerGpuReference, GpuLinkDmaMode) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  // 960-parameter chunks: the three HBM slots rotate many times per region and across regions.
  test::run_reference_case(c, dev, dev, options(PathChoice::gpu_link, 1000, 0, LinkMode::dma),
                           test::host_state(), Path::gpu_link);
}

TEST_P(OptimizerGpuReference, GpuLinkDmaModeWithPartOfTheStateInHbm) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  // Only the host arrays cross the link; the HBM ones are updated in place, chunk by chunk.
  for (const auto& [master, moments] : {std::pair{TierKind::hbm, TierKind::host}, std::pair{TierKind::host, TierKind::hbm}}) {
    SCOPED_TRACE("master on " + std::string(to_string(master)) + ", m and v on " + std::string(to_string(moments)));
    test::run_reference_case(c, dev, dev, options(PathChoice::gpu_link, 1000, 0, LinkMode::dma),
                             test::split_state(master, moments), Path::gpu_link);
  }
}

TEST_P(OptimizerGpuReference, DeviceAndGpuLinkRegionsSideBySide) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  // region1's state in HBM (the device path: on its own stream and its share of the SMs side by
  // side, GHT_OPT_SIDE_BY_SIDE, or on the gpu_link kernels' stream), the others' on the host.
  for (const auto& [mode, side_by_side] : {std::pair{LinkMode::dma, true}, std::pair{LinkMode::zero_copy, true},
                                            std::pair{LinkMode::dma, false}}) {
    SCOPED_TRACE(std::string(to_string(mode)) + (side_by_side ? ", side by side" : ", one stream"));
    std::shared_ptr<alloc::tiered_allocator> state = alloc::make_default_tiered_allocator();
    state->set_placement([](std::string_view name, TensorClass cls) -> std::optional<TierKind> {
      if (cls != TensorClass::master && cls != TensorClass::adam_m && cls != TensorClass::adam_v) return std::nullopt;
      return name == "region1" ? TierKind::hbm : TierKind::host;
    });
    AdamWOptions o = options(PathChoice::automatic, 1000, 0, mode);
    o.side_by_side = side_by_side;
    test::run_reference_case(c, dev, dev, o, state, {Path::gpu_link, Path::device, Path::gpu_link});
  }
}

TEST_P(OptimizerGpuReference, GpuLinkWithPinnedHostGradients) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  PinnedMem pinned;
  DeviceMem dev;
  test::run_reference_case(c, pinned, dev, options(PathChoice::automatic),
                           test::host_state(), Path::gpu_link);
}

TEST_P(OptimizerGpuReference, DevicePath) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  test::run_reference_case(c, dev, dev, options(PathChoice::device), nullptr, Path::device);
}

TEST_P(OptimizerGpuReference, AutoPicksDeviceForHbmState) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  c.steps = 3;
  DeviceMem dev;
  test::run_reference_case(c, dev, dev, options(PathChoice::automatic),
                           test::hbm_state(), Path::device);
}

TEST_P(OptimizerGpuReference, CpuPathWithDeviceGradientsAndWeights) {
  GHT_REQUIRE_GPU();
  Case c = param_case();
  DeviceMem dev;
  // 4 KiB staging slots: many double-buffered chunks down (grads) and up (weights).
  test::run_reference_case(c, dev, dev, options(PathChoice::cpu, 0, 4096),
                           test::host_state(), Path::cpu);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OptimizerGpuReference,
    ::testing::Values(GpuCase{GradType::bf16, Case::Clip::inactive},
                      GpuCase{GradType::bf16, Case::Clip::active},
                      GpuCase{GradType::fp32, Case::Clip::inactive},
                      GpuCase{GradType::fp32, Case::Clip::active}),
    [](const auto& info) {
      return std::string(info.param.grad_type == GradType::bf16 ? "bf16_" : "fp32_") +
             (info.param.clip == Case::Clip::active ? "clip_active" : "clip_inactive");
    });

// The delayed update's weight prediction (AdamWHyper::weight_extrapolation) on every GPU path:
// the weights are bf16(p + x·(p − p_before)) of the master each path computes.
TEST(OptimizerGpu, WeightExtrapolationOnEveryPath) {
  GHT_REQUIRE_GPU();
  Case c;
  c.steps = 3;
  c.hyper.weight_extrapolation = 2;
  DeviceMem dev;
  test::run_reference_case(c, dev, dev, options(PathChoice::gpu_link, 1000), test::host_state(), Path::gpu_link);
  test::run_reference_case(c, dev, dev, options(PathChoice::gpu_link, 1000, 0, LinkMode::dma), test::host_state(),
                           Path::gpu_link);
  test::run_reference_case(c, dev, dev, options(PathChoice::device), nullptr, Path::device);
  test::run_reference_case(c, dev, dev, options(PathChoice::cpu, 0, 4096), test::host_state(), Path::cpu);
}

TEST(OptimizerGpu, NonFiniteGuardOnEveryPath) {
  GHT_REQUIRE_GPU();
  for (GradType t : {GradType::bf16, GradType::fp32}) {
    Case c;
    c.grad_type = t;
    DeviceMem dev;
    PinnedMem pinned;
    SCOPED_TRACE(t == GradType::bf16 ? "bf16" : "fp32");
    test::run_nonfinite_case(c, dev, dev, options(PathChoice::gpu_link, 1000),
                             test::host_state(), Path::gpu_link);
    test::run_nonfinite_case(c, pinned, dev, options(PathChoice::gpu_link),
                             test::host_state(), Path::gpu_link);
    test::run_nonfinite_case(c, dev, dev, options(PathChoice::gpu_link, 1000, 0, LinkMode::dma),
                             test::host_state(), Path::gpu_link);
    test::run_nonfinite_case(c, dev, dev, options(PathChoice::device), nullptr, Path::device);
    test::run_nonfinite_case(c, dev, dev, options(PathChoice::cpu, 0, 4096),
                             test::host_state(), Path::cpu);
  }
}

TEST(OptimizerGpu, ChunkEventsCompleteAfterTheStep) {
  GHT_REQUIRE_GPU();
  DeviceMem dev;
  const std::size_t n = 10000;
  void* g = dev.alloc(n * 2);
  void* w = dev.alloc(n * 2);
  std::vector<std::uint16_t> gh(n, float_to_bf16_bits(0.01f));
  dev.upload(g, gh.data(), n * 2);
  for (LinkMode mode : {LinkMode::zero_copy, LinkMode::dma}) {
    AdamW opt({Region{"r", n, true, w, g, GradType::bf16}},
              options(PathChoice::gpu_link, 1000, 0, mode));
    EXPECT_EQ(opt.link_mode(0), mode);
    ASSERT_EQ(opt.num_chunks(0), (n + 959) / 960);  // chunks round down to 64 parameters
    ASSERT_TRUE(opt.step(1e-3).taken);
    ASSERT_EQ(cudaEventSynchronize(opt.region_event(0)), cudaSuccess);
    for (std::size_t c = 0; c < opt.num_chunks(0); ++c) {
      EXPECT_EQ(cudaEventQuery(opt.chunk_event(0, c)), cudaSuccess) << "chunk " << c;
    }
  }
  dev.release(g);
  dev.release(w);
}

// ---- kernels -------------------------------------------------------------------------------

TEST(OptimizerGpu, UnalignedBuffersUseTheScalarKernelWithTheSameResult) {
  GHT_REQUIRE_GPU();
  const std::size_t n = 5001;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> p(n), m(n), v(n);
  std::vector<std::uint16_t> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = nd(rng);
    m[i] = 0.1f * nd(rng);
    v[i] = 0.01f * std::abs(nd(rng));
    g[i] = float_to_bf16_bits(nd(rng));
  }
  const StepScalars k = make_step_scalars(AdamWHyper{}, 1e-2, 5, true, 0.8);
  // Host reference (same fp32 formula; the GPU may contract to FMA, hence a tolerance).
  auto hp = p, hm = m, hv = v;
  std::vector<bf16> hw(n);
  adamw_cpu({hp.data(), hm.data(), hv.data(), g.data(), GradType::bf16, hw.data(), n}, k, 1);
  for (std::size_t shift : {0u, 1u}) {  // 1 element = 4 bytes (2 for bf16): breaks alignment
    DeviceMem dev;
    auto* dp = static_cast<float*>(dev.alloc((n + 1) * 4)) + shift;
    auto* dm = static_cast<float*>(dev.alloc((n + 1) * 4)) + shift;
    auto* dv = static_cast<float*>(dev.alloc((n + 1) * 4)) + shift;
    auto* dg = static_cast<std::uint16_t*>(dev.alloc((n + 1) * 2)) + shift;
    auto* dw = static_cast<bf16*>(dev.alloc((n + 1) * 2)) + shift;
    dev.upload(dp, p.data(), n * 4);
    dev.upload(dm, m.data(), n * 4);
    dev.upload(dv, v.data(), n * 4);
    dev.upload(dg, g.data(), n * 2);
    adamw_gpu({dp, dm, dv, dg, GradType::bf16, dw, n}, k, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> rp(n), rm(n), rv(n);
    std::vector<std::uint16_t> rw(n);
    dev.download(rp.data(), dp, n * 4);
    dev.download(rm.data(), dm, n * 4);
    dev.download(rv.data(), dv, n * 4);
    dev.download(rw.data(), dw, n * 2);
    std::vector<double> ep(hp.begin(), hp.end()), em(hm.begin(), hm.end()), ev(hv.begin(), hv.end());
    EXPECT_TRUE(test::all_close("master shift " + std::to_string(shift), rp, ep, 1e-6, 1e-7));
    EXPECT_TRUE(test::all_close("m shift " + std::to_string(shift), rm, em, 1e-6, 1e-8));
    EXPECT_TRUE(test::all_close("v shift " + std::to_string(shift), rv, ev, 1e-6, 1e-12));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(rw[i], float_to_bf16_bits(rp[i])) << i;
    dev.release(dp - shift);
    dev.release(dm - shift);
    dev.release(dv - shift);
    dev.release(dg - shift);
    dev.release(dw - shift);
  }
}

TEST(OptimizerGpu, DeviceSumOfSquaresIsDeterministicAndAccurate) {
  GHT_REQUIRE_GPU();
  const std::size_t n = (1u << 22) + 77;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> g(n);
  long double exact = 0;
  for (auto& x : g) {
    x = nd(rng);
    exact += static_cast<long double>(x) * x;
  }
  DeviceMem dev;
  void* dg = dev.alloc(n * 4);
  dev.upload(dg, g.data(), n * 4);
  const auto a = alloc::make_default_tiered_allocator();
  DeviceSumsq s(*a, nullptr);
  double r[2];
  for (double& out : r) {
    s.reset(nullptr);
    s.add(dg, GradType::fp32, n / 3, nullptr);  // several buffers accumulate
    s.add(static_cast<float*>(dg) + n / 3, GradType::fp32, n - n / 3, nullptr);
    out = s.finish(nullptr);
  }
  EXPECT_EQ(std::memcmp(&r[0], &r[1], sizeof(double)), 0) << "not deterministic";
  EXPECT_NEAR(r[0], static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dev.upload(static_cast<float*>(dg) + 12345, &nan, 4);
  s.reset(nullptr);
  s.add(dg, GradType::fp32, n, nullptr);
  EXPECT_TRUE(std::isnan(s.finish(nullptr)));
  dev.release(dg);
}

// ---- staged accumulator pipeline -----------------------------------------------------------

TEST(OptimizerGpu, GradStreamPipelineFromDeviceIsBitExact) {
  GHT_REQUIRE_GPU();
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  GradStreamAccumulator::Options o;
  o.staging_bytes = 1000;
  o.threads = 2;
  GradStreamAccumulator acc(o);
  cudaStream_t producer = nullptr;
  ASSERT_EQ(cudaStreamCreate(&producer), cudaSuccess);
  DeviceMem dev;
  for (GradType t : {GradType::bf16, GradType::fp32}) {
    for (std::size_t n : {1ul, 239ul, 241ul, 10007ul, 1000003ul}) {
      const std::size_t es = grad_type_size(t);
      std::vector<float> ref(n);
      std::vector<float> dst(n, 99.0f);
      void* d = dev.alloc(n * es);
      for (int k = 0; k < 3; ++k) {
        std::vector<unsigned char> raw(n * es);
        for (std::size_t i = 0; i < n; ++i) {
          const float x = nd(rng);
          float widened = x;
          if (t == GradType::bf16) {
            const std::uint16_t b = float_to_bf16_bits(x);
            std::memcpy(raw.data() + 2 * i, &b, 2);
            widened = bf16_bits_to_float(b);
          } else {
            std::memcpy(raw.data() + 4 * i, &x, 4);
          }
          ref[i] = k == 0 ? widened : ref[i] + widened;
        }
        // Produce on another stream, asynchronously, as backward would.
        ASSERT_EQ(cudaMemcpyAsync(d, raw.data(), raw.size(), cudaMemcpyHostToDevice, producer),
                  cudaSuccess);
        acc.run(dst.data(), d, t, n, k == 0 ? AccumulateMode::assign : AccumulateMode::add,
                producer);
      }
      EXPECT_EQ(std::memcmp(dst.data(), ref.data(), n * 4), 0) << "n=" << n;
      dev.release(d);
    }
  }
  (void)cudaStreamDestroy(producer);
}

}  // namespace
}  // namespace ght::optimizer
