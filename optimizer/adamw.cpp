// AdamW: construction and path choice (the split included), the GPU paths, begin_step and
// speculation. The cpu path's worker and jobs are adamw_cpu_path.cpp; the shared state is
// detail/adamw_impl.hpp.
#include "optimizer/adamw.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "alloc/block.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/config.hpp"
#include "tier/cost_model.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/plan.hpp"
#include "tier/topology.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

using detail::kDmaChunk;
using detail::kDmaSlots;

// ---- names -----------------------------------------------------------------------------------

std::string_view to_string(Path p) noexcept {
  switch (p) {
    case Path::gpu_link: return "gpu_link";
    case Path::cpu: return "cpu";
    case Path::device: return "device";
  }
  return "?";
}

std::string_view to_string(PathChoice p) noexcept {
  switch (p) {
    case PathChoice::automatic: return "auto";
    case PathChoice::gpu_link: return "gpu_link";
    case PathChoice::cpu: return "cpu";
    case PathChoice::device: return "device";
    case PathChoice::split: return "split";
  }
  return "?";
}

PathChoice parse_path_choice(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "auto") return PathChoice::automatic;
  if (t == "gpu_link") return PathChoice::gpu_link;
  if (t == "cpu") return PathChoice::cpu;
  if (t == "device") return PathChoice::device;
  if (t == "split") return PathChoice::split;
  throw config_error("GHT_OPTIMIZER: '" + std::string(text) +
                     "' is not one of auto|gpu_link|cpu|device|split");
}

PathChoice path_choice_from_config() {
  return parse_path_choice(config::cfg().get_string(config::Key::GHT_OPTIMIZER));
}

StateType parse_state_type(std::string_view text) {
  const std::string t = config::parse_enum("GHT_OPT_STATE", text, "fp32|bf16|q8");
  return t == "q8" ? StateType::q8 : t == "bf16" ? StateType::bf16 : StateType::fp32;
}

StateType state_type_from_config() {
  return parse_state_type(config::cfg().get_string(config::Key::GHT_OPT_STATE));
}

std::string_view to_string(LinkMode m) noexcept {
  return m == LinkMode::dma ? "dma" : "zero_copy";
}

LinkMode link_mode_from_config() {
  // The registry has validated the value against auto|zero_copy|dma.
  const std::string v = config::cfg().get_string(config::Key::GHT_OPT_LINK_MODE);
  if (v == "dma") return LinkMode::dma;
  if (v == "zero_copy") return LinkMode::zero_copy;
  // auto: on PCIe the in-place kernel reached 0.70 Gparam/s (19% of the link roofline) while the
  // copy-engine path reached 3.95 Gparam/s (bench/results/2026-11-30-h200-optimizer.md); on a
  // coherent C2C link the GPU reads host memory natively, so it updates in place.
  return tier::topology().link == LinkKind::c2c ? LinkMode::zero_copy : LinkMode::dma;
}

namespace {

constexpr TensorClass kStateClass[3] = {TensorClass::master, TensorClass::adam_m,
                                        TensorClass::adam_v};

// Bytes of n elements of state buffer i (0 master, 1 m, 2 v).
std::size_t array_bytes(int i, StateType st, std::size_t n) { return i == 0 ? n * sizeof(float) : state_bytes(st, n); }

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

std::size_t round_down(std::size_t x, std::size_t m) { return std::max(m, x / m * m); }

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

#ifdef GHT_HAVE_CUDA
// The optimizer's streams run at the device's lowest priority: where compute streams are given a
// higher one, the GPU schedules their blocks first whenever both have work waiting. (The default
// priority of cudaStreamCreate is the lowest one too, so this changes nothing until they are.)
CUstream_st* make_stream() {
  int least = 0, greatest = 0;
  GHT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  GHT_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least));
  return s;
}
#endif

}  // namespace

std::size_t dma_slot_bytes(std::size_t largest_region, StateType st) {
  return dma_slots_bytes(dma_chunk_params(largest_region, st), st);
}

// ---- Impl: CUDA helpers, regions ---------------------------------------------------------------

void AdamW::Impl::release() noexcept {
  worker.reset();  // finishes its job in progress; its streams are still here
#ifdef GHT_HAVE_CUDA
  for (CUstream_st* s : {link, down, up, norm, cpu_down, cpu_up}) {
    if (s != nullptr) (void)cudaStreamSynchronize(s);
  }
  for (RegionState& rs : regions) {
    for (CUevent_st* e : rs.events) (void)cudaEventDestroy(e);
    rs.events.clear();
  }
  for (CUevent_st* e : {grad_ready[0], grad_ready[1], weight_sent[0], weight_sent[1], produced,
                        step_barrier, spec_ready, spec_fence}) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  for (int i = 0; i < kDmaSlots; ++i) {
    for (CUevent_st* e : {dma_in[i], dma_updated[i], dma_free[i]}) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
  step_ready.reset();
  dma_mem.reset();
  spec_arena.reset();
  sumsq.reset();  // its partials are freed on `norm`: before the stream goes
  for (CUstream_st* s : {link, down, up, norm, cpu_down, cpu_up}) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  link = down = up = norm = cpu_down = cpu_up = nullptr;
#endif
  spec_host.reset();
  for (alloc::unique_block& s : staging) s.reset();
  for (RegionState& rs : regions) {
    for (alloc::unique_block& m : rs.mem) m.reset();
  }
}

CUevent_st* AdamW::Impl::new_event() {
#ifdef GHT_HAVE_CUDA
  cudaEvent_t e = nullptr;
  GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
#else
  return nullptr;
#endif
}

detail::SharedEvent AdamW::Impl::new_shared_event() {
#ifdef GHT_HAVE_CUDA
  if (!gpu) return nullptr;
  return detail::SharedEvent(new_event(), [](CUevent_st* e) { (void)cudaEventDestroy(e); });
#else
  return nullptr;
#endif
}

void AdamW::Impl::record(CUevent_st* e, CUstream_st* s) {
#ifdef GHT_HAVE_CUDA
  if (e != nullptr) GHT_CUDA_TRY(cudaEventRecord(e, s));
#else
  (void)e;
  (void)s;
#endif
}

void AdamW::Impl::sync_event(CUevent_st* e) {
#ifdef GHT_HAVE_CUDA
  if (e != nullptr) GHT_CUDA_TRY(cudaEventSynchronize(e));
#else
  (void)e;
#endif
}

void AdamW::Impl::record_chunk(RegionState& rs, std::size_t c, CUstream_st* s) {
  if (gpu) record(rs.events[c], s);
}

std::size_t AdamW::Impl::bytes(int i, std::size_t n) const { return array_bytes(i, state_type, n); }

std::size_t AdamW::Impl::offset(int i, std::size_t first) const {
  GHT_EXPECTS(i == 0 || first % state_granule(state_type) == 0,
              "AdamW: a q8 state chunk starts inside a block (element " + std::to_string(first) + ")");
  return bytes(i, first);
}

// Where the gradient and weight live, their GPU aliases, and the chunking they imply.
void AdamW::Impl::configure(RegionState& rs) {
  const Region& d = rs.desc;
  rs.grad_on_device = detail::is_device_memory(d.grad);
  rs.weight_on_device = detail::is_device_memory(d.weight);
  rs.grad_dev = nullptr;
  rs.weight_dev = nullptr;
  rs.dma = false;
  if (rs.path != Path::cpu) {
    if (d.grad != nullptr) rs.grad_dev = detail::device_alias(d.grad, "gradient of region '" + d.name + "'");
    if (d.weight != nullptr) rs.weight_dev = detail::device_alias(d.weight, "weight of region '" + d.name + "'");
    rs.chunk = chunk_elems;
    rs.staged = false;
    rs.dma = rs.path == Path::gpu_link && link_mode == LinkMode::dma &&
             rs.st[0].host != nullptr && rs.st[1].host != nullptr && rs.st[2].host != nullptr;
    if (rs.dma) {
      ensure_dma();
      rs.chunk = std::min(chunk_elems, dma_chunk);
    }
  } else {
    rs.staged = rs.grad_on_device || rs.weight_on_device;
    if (rs.weight_on_device) rs.weight_dev = d.weight;
    if (rs.staged) {
      ensure_staging();
      rs.chunk = round_down(staging_bytes / (grad_type_size(d.grad_type) + sizeof(bf16)), granule());
    } else {
      rs.chunk = d.n;
    }
  }
  rs.chunks = (d.n + rs.chunk - 1) / rs.chunk;
  if (gpu) {
    while (rs.events.size() < rs.chunks) rs.events.push_back(new_event());
  }
  if (on_worker(rs)) ensure_worker();
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

void AdamW::Impl::ensure_staging() {
  if (staging[0]) return;
  for (alloc::unique_block& s : staging) {
    s = alloc::unique_block(*alloc, staging_bytes, {TensorClass::other, "optimizer.staging", TierKind::host, false});
  }
  for (CUevent_st*& e : grad_ready) e = new_event();
  for (CUevent_st*& e : weight_sent) e = new_event();
}

// Layout of a staging slot for the cpu path: gradients first, bf16 weights after.
bf16* AdamW::Impl::slot_weight(const RegionState& rs, int slot) {
  const std::size_t gbytes = rs.chunk * grad_type_size(rs.desc.grad_type);
  return reinterpret_cast<bf16*>(staging[slot].as<unsigned char>() + (gbytes + 63) / 64 * 64);
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

AdamW::Impl::RegionState& AdamW::Impl::at(std::size_t r) {
  GHT_EXPECTS(r < regions.size(), "region index " + std::to_string(r) + " out of range (" +
                                      std::to_string(regions.size()) + " regions)");
  return regions[r];
}

// ---- Impl: GPU paths ---------------------------------------------------------------------------

void AdamW::Impl::update_gpu(RegionState& rs, const StepScalars& k, bool speculative) {
#ifdef GHT_HAVE_CUDA
  for (std::size_t c = 0; c < rs.chunks; ++c) {
    const std::size_t off = c * rs.chunk;
    const AdamWSpan s = span(rs, off, count_of(rs, c), true);
    if (speculative) save_for_undo(rs, c, s.master, s.m, s.v);
    adamw_gpu(s, k, link, kernel_sms(rs));
    record(rs.events[c], link);
  }
#else
  (void)rs;
  (void)k;
  (void)speculative;
  GHT_FAIL("GPU optimizer path in a build without CUDA");
#endif
}

void AdamW::Impl::update_gpu_batched(AdamW& self, const std::function<void(std::size_t)>& launched) {
#ifdef GHT_HAVE_CUDA
  if (!gpu || skip || !step_open) return;  // update_region records the events of a skipped step
  AdamWBatch batch(link, batch_spans);
  std::vector<CUevent_st*> pending;  // chunk events of the queued spans: recorded after their launch
  std::vector<std::size_t> pending_regions;  // regions whose last chunk is among them
  auto launch = [&] {
    batch.flush();
    for (CUevent_st* e : pending) record(e, link);
    pending.clear();
    if (launched) {
      for (std::size_t r : pending_regions) launched(r);
    }
    pending_regions.clear();
  };
  for (std::size_t r = 0; r < regions.size(); ++r) {
    RegionState& rs = regions[r];
    if (rs.updated) continue;
    if (rs.path == Path::cpu || rs.dma || rs.done_ahead) {
      launch();
      self.update_region(r);
      if (launched) launched(r);
      continue;
    }
    rs.updated = true;
    const StepScalars& k = rs.desc.weight_decay ? k_decay : k_plain;
    const int sms = kernel_sms(rs);
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      const AdamWSpan s = span(rs, c * rs.chunk, count_of(rs, c), true);
      if (!batch.fits(s, k, sms)) launch();  // a flush here leaves r's later chunks unlaunched
      batch.add(s, k, sms);
      pending.push_back(rs.events[c]);
    }
    pending_regions.push_back(r);  // reported by the flush that records its last chunk's event
  }
  launch();
#else
  (void)self;
  (void)launched;
#endif
}

// dma mode: per chunk, state goes host -> slot on `up`, the kernel updates the slot on `link`,
// state goes slot -> host on `down`; slots rotate so the three stages overlap, and the two
// copy directions run on separate copy engines at the same time.
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
    GHT_CUDA_TRY(cudaStreamWaitEvent(up, dma_free[slot], 0));  // slot drained
    for (int i = 0; i < 3; ++i) {
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

// ---- Impl: speculation -------------------------------------------------------------------------

// Byte offset of saved array i in a chunk's save: master, m, v, then the bf16 weight (i = 3).
// Each saved array padded to 8 elements and 16 bytes keeps every array 16-byte aligned, so the
// undo recompute takes the same (vector) kernel path as the update it replaces.
std::size_t AdamW::Impl::spec_offset(std::size_t count, int i) const {
  std::size_t o = 0;
  for (int j = 0; j < i; ++j) o += (bytes(j, spec_pad(count)) + 15) / 16 * 16;
  return o;
}

std::size_t AdamW::Impl::spec_bytes(std::size_t count) const {
  return (spec_offset(count, 3) + count * sizeof(bf16) + 255) / 256 * 256;
}

std::size_t AdamW::Impl::region_spec_bytes(const RegionState& rs) const {
  std::size_t b = 0;
  for (std::size_t c = 0; c < rs.chunks; ++c) b += spec_bytes(count_of(rs, c));
  return b;
}

// On `link`, before the chunk's kernel: copy the state it will overwrite (wherever the kernel
// reads it: mapped host memory or a dma slot) and its bf16 weight into the arena.
void AdamW::Impl::save_for_undo(RegionState& rs, std::size_t c, const float* master, const void* m, const void* v) {
#ifdef GHT_HAVE_CUDA
  SpecChunk sc;
  sc.region = static_cast<std::size_t>(&rs - regions.data());
  sc.chunk = c;
  sc.off = c * rs.chunk;
  sc.count = count_of(rs, c);
  sc.save = spec_arena.as<unsigned char>() + spec_used;
  spec_used += spec_bytes(sc.count);
  const void* src[3] = {master, m, v};
  for (int i = 0; i < 3; ++i) {
    GHT_CUDA_TRY(cudaMemcpyAsync(sc.save + spec_offset(sc.count, i), src[i], bytes(i, sc.count),
                                 cudaMemcpyDefault, link));
  }
  if (rs.weight_dev != nullptr) {
    GHT_CUDA_TRY(cudaMemcpyAsync(sc.save + spec_offset(sc.count, 3), static_cast<const bf16*>(rs.weight_dev) + sc.off,
                                 sc.count * sizeof(bf16), cudaMemcpyDefault, link));
  }
  spec.push_back(sc);
#else
  (void)rs;
  (void)c;
  (void)master;
  (void)m;
  (void)v;
#endif
}

// The speculation of gpu_link chunks did not hold: recompute every one from its saved state with
// this step's scalars (redo), or put the saved bytes back (the step is skipped), and write the
// result over the speculative one. Same kernel and inputs as the non-speculative update.
void AdamW::Impl::undo_speculation(bool redo) {
#ifdef GHT_HAVE_CUDA
  if (spec.empty()) return;
  // dma write-backs of the speculative results run on `down`; ours must land after them.
  record(spec_fence, down);
  GHT_CUDA_TRY(cudaStreamWaitEvent(link, spec_fence, 0));
  for (const SpecChunk& sc : spec) {
    RegionState& rs = regions[sc.region];
    unsigned char* saved[3] = {sc.save, sc.save + spec_offset(sc.count, 1), sc.save + spec_offset(sc.count, 2)};
    AdamWSpan s = span(rs, sc.off, sc.count, true);  // this chunk's gradient, weight and stream
    if (redo) {
      s.master = reinterpret_cast<float*>(saved[0]);
      s.m = saved[1];
      s.v = saved[2];
      adamw_gpu(s, rs.desc.weight_decay ? k_decay : k_plain, link, kernel_sms(rs));
    } else if (s.weight != nullptr) {
      GHT_CUDA_TRY(cudaMemcpyAsync(s.weight, sc.save + spec_offset(sc.count, 3), sc.count * sizeof(bf16),
                                   cudaMemcpyDefault, link));
    }
    for (int i = 0; i < 3; ++i) {
      void* dst = rs.st[i].host != nullptr ? rs.st[i].host : rs.st[i].device;
      GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + offset(i, sc.off), saved[i],
                                   bytes(i, sc.count), cudaMemcpyDefault, link));
    }
    record(rs.events[sc.chunk], link);
  }
  // The next step's dma reads (ordered after `down`) must see the corrected state.
  record(spec_fence, link);
  GHT_CUDA_TRY(cudaStreamWaitEvent(down, spec_fence, 0));
#else
  (void)redo;
#endif
}

// The HBM undo arena: GHT_OPT_SPECULATE bytes (or opts.speculate_bytes) when some region takes the
// gpu_link path, capped so that GHT_HBM_HEADROOM stays free.
void AdamW::Impl::reserve_speculation() {
#ifdef GHT_HAVE_CUDA
  if (!gpu) return;
  bool any_link = false;
  for (const RegionState& rs : regions) any_link = any_link || rs.path == Path::gpu_link;
  if (!any_link) return;
  std::size_t free_b = 0, total_b = 0;
  GHT_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  std::size_t want = opts.speculate_bytes
                         ? *opts.speculate_bytes
                         : config::cfg().get_size(config::Key::GHT_OPT_SPECULATE).resolve(total_b, "GHT_OPT_SPECULATE");
  const std::size_t headroom =
      config::cfg().get_size(config::Key::GHT_HBM_HEADROOM).resolve(total_b, "GHT_HBM_HEADROOM");
  want = std::min(want, free_b > headroom ? free_b - headroom : 0);
  // Within the allocator's HBM budget too: the arena must not push the plan's state out.
  want = std::min<std::size_t>(want, alloc->report(TierKind::hbm).largest_free);
  if (want < (std::size_t{1} << 20)) return;
  try {
    spec_arena = alloc::unique_block(*alloc, want, {TensorClass::other, "optimizer.speculation", TierKind::hbm, false});
  } catch (const ght::out_of_memory&) {
    return;  // speculation is an optimisation: run without it
  }
  spec_cap = want;
#endif
}

// The host undo arena: GHT_OPT_SPECULATE_HOST bytes (or opts.speculate_host_bytes; a percentage
// of the host budget) when some region takes the cpu path, within what the host tier has left.
void AdamW::Impl::reserve_host_speculation() {
  bool any_cpu = false;
  for (const RegionState& rs : regions) any_cpu = any_cpu || rs.path == Path::cpu;
  if (!any_cpu) return;
  const alloc::TierReport host = alloc->report(TierKind::host);
  const std::uint64_t capacity = host.budget != UINT64_MAX ? host.budget : host.largest_free;
  std::size_t want = opts.speculate_host_bytes ? *opts.speculate_host_bytes
                                               : config::cfg()
                                                     .get_size(config::Key::GHT_OPT_SPECULATE_HOST)
                                                     .resolve(capacity, "GHT_OPT_SPECULATE_HOST");
  want = std::min<std::size_t>(want, host.largest_free);
  if (want < (std::size_t{1} << 20)) return;
  try {
    spec_host = alloc::unique_block(*alloc, want, {TensorClass::other, "optimizer.speculation_host", TierKind::host, false});
  } catch (const ght::out_of_memory&) {
    return;
  }
  spec_host_cap = want;
}

// The first speculation of a step fixes its lr and its scalars (coefficient 1, the next step).
void AdamW::Impl::open_speculation(double lr) {
  if (spec_open) return;
  spec_open = true;
  spec_lr = lr;
  spec_decay = make_step_scalars(opts.hyper, lr, t + 1, true, 1.0);
  spec_plain = make_step_scalars(opts.hyper, lr, t + 1, false, 1.0);
#ifdef GHT_HAVE_CUDA
  if (gpu) {
    // As in begin_step: this step's dma reads follow the previous step's write-backs.
    record(step_barrier, down);
    GHT_CUDA_TRY(cudaStreamWaitEvent(up, step_barrier, 0));
  }
#endif
}

// begin_step's verdict on this step's speculation: keep it, or undo it (recompute with the
// step's scalars when the step is taken, restore when it is skipped). cpu regions get a redo or
// restore job, which the worker runs after their speculative job.
void AdamW::Impl::settle_speculation(StepResult& res, bool undo) {
  if (!spec_open) return;
  for (const SpecChunk& sc : spec) res.speculated_params += sc.count;
  for (const RegionState& rs : regions) {
    if (rs.speculated && rs.path == Path::cpu) res.speculated_params += rs.desc.n;
  }
  stats.steps_speculated += 1;
  if (undo) {
    undo_speculation(res.taken);
    for (std::size_t r = 0; r < regions.size(); ++r) {
      RegionState& rs = regions[r];
      if (!rs.speculated || rs.path != Path::cpu) continue;
      detail::CpuJob j;
      j.kind = res.taken ? detail::CpuJob::Kind::redo : detail::CpuJob::Kind::restore;
      j.region = r;
      j.saves = rs.spec_saves;
      if (res.taken) {
        j.k = rs.desc.weight_decay ? k_decay : k_plain;
        j.ready = step_ready;  // the gradients are read again
      }
      enqueue_cpu(std::move(j));
    }
    res.speculation_undone = true;
    stats.speculations_undone += 1;
  }
  for (RegionState& rs : regions) rs.done_ahead = rs.speculated;
  end_speculation();
}

void AdamW::Impl::end_speculation() {
  spec.clear();
  spec_used = 0;
  spec_host_used = 0;  // jobs still reading it run before any later speculation's writes (in order)
  spec_open = false;
  for (RegionState& rs : regions) {
    rs.speculated = false;
    rs.spec_saves.clear();
  }
}

// ---- AdamW -----------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Region> regions, AdamWOptions opts,
             std::shared_ptr<alloc::tiered_allocator> alloc)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  const config::Registry& reg = config::cfg();
  I.opts = opts;
  I.gpu = detail::gpu_available();
  const PathChoice choice = opts.path ? *opts.path : path_choice_from_config();
  I.link_mode = opts.link_mode ? *opts.link_mode : link_mode_from_config();
  I.state_type = opts.state_type ? *opts.state_type : state_type_from_config();
  if (choice == PathChoice::gpu_link || choice == PathChoice::device || choice == PathChoice::split) {
    GHT_EXPECTS(I.gpu, "GHT_OPTIMIZER=" + std::string(to_string(choice)) +
                           " needs a GPU, and none is available");
  }
  if (!opts.path && !opts.cpu_share && choice != PathChoice::split &&
      reg.get_float(config::Key::GHT_OPT_CPU_SHARE) != -1) {  // a forced share: only the split has one
    throw config_error("GHT_OPT_CPU_SHARE=" + reg.text(config::Key::GHT_OPT_CPU_SHARE) +
                       " applies only with GHT_OPTIMIZER=split (it is " + std::string(to_string(choice)) + ")");
  }
  if (!alloc) alloc = alloc::make_default_tiered_allocator();
  I.alloc = std::move(alloc);
  // The choice pins the state's tier; `auto` and `split` leave it to the plan in the allocator.
  std::optional<TierKind> state_tier;
  if (choice == PathChoice::device) state_tier = TierKind::hbm;
  if (choice == PathChoice::gpu_link || choice == PathChoice::cpu) state_tier = TierKind::host;

  std::size_t chunk_bytes = opts.chunk_elems * sizeof(float);
  if (chunk_bytes == 0) chunk_bytes = reg.get_size(config::Key::GHT_OPT_CHUNK).resolve(0, "GHT_OPT_CHUNK");
  // Multiples of 64 parameters keep every chunk's start 16-byte aligned for the vector kernel;
  // with q8 state, multiples of the 256-element block (rounded down, at least one block).
  I.chunk_elems = round_down(chunk_bytes / sizeof(float), I.granule());
  I.staging_bytes = opts.staging_bytes;
  if (I.staging_bytes == 0) {
    I.staging_bytes = reg.get_size(config::Key::GHT_STAGING_BYTES).resolve(0, "GHT_STAGING_BYTES");
  }
  I.staging_bytes = round_down(I.staging_bytes, 64 * 8);

#ifdef GHT_HAVE_CUDA
  if (I.gpu) {
    GHT_CUDA_TRY(cudaGetDevice(&I.device));
    I.link = make_stream();
    I.down = make_stream();
    I.up = make_stream();
    I.norm = make_stream();
    I.cpu_down = make_stream();
    I.cpu_up = make_stream();
    I.produced = I.new_event();
    I.spec_ready = I.new_event();
    I.spec_fence = I.new_event();
    I.step_barrier = I.new_event();
  }
#endif

  std::size_t largest = 0;
  for (const Region& d : regions) largest = std::max(largest, d.n);
  I.dma_chunk = dma_chunk_params(largest, I.state_type);

  std::set<std::string> names;
  I.regions.reserve(regions.size());
  for (Region& d : regions) {
    GHT_EXPECTS(!d.name.empty(), "AdamW: a region has an empty name");
    GHT_EXPECTS(d.n > 0, "AdamW: region '" + d.name + "' has no parameters");
    GHT_EXPECTS(names.insert(d.name).second, "AdamW: duplicate region name '" + d.name + "'");
    Impl::RegionState& rs = I.regions.emplace_back();
    rs.desc = std::move(d);
    rs.key = round_key(rs.desc.name);
    for (int i = 0; i < 3; ++i) {
      const alloc::AllocRequest req{kStateClass[i], rs.desc.name, state_tier,
                                    /*may_spill=*/choice != PathChoice::device};
      rs.mem[i] = alloc::unique_block(*I.alloc, I.bytes(i, rs.desc.n), req);
      rs.st[i] = state_view(rs.mem[i], I.gpu);
    }
    bool all_host = true, all_dev = true, all_hbm = true;
    for (const StateBuffer& b : rs.st) {
      all_host = all_host && b.host != nullptr;
      all_dev = all_dev && b.device != nullptr;
      all_hbm = all_hbm && b.tier == TierKind::hbm;
    }
    const std::string where = "region '" + rs.desc.name + "'";
    switch (choice) {
      case PathChoice::automatic:
      case PathChoice::split:
        if (I.gpu && all_dev) {
          rs.path = all_hbm ? Path::device : Path::gpu_link;
        } else {
          GHT_EXPECTS(all_host, where + ": optimizer state is reachable by neither the CPU nor "
                                        "the GPU");
          rs.path = Path::cpu;
        }
        break;
      case PathChoice::gpu_link:
      case PathChoice::device:
        GHT_EXPECTS(all_dev, where + ": GHT_OPTIMIZER=" + std::string(to_string(choice)) +
                                 " but the state is not GPU-addressable");
        rs.path = all_hbm ? Path::device : Path::gpu_link;
        break;
      case PathChoice::cpu:
        GHT_EXPECTS(all_host, where + ": GHT_OPTIMIZER=cpu but the state is in HBM");
        rs.path = Path::cpu;
        break;
    }
  }

  if (choice == PathChoice::split) {
    // The host-state regions the link path would take, in update order, divided between the
    // two paths at the resolved share (tier/plan.hpp: assign_update_split).
    std::vector<std::size_t> idx;
    std::vector<std::uint64_t> params;
    tier::UpdateSplitInput in;
    in.state_bytes_per_param = state_bytes_per_param(I.state_type);
    for (std::size_t r = 0; r < I.regions.size(); ++r) {
      const Impl::RegionState& rs = I.regions[r];
      if (rs.path != Path::gpu_link || rs.st[0].host == nullptr || rs.st[1].host == nullptr ||
          rs.st[2].host == nullptr) {
        continue;
      }
      idx.push_back(r);
      params.push_back(rs.desc.n);
      const bool grad_host = rs.desc.grad != nullptr && !detail::is_device_memory(rs.desc.grad);
      (grad_host ? in.params_grad_host : in.params_grad_hbm) += rs.desc.n;
    }
    const double requested = opts.cpu_share ? *opts.cpu_share : reg.get_float(config::Key::GHT_OPT_CPU_SHARE);
    // The cost model's best share needs the link numbers (measured or the link kind's profile).
    const tier::LinkNumbers link = requested == -1 ? tier::resolve_link_numbers() : tier::LinkNumbers{};
    const double share = tier::resolve_update_cpu_share(requested, in, link);
    I.split_share = share;
    const std::vector<bool> on_cpu = tier::assign_update_split(params, share);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      if (on_cpu[i]) I.regions[idx[i]].path = Path::cpu;
    }
  }

  for (Impl::RegionState& rs : I.regions) {
    for (int i = 0; i < 3; ++i) I.zero(rs, i);
    I.configure(rs);
  }

  // SMs of the gpu_link kernel: GHT_OPT_KERNEL_SMS, or enough for kLinkKernelMargin times the
  // rate at which the link feeds it.
#ifdef GHT_HAVE_CUDA
  if (I.gpu) {
    int sms = 0;
    GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, I.device));
    const int asked = opts.kernel_sms > 0 ? opts.kernel_sms
                                          : static_cast<int>(reg.get_int(config::Key::GHT_OPT_KERNEL_SMS));
    bool any_link = false;
    for (const Impl::RegionState& rs : I.regions) any_link = any_link || rs.path == Path::gpu_link;
    I.link_sms = sms;
    I.batch_spans = opts.batch_spans > 0 ? opts.batch_spans : static_cast<int>(reg.get_int(config::Key::GHT_OPT_BATCH));
    if (asked > 0) {
      I.link_sms = std::min(asked, sms);
    } else if (any_link) {
      const tier::LinkNumbers L = tier::resolve_link_numbers();
      const double state_link_bps =
          I.link_mode == LinkMode::dma
              ? (L.bidir_bps > 0 ? L.bidir_bps : L.h2d_bps + L.d2h_bps)
              : L.kernel_read_bps + L.kernel_write_bps;
      I.link_sms = optimizer::link_kernel_sms(state_link_bps, L.hbm_bps, sms, state_bytes_per_param(I.state_type));
    }
  }
#endif

  I.reserve_speculation();
  I.reserve_host_speculation();
#ifdef GHT_HAVE_CUDA
  // HBM blocks above (dma slots, the undo arena) were allocated on the legacy stream and are
  // used on the optimizer's own streams: wait for the allocations once, here.
  if (I.gpu) GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));
#endif
}

AdamW::~AdamW() = default;

std::size_t AdamW::num_regions() const { return impl_->regions.size(); }
const Region& AdamW::region(std::size_t r) const { return impl_->at(r).desc; }
Path AdamW::path(std::size_t r) const { return impl_->at(r).path; }
LinkMode AdamW::link_mode(std::size_t r) const {
  return impl_->at(r).dma ? LinkMode::dma : LinkMode::zero_copy;
}
const AdamWHyper& AdamW::hyper() const { return impl_->opts.hyper; }
StateType AdamW::state_type() const { return impl_->state_type; }
alloc::tiered_allocator& AdamW::allocator() const { return *impl_->alloc; }

const OptimizerStats& AdamW::stats() const { return impl_->stats; }
std::int64_t AdamW::step_count() const { return impl_->t; }
CUstream_st* AdamW::stream() const { return impl_->link; }
std::size_t AdamW::num_chunks(std::size_t r) const { return impl_->at(r).chunks; }
std::optional<double> AdamW::split_cpu_share() const { return impl_->split_share; }
int AdamW::link_kernel_sms() const { return impl_->link_sms; }

void AdamW::set_step_count(std::int64_t t) {
  GHT_EXPECTS(t >= 0, "AdamW step count must be >= 0, got " + std::to_string(t));
  cancel_speculation();
  synchronize();  // a restore of the cancelled speculation runs first
  impl_->t = t;
}

const StateBuffer& AdamW::state(std::size_t r, TensorClass cls) const {
  const Impl::RegionState& rs = impl_->at(r);
  for (int i = 0; i < 3; ++i) {
    if (kStateClass[i] == cls) return rs.st[i];
  }
  GHT_FAIL("AdamW::state: class '" + std::string(ght::to_string(cls)) +
           "' is not master, adam_m or adam_v");
}

void AdamW::set_grad(std::size_t r, const void* grad, GradType type) {
  Impl::RegionState& rs = impl_->at(r);
  cancel_speculation();
  synchronize();  // an in-flight update may still read the old buffer
  rs.desc.grad = grad;
  rs.desc.grad_type = type;
  impl_->configure(rs);
}

void AdamW::set_weight(std::size_t r, void* weight) {
  Impl::RegionState& rs = impl_->at(r);
  cancel_speculation();
  synchronize();  // an in-flight update may still write the old buffer
  rs.desc.weight = weight;
  impl_->configure(rs);
}

void AdamW::set_weight_extrapolation(double x) {
  GHT_EXPECTS(std::isfinite(x), "AdamW weight extrapolation must be finite");
  impl_->opts.hyper.weight_extrapolation = x;
}

CUevent_st* AdamW::chunk_event(std::size_t r, std::size_t c) const {
  const Impl::RegionState& rs = impl_->at(r);
  GHT_EXPECTS(c < rs.chunks, "chunk " + std::to_string(c) + " out of range for region '" +
                                 rs.desc.name + "' (" + std::to_string(rs.chunks) + " chunks)");
  if (!impl_->gpu) return nullptr;
  impl_->wait_cpu_region(r);  // a cpu region's events exist once the worker recorded them
  return rs.events[c];
}

CUevent_st* AdamW::region_event(std::size_t r) const {
  return chunk_event(r, impl_->at(r).chunks - 1);
}

void AdamW::synchronize() const {
  if (impl_->worker) impl_->worker->drain();
#ifdef GHT_HAVE_CUDA
  for (CUstream_st* s : {impl_->link, impl_->down, impl_->up, impl_->norm, impl_->cpu_down, impl_->cpu_up}) {
    if (s != nullptr) GHT_CUDA_TRY(cudaStreamSynchronize(s));
  }
#endif
}

void AdamW::init_master_from_weights() {
  cancel_speculation();
  synchronize();
  Impl& I = *impl_;
  for (Impl::RegionState& rs : I.regions) {
    if (rs.desc.weight == nullptr) continue;
    const std::size_t n = rs.desc.n;
    std::vector<std::uint16_t> w(n);
    if (rs.weight_on_device || detail::is_device_memory(rs.desc.weight)) {
#ifdef GHT_HAVE_CUDA
      GHT_CUDA_TRY(cudaMemcpy(w.data(), rs.desc.weight, n * sizeof(bf16), cudaMemcpyDeviceToHost));
#endif
    } else {
      std::memcpy(w.data(), rs.desc.weight, n * sizeof(bf16));
    }
    std::vector<float> f(n);
    for (std::size_t i = 0; i < n; ++i) f[i] = bf16_bits_to_float(w[i]);
    I.copy_in(rs, 0, f.data());
  }
}

void AdamW::load_state(std::size_t r, const float* master, const float* m, const float* v) {
  cancel_speculation();
  synchronize();
  Impl::RegionState& rs = impl_->at(r);
  impl_->copy_in(rs, 0, master);
  impl_->copy_in(rs, 1, m);
  impl_->copy_in(rs, 2, v);
}

void AdamW::save_state(std::size_t r, float* master, float* m, float* v) const {
  GHT_EXPECTS(!impl_->spec_open, "AdamW::save_state: speculated regions wait for begin_step or cancel_speculation");
  synchronize();
  const Impl::RegionState& rs = impl_->at(r);
  impl_->copy_out(rs, 0, master);
  impl_->copy_out(rs, 1, m);
  impl_->copy_out(rs, 2, v);
}

StepResult AdamW::begin_step(double lr, CUstream_st* producer) {
  Impl& I = *impl_;
  GHT_EXPECTS(std::isfinite(lr) && lr >= 0, "AdamW lr must be finite and >= 0, got " +
                                                std::to_string(lr));
  bool any_dev = false, any_host = false;
  for (const Impl::RegionState& rs : I.regions) {
    GHT_EXPECTS(rs.desc.grad != nullptr, "AdamW: region '" + rs.desc.name + "' has no gradient");
    (rs.grad_on_device ? any_dev : any_host) = true;
  }
  double dev_sum = 0, host_sum = 0;
  I.step_ready.reset();
#ifdef GHT_HAVE_CUDA
  if (I.gpu) {
    // Everything the producer queued (backward, accumulation) precedes every read of gradients
    // and every overwrite of weights by this step.
    I.record(I.produced, producer);
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.link, I.produced, 0));
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.down, I.produced, 0));
    // The cpu worker's jobs of this step wait for the same point, on its own streams.
    I.step_ready = I.new_shared_event();
    I.record(I.step_ready.get(), producer);
    // dma mode: this step's state reads must follow the previous step's write-backs (a
    // speculation already ordered them, and the write-backs on `down` since then are its own).
    if (!I.spec_open) {
      I.record(I.step_barrier, I.down);
      GHT_CUDA_TRY(cudaStreamWaitEvent(I.up, I.step_barrier, 0));
    }
    if (any_dev) {
      // Only this step's gradients are read: wait for the producer, not for updates on `link`.
      GHT_CUDA_TRY(cudaStreamWaitEvent(I.norm, I.produced, 0));
      if (!I.sumsq) I.sumsq = std::make_unique<DeviceSumsq>(*I.alloc, I.norm);  // first step with device gradients
      I.sumsq->reset(I.norm);
      for (const Impl::RegionState& rs : I.regions) {
        if (rs.grad_on_device) I.sumsq->add(rs.desc.grad, rs.desc.grad_type, rs.desc.n, I.norm);
      }
      dev_sum = I.sumsq->finish(I.norm);
    }
    if (any_host) I.sync_event(I.produced);
  }
#else
  (void)producer;
  (void)any_dev;
#endif
  if (any_host) {
    for (const Impl::RegionState& rs : I.regions) {
      if (!rs.grad_on_device) {
        host_sum += grad_sumsq_cpu(rs.desc.grad, rs.desc.grad_type, rs.desc.n, I.opts.cpu_threads);
      }
    }
  }
  const double total = I.opts.combine_sumsq ? I.opts.combine_sumsq(dev_sum + host_sum) : dev_sum + host_sum;
  const double norm = std::sqrt(total);
  StepResult res;
  res.grad_norm = static_cast<float>(norm);
  for (Impl::RegionState& rs : I.regions) {
    rs.updated = false;
    rs.done_ahead = false;
  }
  I.step_open = true;
  I.stats.last_grad_norm = res.grad_norm;
  if (!std::isfinite(total)) {
    I.skip = true;
    res.taken = false;
    res.clip_coef = 0;
    res.step = I.t;
    I.stats.steps_skipped_nonfinite += 1;
    I.stats.last_clip_coef = 0;
    I.settle_speculation(res, true);  // restore: nothing of a skipped step may stay
    return res;
  }
  double clip = 1.0;
  const double max_norm = I.opts.hyper.max_grad_norm;
  if (max_norm > 0) clip = std::min(1.0, max_norm / (norm + 1e-6));
  I.skip = false;
  I.t += 1;
  I.k_decay = make_step_scalars(I.opts.hyper, lr, I.t, true, clip);
  I.k_plain = make_step_scalars(I.opts.hyper, lr, I.t, false, clip);
  res.taken = true;
  res.clip_coef = clip;
  res.step = I.t;
  I.stats.steps_taken += 1;
  I.stats.last_clip_coef = clip;
  // The speculation assumed exactly this: coefficient 1 and the same lr (hence the same scalars).
  I.settle_speculation(res, !(clip == 1.0 && lr == I.spec_lr));
  return res;
}

Speculation AdamW::speculate_region(std::size_t r, double lr, CUstream_st* producer) {
  Impl& I = *impl_;
  Impl::RegionState& rs = I.at(r);
  GHT_EXPECTS(std::isfinite(lr) && lr >= 0, "AdamW lr must be finite and >= 0, got " + std::to_string(lr));
  GHT_EXPECTS(!I.spec_open || lr == I.spec_lr, "AdamW::speculate_region('" + rs.desc.name +
                                                   "'): lr differs from this step's earlier speculation");
  if (rs.speculated || rs.path == Path::device) return Speculation::ineligible;
  if (rs.path == Path::cpu) {
    // Gradients in HBM come down after the producer's event; host gradients are read once the
    // host has seen that event complete.
    if (I.spec_host_cap == 0 || I.spec_host_used + I.region_spec_bytes(rs) > I.spec_host_cap) {
      return Speculation::no_room;
    }
    I.open_speculation(lr);
    detail::CpuJob j;
    j.kind = detail::CpuJob::Kind::speculate;
    j.region = r;
    j.k = rs.desc.weight_decay ? I.spec_decay : I.spec_plain;
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      j.saves.push_back(I.spec_host.as<unsigned char>() + I.spec_host_used);
      I.spec_host_used += I.spec_bytes(I.count_of(rs, c));
    }
    j.ready = I.new_shared_event();  // null without a GPU
    I.record(j.ready.get(), producer);
    rs.spec_saves = j.saves;
    rs.speculated = true;
    I.enqueue_cpu(std::move(j));
    return Speculation::done;
  }
  if (!I.gpu || !rs.grad_on_device) return Speculation::ineligible;
  if (I.spec_cap == 0 || I.spec_used + I.region_spec_bytes(rs) > I.spec_cap) return Speculation::no_room;
#ifdef GHT_HAVE_CUDA
  I.open_speculation(lr);
  I.record(I.spec_ready, producer);
  GHT_CUDA_TRY(cudaStreamWaitEvent(I.link, I.spec_ready, 0));
  const StepScalars& k = rs.desc.weight_decay ? I.spec_decay : I.spec_plain;
  if (rs.dma) {
    I.update_gpu_dma(rs, k, true);
  } else {
    I.update_gpu(rs, k, true);
  }
  rs.speculated = true;
#else
  (void)producer;
#endif
  return Speculation::done;
}

void AdamW::cancel_speculation() {
  Impl& I = *impl_;
  if (!I.spec_open) return;
  I.undo_speculation(false);
  for (std::size_t r = 0; r < I.regions.size(); ++r) {
    const Impl::RegionState& rs = I.regions[r];
    if (!rs.speculated || rs.path != Path::cpu) continue;
    detail::CpuJob j;
    j.kind = detail::CpuJob::Kind::restore;
    j.region = r;
    j.saves = rs.spec_saves;
    I.enqueue_cpu(std::move(j));
  }
  I.end_speculation();
}

std::size_t AdamW::speculate_capacity() const { return impl_->spec_cap; }
std::size_t AdamW::speculate_host_capacity() const { return impl_->spec_host_cap; }

void AdamW::update_region(std::size_t r) {
  Impl& I = *impl_;
  Impl::RegionState& rs = I.at(r);
  GHT_EXPECTS(I.step_open, "AdamW::update_region('" + rs.desc.name + "') before begin_step");
  GHT_EXPECTS(!rs.updated, "AdamW::update_region('" + rs.desc.name + "') twice in one step");
  rs.updated = true;
  if (rs.done_ahead) return;  // speculated; begin_step kept, recomputed or restored it
  if (rs.path == Path::cpu) {
    detail::CpuJob j;
    j.region = r;
    if (I.skip) {
      j.kind = detail::CpuJob::Kind::mark;
    } else {
      j.kind = detail::CpuJob::Kind::update;
      j.k = rs.desc.weight_decay ? I.k_decay : I.k_plain;
      j.ready = I.step_ready;
    }
    I.enqueue_cpu(std::move(j));
    return;
  }
  if (I.skip) {
    for (CUevent_st* e : rs.events) I.record(e, I.link);
    return;
  }
  const StepScalars& k = rs.desc.weight_decay ? I.k_decay : I.k_plain;
  if (rs.dma) {
    I.update_gpu_dma(rs, k);
  } else {
    I.update_gpu(rs, k);
  }
}

void AdamW::update_all(const std::function<void(std::size_t)>& launched) {
  Impl& I = *impl_;
  auto update = [&](std::size_t r) {
    update_region(r);
    if (launched) launched(r);
  };
  for (std::size_t r = 0; r < I.regions.size(); ++r) {
    if (I.regions[r].path == Path::cpu && !I.regions[r].updated) update(r);
  }
  I.update_gpu_batched(*this, launched);
  for (std::size_t r = 0; r < I.regions.size(); ++r) {
    if (!I.regions[r].updated) update(r);
  }
}

StepResult AdamW::step(double lr, CUstream_st* producer) {
  const StepResult res = begin_step(lr, producer);
  update_all();
  return res;
}

}  // namespace ght::optimizer
