// AdamW's gpu_link path in dma mode: state chunks through HBM slots on the copy engines (host ->
// slot, update, slot -> host), the slots' sizes, and the SMs the gpu_link kernel may occupy.
#include <algorithm>

#include "optimizer/adamw.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

using detail::kDmaChunk;
using detail::kDmaSlots;

namespace detail {

// Parameters per dma slot: one chunk, no larger than the largest region (small models, small
// slots), a multiple of 64 and of the q8 block (kDmaChunk is both).
std::size_t dma_chunk_params(std::size_t largest_region, StateType st) {
  const std::size_t g = detail::chunk_granule(st);
  return std::min(kDmaChunk, (largest_region + g - 1) / g * g);
}
// Bytes of one dma slot for chunks of `chunk` parameters: fp32 master, m and v.
std::size_t dma_slot_stride(std::size_t chunk, StateType st) {
  return array_bytes(0, st, chunk) + array_bytes(1, st, chunk) + array_bytes(2, st, chunk);
}
// HBM of the slots.
std::size_t dma_slots_bytes(std::size_t chunk, StateType st) { return kDmaSlots * dma_slot_stride(chunk, st); }

bool dma_reachable(const StateBuffer (&st)[3]) {
  bool any_host = false;
  for (const StateBuffer& b : st) {
    const bool hbm = b.tier == TierKind::hbm;
    if (hbm ? b.device == nullptr : b.host == nullptr) return false;
    any_host = any_host || !hbm;
  }
  return any_host;
}

}  // namespace detail

using detail::dma_chunk_params;
using detail::dma_slot_stride;
using detail::dma_slots_bytes;

std::size_t dma_slot_bytes(std::size_t largest_region, StateType st) {
  return dma_slots_bytes(dma_chunk_params(largest_region, st), st);
}

void AdamW::Impl::ensure_dma() {
#ifdef GHT_HAVE_CUDA
  if (dma_mem) return;
  dma_mem = alloc::unique_block(*alloc, dma_slots_bytes(dma_chunk, state_type),
                                {TensorClass::other, "optimizer.dma_slots", TierKind::hbm, false});
  for (int i = 0; i < kDmaSlots; ++i) {
    dma_in[i] = new_event();
    dma_updated[i] = new_event();
    dma_free[i] = new_event();
  }
#endif
}

// dma mode: per chunk, state goes host -> slot on `up`, the kernel updates the slot on `link`,
// state goes slot -> host on `down`; slots rotate so the three stages overlap, and the two
// copy directions run on separate copy engines at the same time. Arrays of the region that live
// in HBM (a placement may keep m and v of a region on the host and its master in HBM, or the
// reverse) are not copied: the kernel updates them in place, and only the host arrays cross.
void AdamW::Impl::update_gpu_dma(RegionState& rs, const StepScalars& k, bool speculative) {
#ifdef GHT_HAVE_CUDA
  const std::size_t gsize = grad_type_size(rs.desc.grad_type);
  for (std::size_t c = 0; c < rs.chunks; ++c) {
    const std::size_t off = c * rs.chunk, count = count_of(rs, c);
    const unsigned slot = dma_next++ % kDmaSlots;
    // The slot's master, m and v arrays, each dma_chunk elements (multiples of 64 and of the
    // q8 block: master 16-byte aligned, q8 records 4-byte aligned).
    unsigned char* slot_base = dma_mem.as<unsigned char>() + slot * dma_slot_stride(dma_chunk, state_type);
    unsigned char* arr[3] = {slot_base, slot_base + bytes(0, dma_chunk),
                             slot_base + bytes(0, dma_chunk) + bytes(1, dma_chunk)};
    bool crosses[3];
    for (int i = 0; i < 3; ++i) {
      crosses[i] = rs.st[i].tier != TierKind::hbm;
      if (!crosses[i]) arr[i] = static_cast<unsigned char*>(rs.st[i].device) + offset(i, off);
    }
    GHT_CUDA_TRY(cudaStreamWaitEvent(up, dma_free[slot], 0));  // slot drained
    for (int i = 0; i < 3; ++i) {
      if (!crosses[i]) continue;
      GHT_CUDA_TRY(cudaMemcpyAsync(arr[i], static_cast<const unsigned char*>(rs.st[i].host) + offset(i, off),
                                   bytes(i, count), cudaMemcpyHostToDevice, up));
    }
    record(dma_in[slot], up);
    GHT_CUDA_TRY(cudaStreamWaitEvent(link, dma_in[slot], 0));
    AdamWSpan s;
    s.master = reinterpret_cast<float*>(arr[0]);
    s.m = arr[1];
    s.v = arr[2];
    s.grad = static_cast<const unsigned char*>(rs.grad_dev) + off * gsize;
    s.grad_type = rs.desc.grad_type;
    s.weight = rs.weight_dev != nullptr ? static_cast<bf16*>(rs.weight_dev) + off : nullptr;
    s.n = count;
    s.state = state_type;
    s.key = rs.key;
    s.first = rs.desc.first + off;
    if (speculative) save_for_undo(rs, c, s.master, s.m, s.v);
    adamw_gpu(s, k, link, kernel_sms(rs));
    record(dma_updated[slot], link);
    GHT_CUDA_TRY(cudaStreamWaitEvent(down, dma_updated[slot], 0));
    for (int i = 0; i < 3; ++i) {
      if (!crosses[i]) continue;
      GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<unsigned char*>(rs.st[i].host) + offset(i, off), arr[i],
                                   bytes(i, count), cudaMemcpyDeviceToHost, down));
    }
    record(dma_free[slot], down);
    record(rs.events[c], down);  // weights and host state of the chunk are final
  }
#else
  (void)rs;
  (void)k;
  (void)speculative;
#endif
}

// What the gpu_link regions update: their state bytes per parameter on the host (some arrays of
// a region may stay in HBM) and, for q8 state, the kernel's compute-bound rate.
LinkKernelLoad AdamW::Impl::link_kernel_load() const {
  LinkKernelLoad load;
  load.state_bytes = state_bytes_per_param(state_type);
  double params = 0, host_bytes = 0;
  for (const RegionState& rs : regions) {
    if (rs.path != Path::gpu_link) continue;
    params += static_cast<double>(rs.desc.n);
    for (int i = 0; i < 3; ++i) {
      if (rs.st[i].tier != TierKind::hbm) host_bytes += static_cast<double>(bytes(i, rs.desc.n));
    }
  }
  if (params > 0 && host_bytes > 0) load.link_bytes = host_bytes / params;
  load.gpu_params_per_second = gpu_update_params_per_second(state_type);
  return load;
}

// SMs of the gpu_link kernel: GHT_OPT_KERNEL_SMS, or enough for kLinkKernelMargin times the
// rate at which the link feeds it; and the chunks per batched launch (GHT_OPT_BATCH).
void AdamW::Impl::size_kernels() {
#ifdef GHT_HAVE_CUDA
  const config::Registry& reg = config::cfg();
  if (gpu) {
    int sms = 0;
    GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int asked = opts.kernel_sms > 0 ? opts.kernel_sms
                                          : static_cast<int>(reg.get_int(config::Key::GHT_OPT_KERNEL_SMS));
    bool any_link = false;
    for (const Impl::RegionState& rs : regions) any_link = any_link || rs.path == Path::gpu_link;
    link_sms = sms;
    device_sms = sms;
    side_by_side = opts.side_by_side ? *opts.side_by_side : reg.get_bool(config::Key::GHT_OPT_SIDE_BY_SIDE);
    batch_spans = opts.batch_spans > 0 ? opts.batch_spans : static_cast<int>(reg.get_int(config::Key::GHT_OPT_BATCH));
    if (asked > 0) {
      link_sms = std::min(asked, sms);
    } else if (any_link) {
      const tier::LinkNumbers L = tier::resolve_link_numbers();
      const double state_link_bps =
          link_mode == LinkMode::dma
              ? (L.bidir_bps > 0 ? L.bidir_bps : L.h2d_bps + L.d2h_bps)
              : L.kernel_read_bps + L.kernel_write_bps;
      link_sms = optimizer::link_kernel_sms(state_link_bps, L.hbm_bps, sms, link_kernel_load());
    }
  }
#endif
}

void AdamW::Impl::split_sms_for_update() {
  split_link_sms = 0;
  if (!gpu || skip || !side_by_side) return;
  double link_params = 0, hbm_params = 0;
  for (const RegionState& rs : regions) {
    if (rs.updated || rs.done_ahead) continue;
    if (rs.path == Path::gpu_link) link_params += static_cast<double>(rs.desc.n);
    if (rs.path == Path::device) hbm_params += static_cast<double>(rs.desc.n);
  }
  split_link_sms = optimizer::split_update_sms(device_sms, link_params, hbm_params, link_sms);
}

}  // namespace ght::optimizer
