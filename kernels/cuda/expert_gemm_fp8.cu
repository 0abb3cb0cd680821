// Block-scaled FP8 grouped GEMM of the experts (see expert_gemm_fp8.hpp): argument checks and the
// call into the CUTLASS instantiation (kernels/cuda/cutlass/grouped_fp8_blockwise.cu).
#include "kernels/cuda/expert_gemm_fp8.hpp"

#include <cstdint>
#include <string>

#include "kernels/cuda/cutlass/grouped_fp8.hpp"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/gemm.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

constexpr std::int64_t kScaleTile = 128;

// The reason FP8 GEMMs cannot run on `device` (empty when they can). Cached per device: the
// answer never changes within a process.
std::string device_reason(int device) {
  constexpr int kMaxDevices = 64;
  thread_local std::string cached[kMaxDevices];
  thread_local bool known[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && known[device]) return cached[device];
  cudaDeviceProp prop{};
  std::string why;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    why = "cannot read the properties of CUDA device " + std::to_string(device) + ": " +
          cudaGetErrorString(cudaGetLastError());
  } else if (prop.major != 9 || prop.minor != 0) {
    why = "CUDA device " + std::to_string(device) + " (" + prop.name + ") is sm_" + std::to_string(prop.major) +
          std::to_string(prop.minor) + "; the block-scaled FP8 GEMM is built for sm_90a (H100/H200) only";
  }
  if (device >= 0 && device < kMaxDevices) {
    cached[device] = why;
    known[device] = true;
  }
  return why;
}

std::string build_reason() {
#if defined(GHT_HAVE_CUTLASS)
  return {};
#else
  return "this build has no CUTLASS (CMake did not find it, so GHT_HAVE_CUTLASS is undefined and the "
         "sm_90a FP8 kernels were not compiled)";
#endif
}

}  // namespace

std::string fp8_gemm_unavailable_reason() {
  if (std::string why = build_reason(); !why.empty()) return why;
  int device = -1;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  }
  return device_reason(device);
}

bool fp8_gemm_available() noexcept {
  try {
    return fp8_gemm_unavailable_reason().empty();
  } catch (...) {
    return false;
  }
}

void grouped_gemm_fp8(const Fp8GroupedGemmVarM& args, const GroupOffsets& offsets, cudaStream_t stream) {
  if (const std::string why = fp8_gemm_unavailable_reason(); !why.empty()) GHT_FAIL("grouped_gemm_fp8: " + why);
  Fp8GroupedGemmVarM g = args;
  if (g.lda == 0) g.lda = g.k;
  if (g.ldb == 0) g.ldb = g.k;
  if (g.stride_b == 0) g.stride_b = g.n * g.ldb;
  if (g.ldc == 0) g.ldc = g.n;
  const std::int64_t k_tiles = detail::ceil_div(g.k, kScaleTile);
  const std::int64_t scales_per_group = detail::ceil_div(g.n, kScaleTile) * k_tiles;
  if (g.stride_b_scales == 0) g.stride_b_scales = scales_per_group;

  GHT_EXPECTS(offsets.groups >= 0 && offsets.device != nullptr, "grouped_gemm_fp8: needs the device offsets");
  GHT_EXPECTS(g.n > 0 && g.k > 0 && g.n < (std::int64_t{1} << 31) && g.k < (std::int64_t{1} << 31),
              "grouped_gemm_fp8: n and k must be in [1, 2^31)");
  GHT_EXPECTS(g.a && g.b && g.c && g.a_scales && g.b_scales, "grouped_gemm_fp8: null operand or scale pointer");
  GHT_EXPECTS(detail::aligned16(g.a, g.b, g.c),
              "grouped_gemm_fp8: A, B and C must be 16-byte aligned (TMA)");
  GHT_EXPECTS(g.k % 16 == 0 && g.lda % 16 == 0 && g.ldb % 16 == 0 && g.stride_b % 16 == 0,
              "grouped_gemm_fp8: k, lda, ldb and stride_b must be multiples of 16 (16-byte e4m3 rows); got k = " +
                  std::to_string(g.k) + ", lda = " + std::to_string(g.lda) + ", ldb = " + std::to_string(g.ldb) +
                  ", stride_b = " + std::to_string(g.stride_b));
  GHT_EXPECTS(g.n % 8 == 0 && g.ldc % 8 == 0,
              "grouped_gemm_fp8: n and ldc must be multiples of 8 (16-byte bf16 rows); got n = " +
                  std::to_string(g.n) + ", ldc = " + std::to_string(g.ldc));
  GHT_EXPECTS(g.lda >= g.k && g.ldb >= g.k && g.ldc >= g.n, "grouped_gemm_fp8: a leading dimension is too small");
  GHT_EXPECTS(offsets.groups <= 1 || (g.stride_b >= (g.n - 1) * g.ldb + g.k && g.stride_b_scales >= scales_per_group),
              "grouped_gemm_fp8: groups' weights or weight scales overlap");
  if (offsets.groups == 0) return;

  cutlass_grouped::Fp8Problem p;
  p.groups = offsets.groups;
  p.offsets = offsets.device;
  p.n = g.n;
  p.k = g.k;
  p.a = g.a;
  p.lda = g.lda;
  p.sa = g.a_scales;
  p.b = g.b;
  p.ldb = g.ldb;
  p.stride_b = g.stride_b;
  p.sb = g.b_scales;
  p.stride_sb = g.stride_b_scales;
  p.c = g.c;
  p.ldc = g.ldc;
  p.alpha = g.alpha;
  p.beta = g.beta;
  GHT_CUDA_TRY(cudaGetDevice(&p.device));
  p.sm_count = stream_sm_count(stream, p.device);  // gemm.hpp: fewer SMs, so others may run beside
#if defined(GHT_HAVE_CUTLASS)
  cutlass_grouped::var_m_bt_fp8_blockwise(p, stream);
#else
  (void)p;  // not reached: fp8_gemm_unavailable_reason() is non-empty without CUTLASS
  (void)stream;
#endif
}

}  // namespace ght::kernels::cuda
