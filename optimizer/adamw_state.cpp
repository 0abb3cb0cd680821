// AdamW's state precision: the bytes and offsets of fp32, bf16 and q8 state arrays, how each side
// reaches a state block, a chunk's span for the kernels, and state in and out as fp32 (bf16
// rounding, q8 quantization).
#include <cstdint>
#include <cstring>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

namespace detail {

// How each side reaches a state block: the GPU through HBM or a mapped / coherent host pointer
// (null where the link cannot reach it: pageable memory over PCIe), the CPU through host memory.
StateBuffer state_view(const alloc::unique_block& b, bool gpu) {
  StateBuffer v;
  v.tier = b.tier();
  if (v.tier == TierKind::hbm) {
    v.device = b.get();
    return v;
  }
  v.host = b.get();
  if (gpu) v.device = detail::device_address(b.get());
  return v;
}

}  // namespace detail

using detail::array_bytes;

std::size_t AdamW::Impl::bytes(int i, std::size_t n) const { return array_bytes(i, state_type, n); }

std::size_t AdamW::Impl::offset(int i, std::size_t first) const {
  GHT_EXPECTS(i == 0 || first % state_granule(state_type) == 0,
              "AdamW: a q8 state chunk starts inside a block (element " + std::to_string(first) + ")");
  return bytes(i, first);
}

AdamWSpan AdamW::Impl::span(const RegionState& rs, std::size_t off, std::size_t count, bool device) const {
  AdamWSpan s;
  const std::size_t gsize = grad_type_size(rs.desc.grad_type);
  auto f = [&](int i) {
    return static_cast<unsigned char*>(device ? rs.st[i].device : rs.st[i].host) + offset(i, off);
  };
  s.master = reinterpret_cast<float*>(f(0));
  s.m = f(1);
  s.v = f(2);
  s.state = state_type;
  s.key = rs.key;
  s.first = rs.desc.first + off;
  const void* g = device ? rs.grad_dev : rs.desc.grad;
  s.grad = static_cast<const unsigned char*>(g) + off * gsize;
  s.grad_type = rs.desc.grad_type;
  void* w = device ? rs.weight_dev : rs.desc.weight;
  s.weight = w != nullptr ? static_cast<bf16*>(w) + off : nullptr;
  s.n = count;
  return s;
}

// n fp32 values into state array i of rs: m and v in bf16 are rounded to nearest even, in q8
// quantized per block (both exact for values such a state held: saving widens or dequantizes
// them, so a round trip keeps every byte).
void AdamW::Impl::copy_in(const RegionState& rs, int i, const float* src) {
  if (src == nullptr) return;
  const std::size_t n = rs.desc.n;
  std::vector<unsigned char> narrowed;
  const void* data = src;
  if (i > 0 && state_type != StateType::fp32) {
    narrowed.resize(bytes(i, n));
    if (state_type == StateType::q8) {
      q8_quantize(src, n, narrowed.data(), i == 2);
    } else {
      auto* b = reinterpret_cast<std::uint16_t*>(narrowed.data());
      for (std::size_t j = 0; j < n; ++j) b[j] = float_to_bf16_bits(src[j]);
    }
    data = narrowed.data();
  }
  const StateBuffer& b = rs.st[i];
  if (b.host != nullptr) {
    std::memcpy(b.host, data, bytes(i, n));
    return;
  }
#ifdef GHT_HAVE_CUDA
  GHT_CUDA_TRY(cudaMemcpy(b.device, data, bytes(i, n), cudaMemcpyHostToDevice));
  // From pageable memory the copy may still be in flight on the legacy stream, which the
  // optimizer's non-blocking streams do not wait for.
  GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));
#endif
}

// State array i of rs as n fp32 values (bf16 m and v widened exactly, q8 dequantized).
void AdamW::Impl::copy_out(const RegionState& rs, int i, float* dst) const {
  if (dst == nullptr) return;
  const std::size_t n = rs.desc.n;
  const StateBuffer& b = rs.st[i];
  std::vector<unsigned char> narrow(i > 0 && state_type != StateType::fp32 ? bytes(i, n) : 0);
  void* data = narrow.empty() ? static_cast<void*>(dst) : narrow.data();
  if (b.host != nullptr) {
    std::memcpy(data, b.host, bytes(i, n));
  } else {
#ifdef GHT_HAVE_CUDA
    GHT_CUDA_TRY(cudaMemcpy(data, b.device, bytes(i, n), cudaMemcpyDeviceToHost));
#endif
  }
  if (narrow.empty()) return;
  if (state_type == StateType::q8) {
    q8_dequantize(narrow.data(), n, dst, i == 2);
    return;
  }
  const auto* w = reinterpret_cast<const std::uint16_t*>(narrow.data());
  for (std::size_t j = 0; j < n; ++j) dst[j] = bf16_bits_to_float(w[j]);
}

void AdamW::Impl::zero(const RegionState& rs, int i) {
  const StateBuffer& b = rs.st[i];
  const std::size_t size = bytes(i, rs.desc.n);  // q8: all codes and scales 0 stand for 0
  if (b.host != nullptr) {
    zero_host(b.host, size, opts.cpu_threads);  // first touch by the team
    return;
  }
#ifdef GHT_HAVE_CUDA
  GHT_CUDA_TRY(cudaMemset(b.device, 0, size));
  GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));  // see copy_in
#endif
}

}  // namespace ght::optimizer
