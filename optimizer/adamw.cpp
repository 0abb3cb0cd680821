#include "optimizer/adamw.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "alloc/block.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/topology.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

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
  throw config_error("GHT_OPTIMIZER: '" + std::string(text) +
                     "' is not one of auto|gpu_link|cpu|device");
}

PathChoice path_choice_from_config() {
  return parse_path_choice(config::cfg().get_string(config::Key::GHT_OPTIMIZER));
}

StateType parse_state_type(std::string_view text) {
  return config::parse_enum("GHT_OPT_STATE", text, "fp32|bf16") == "bf16" ? StateType::bf16 : StateType::fp32;
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

// Bytes of one element of state buffer i (0 master, 1 m, 2 v).
std::size_t elem_size(int i, StateType st) { return i == 0 ? sizeof(float) : state_type_size(st); }

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

// dma mode: parameters per chunk (16 MiB per state array per slot) and slots in flight (one
// being filled, one updated, one drained).
constexpr std::size_t kDmaChunk = std::size_t{1} << 22;
constexpr int kDmaSlots = 3;

}  // namespace

namespace {
// Parameters per dma slot: one chunk, no larger than the largest region (small models, small slots).
std::size_t dma_chunk_params(std::size_t largest_region) {
  return std::min(kDmaChunk, (largest_region + 63) / 64 * 64);
}
// Bytes per parameter of one dma slot: fp32 master, m and v.
std::size_t dma_param_bytes(StateType st) { return sizeof(float) + 2 * state_type_size(st); }
// HBM of the slots for chunks of `chunk` parameters: master, m and v per slot.
std::size_t dma_slots_bytes(std::size_t chunk, StateType st) { return dma_param_bytes(st) * kDmaSlots * chunk; }
}  // namespace

std::size_t dma_slot_bytes(std::size_t largest_region, StateType st) {
  return dma_slots_bytes(dma_chunk_params(largest_region), st);
}

// ---- AdamW -----------------------------------------------------------------------------------

struct AdamW::Impl {
  struct RegionState {
    Region desc;
    Path path = Path::cpu;
    StateBuffer st[3];              // master, m, v: views of `mem`
    alloc::unique_block mem[3];
    std::uint64_t key = 0;          // round_key of the name: the bf16 state's rounding stream
    std::size_t chunk = 0;          // parameters per chunk (and per event)
    std::size_t chunks = 1;
    bool grad_on_device = false;
    const void* grad_dev = nullptr;  // GPU address of the gradient (GPU paths)
    bool weight_on_device = false;
    void* weight_dev = nullptr;      // GPU address of the weight (GPU paths, cpu upload)
    bool staged = false;             // cpu path through staging
    bool dma = false;                // gpu_link path in dma mode
    bool updated = false;            // in the current step
    bool speculated = false;         // updated ahead of begin_step, not yet validated
    bool done_ahead = false;         // speculated and settled by begin_step: update_region skips it
    std::vector<CUevent_st*> events;
  };

  AdamWOptions opts;
  std::shared_ptr<alloc::tiered_allocator> alloc;
  std::vector<RegionState> regions;
  bool gpu = false;
  StateType state_type = StateType::fp32;
  std::size_t chunk_elems = 0;
  std::size_t staging_bytes = 0;

  LinkMode link_mode = LinkMode::zero_copy;
  CUstream_st* link = nullptr;      // GPU updates and weight uploads
  CUstream_st* down = nullptr;      // cpu path gradient downloads, dma state write-back
  CUstream_st* up = nullptr;        // dma state reads
  // Gradient norm. Not `link`: there it would queue behind speculative updates (and a previous
  // update), and begin_step, which reads the norm on the host, would wait for them.
  CUstream_st* norm = nullptr;
  CUevent_st* produced = nullptr;
  CUevent_st* step_barrier = nullptr;
  alloc::unique_block dma_mem;      // per slot: (dma_chunk) fp32 master, then m and v of the state type; HBM
  std::size_t dma_chunk = kDmaChunk;  // parameters per slot: kDmaChunk, or the largest region
  CUevent_st* dma_in[kDmaSlots] = {};
  CUevent_st* dma_updated[kDmaSlots] = {};
  CUevent_st* dma_free[kDmaSlots] = {};
  unsigned dma_next = 0;
#ifdef GHT_HAVE_CUDA
  std::unique_ptr<DeviceSumsq> sumsq;
#endif
  alloc::unique_block staging[2];  // host (pinned where the link needs it)
  CUevent_st* grad_ready[2] = {nullptr, nullptr};
  CUevent_st* weight_sent[2] = {nullptr, nullptr};

  // Speculation: per speculated chunk, the master, m, v and bf16 weight it overwrote, in HBM.
  struct SpecChunk {
    std::size_t region = 0, chunk = 0, off = 0, count = 0;
    unsigned char* save = nullptr;  // master, m, v (spec_pad(count) elements each), then count bf16
  };
  alloc::unique_block spec_arena;
  std::size_t spec_cap = 0, spec_used = 0;
  std::vector<SpecChunk> spec;
  double spec_lr = 0;
  StepScalars spec_decay, spec_plain;
  CUevent_st* spec_ready = nullptr;  // the producer's work up to the speculated region
  CUevent_st* spec_fence = nullptr;  // orders link and down around an undo

  bool step_open = false;
  bool skip = false;
  StepScalars k_decay, k_plain;
  std::int64_t t = 0;
  OptimizerStats stats;

  ~Impl() { release(); }

  void release() noexcept {
#ifdef GHT_HAVE_CUDA
    for (CUstream_st* s : {link, down, up, norm}) {
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
    dma_mem.reset();
    spec_arena.reset();
    sumsq.reset();  // its partials are freed on `norm`: before the stream goes
    for (CUstream_st* s : {link, down, up, norm}) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
    }
    link = down = up = norm = nullptr;
#endif
    for (alloc::unique_block& s : staging) s.reset();
    for (RegionState& rs : regions) {
      for (alloc::unique_block& m : rs.mem) m.reset();
    }
  }

  CUevent_st* new_event() {
#ifdef GHT_HAVE_CUDA
    cudaEvent_t e = nullptr;
    GHT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
#else
    return nullptr;
#endif
  }

  void record(CUevent_st* e, CUstream_st* s) {
#ifdef GHT_HAVE_CUDA
    if (e != nullptr) GHT_CUDA_TRY(cudaEventRecord(e, s));
#else
    (void)e;
    (void)s;
#endif
  }

  void sync_event(CUevent_st* e) {
#ifdef GHT_HAVE_CUDA
    if (e != nullptr) GHT_CUDA_TRY(cudaEventSynchronize(e));
#else
    (void)e;
#endif
  }

  // Where the gradient and weight live, their GPU aliases, and the chunking they imply.
  void configure(RegionState& rs) {
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
        rs.chunk = round_down(staging_bytes / (grad_type_size(d.grad_type) + sizeof(bf16)), 64);
      } else {
        rs.chunk = d.n;
      }
    }
    rs.chunks = (d.n + rs.chunk - 1) / rs.chunk;
    if (gpu) {
      while (rs.events.size() < rs.chunks) rs.events.push_back(new_event());
    }
  }

  void ensure_dma() {
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

  void ensure_staging() {
    if (staging[0]) return;
    for (alloc::unique_block& s : staging) {
      s = alloc::unique_block(*alloc, staging_bytes, {TensorClass::other, "optimizer.staging", TierKind::host, false});
    }
    for (CUevent_st*& e : grad_ready) e = new_event();
    for (CUevent_st*& e : weight_sent) e = new_event();
  }

  // Layout of a staging slot for the cpu path: gradients first, bf16 weights after.
  unsigned char* slot_grad(int slot) { return staging[slot].as<unsigned char>(); }
  bf16* slot_weight(const RegionState& rs, int slot) {
    const std::size_t gbytes = rs.chunk * grad_type_size(rs.desc.grad_type);
    return reinterpret_cast<bf16*>(staging[slot].as<unsigned char>() + (gbytes + 63) / 64 * 64);
  }

  std::size_t esize(int i) const { return elem_size(i, state_type); }

  AdamWSpan span(const RegionState& rs, std::size_t off, std::size_t count, bool device) const {
    AdamWSpan s;
    const std::size_t gsize = grad_type_size(rs.desc.grad_type);
    auto f = [&](int i) {
      return static_cast<unsigned char*>(device ? rs.st[i].device : rs.st[i].host) + off * esize(i);
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

  void update_gpu(RegionState& rs, const StepScalars& k, bool speculative = false) {
#ifdef GHT_HAVE_CUDA
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      const std::size_t off = c * rs.chunk;
      const AdamWSpan s = span(rs, off, std::min(rs.chunk, rs.desc.n - off), true);
      if (speculative) save_for_undo(rs, c, s.master, s.m, s.v);
      adamw_gpu(s, k, link);
      record(rs.events[c], link);
    }
#else
    (void)rs;
    (void)k;
    GHT_FAIL("GPU optimizer path in a build without CUDA");
#endif
  }

  // dma mode: per chunk, state goes host -> slot on `up`, the kernel updates the slot on `link`,
  // state goes slot -> host on `down`; slots rotate so the three stages overlap, and the two
  // copy directions run on separate copy engines at the same time.
  void update_gpu_dma(RegionState& rs, const StepScalars& k, bool speculative = false) {
#ifdef GHT_HAVE_CUDA
    const std::size_t gsize = grad_type_size(rs.desc.grad_type);
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      const std::size_t off = c * rs.chunk, count = std::min(rs.chunk, rs.desc.n - off);
      const unsigned slot = dma_next++ % kDmaSlots;
      // The slot's master, m and v arrays, each dma_chunk elements (multiples of 64: aligned).
      unsigned char* slot_base = dma_mem.as<unsigned char>() + slot * dma_param_bytes(state_type) * dma_chunk;
      unsigned char* arr[3] = {slot_base, slot_base + esize(0) * dma_chunk,
                               slot_base + (esize(0) + esize(1)) * dma_chunk};
      GHT_CUDA_TRY(cudaStreamWaitEvent(up, dma_free[slot], 0));  // slot drained
      for (int i = 0; i < 3; ++i) {
        GHT_CUDA_TRY(cudaMemcpyAsync(arr[i], static_cast<const unsigned char*>(rs.st[i].host) + off * esize(i),
                                     count * esize(i), cudaMemcpyHostToDevice, up));
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
      adamw_gpu(s, k, link);
      record(dma_updated[slot], link);
      GHT_CUDA_TRY(cudaStreamWaitEvent(down, dma_updated[slot], 0));
      for (int i = 0; i < 3; ++i) {
        GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<unsigned char*>(rs.st[i].host) + off * esize(i), arr[i],
                                     count * esize(i), cudaMemcpyDeviceToHost, down));
      }
      record(dma_free[slot], down);
      record(rs.events[c], down);  // weights and host state of the chunk are final
    }
#else
    (void)rs;
    (void)k;
#endif
  }

  // ---- speculation ----
  // Elements per saved array: a multiple of 8 keeps every array 16-byte aligned, so the undo
  // recompute takes the same (vector) kernel path as the update it replaces.
  static std::size_t spec_pad(std::size_t count) { return (count + 7) / 8 * 8; }
  // Byte offset of saved array i in a chunk's save: master, m, v, then the bf16 weight (i = 3).
  std::size_t spec_offset(std::size_t count, int i) const {
    std::size_t o = 0;
    for (int j = 0; j < i; ++j) o += spec_pad(count) * esize(j);
    return o;
  }
  std::size_t spec_bytes(std::size_t count) const {
    return (spec_offset(count, 3) + count * sizeof(bf16) + 255) / 256 * 256;
  }
  std::size_t region_spec_bytes(const RegionState& rs) const {
    std::size_t b = 0;
    for (std::size_t c = 0; c < rs.chunks; ++c) b += spec_bytes(std::min(rs.chunk, rs.desc.n - c * rs.chunk));
    return b;
  }

  // On `link`, before the chunk's kernel: copy the state it will overwrite (wherever the kernel
  // reads it: mapped host memory or a dma slot) and its bf16 weight into the arena.
  void save_for_undo(RegionState& rs, std::size_t c, const float* master, const void* m, const void* v) {
#ifdef GHT_HAVE_CUDA
    SpecChunk sc;
    sc.region = static_cast<std::size_t>(&rs - regions.data());
    sc.chunk = c;
    sc.off = c * rs.chunk;
    sc.count = std::min(rs.chunk, rs.desc.n - sc.off);
    sc.save = spec_arena.as<unsigned char>() + spec_used;
    spec_used += spec_bytes(sc.count);
    const void* src[3] = {master, m, v};
    for (int i = 0; i < 3; ++i) {
      GHT_CUDA_TRY(cudaMemcpyAsync(sc.save + spec_offset(sc.count, i), src[i], sc.count * esize(i),
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

  // The speculation did not hold: recompute every speculated chunk from its saved state with this
  // step's scalars (redo), or put the saved bytes back (the step is skipped), and write the
  // result over the speculative one. Same kernel and inputs as the non-speculative update.
  void undo_speculation(bool redo) {
#ifdef GHT_HAVE_CUDA
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
        adamw_gpu(s, rs.desc.weight_decay ? k_decay : k_plain, link);
      } else if (s.weight != nullptr) {
        GHT_CUDA_TRY(cudaMemcpyAsync(s.weight, sc.save + spec_offset(sc.count, 3), sc.count * sizeof(bf16),
                                     cudaMemcpyDefault, link));
      }
      for (int i = 0; i < 3; ++i) {
        void* dst = rs.st[i].host != nullptr ? rs.st[i].host : rs.st[i].device;
        GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + sc.off * esize(i), saved[i],
                                     sc.count * esize(i), cudaMemcpyDefault, link));
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

  // The undo arena: GHT_OPT_SPECULATE bytes (or opts.speculate_bytes) when some region takes the
  // gpu_link path, capped so that GHT_HBM_HEADROOM stays free.
  void reserve_speculation() {
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

  // begin_step's verdict on this step's speculation: keep it, or undo it (recompute with the
  // step's scalars when the step is taken, restore when it is skipped).
  void settle_speculation(StepResult& res, bool undo) {
    if (spec.empty()) return;
    for (const SpecChunk& sc : spec) res.speculated_params += sc.count;
    stats.steps_speculated += 1;
    if (undo) {
      undo_speculation(res.taken);
      res.speculation_undone = true;
      stats.speculations_undone += 1;
    }
    for (RegionState& rs : regions) rs.done_ahead = rs.speculated;
    end_speculation();
  }

  void end_speculation() {
    spec.clear();
    spec_used = 0;
    for (RegionState& rs : regions) rs.speculated = false;
  }

  void update_cpu(RegionState& rs, const StepScalars& k) {
    if (!rs.staged) {
      adamw_cpu(span(rs, 0, rs.desc.n, false), k, opts.cpu_threads);
      for (CUevent_st* e : rs.events) record(e, link);
      return;
    }
#ifdef GHT_HAVE_CUDA
    const std::size_t gsize = grad_type_size(rs.desc.grad_type);
    const auto* gsrc = static_cast<const unsigned char*>(rs.desc.grad);
    auto count_of = [&](std::size_t c) { return std::min(rs.chunk, rs.desc.n - c * rs.chunk); };
    auto start_grad = [&](std::size_t c) {
      if (!rs.grad_on_device) return;
      const int slot = static_cast<int>(c % 2);
      GHT_CUDA_TRY(cudaMemcpyAsync(slot_grad(slot), gsrc + c * rs.chunk * gsize,
                                   count_of(c) * gsize, cudaMemcpyDeviceToHost, down));
      record(grad_ready[slot], down);
    };
    start_grad(0);
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      const int slot = static_cast<int>(c % 2);
      // The other slot's gradients (chunk c-1) were consumed synchronously: refill it now so the
      // download of chunk c+1 overlaps with the update of chunk c.
      if (c + 1 < rs.chunks) start_grad(c + 1);
      const std::size_t off = c * rs.chunk, count = count_of(c);
      AdamWSpan s = span(rs, off, count, false);
      if (rs.grad_on_device) {
        sync_event(grad_ready[slot]);
        s.grad = slot_grad(slot);
      }
      if (rs.weight_on_device) {
        sync_event(weight_sent[slot]);  // this slot's previous upload has left
        s.weight = slot_weight(rs, slot);
      }
      adamw_cpu(s, k, opts.cpu_threads);
      if (rs.weight_on_device) {
        GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<bf16*>(rs.weight_dev) + off, s.weight,
                                     count * sizeof(bf16), cudaMemcpyHostToDevice, link));
        record(weight_sent[slot], link);
      }
      record(rs.events[c], link);
    }
#else
    (void)k;
    GHT_FAIL("region '" + rs.desc.name + "': staged cpu path in a build without CUDA");
#endif
  }

  // n fp32 values into state array i of rs: m and v in bf16 are rounded to nearest even (exact
  // for values a bf16 state held: saving widens them, so a round trip keeps every byte).
  void copy_in(const RegionState& rs, int i, const float* src) {
    if (src == nullptr) return;
    const std::size_t n = rs.desc.n;
    std::vector<std::uint16_t> narrowed;
    const void* bytes = src;
    if (esize(i) == sizeof(bf16)) {
      narrowed.resize(n);
      for (std::size_t j = 0; j < n; ++j) narrowed[j] = float_to_bf16_bits(src[j]);
      bytes = narrowed.data();
    }
    const StateBuffer& b = rs.st[i];
    if (b.host != nullptr) {
      std::memcpy(b.host, bytes, n * esize(i));
      return;
    }
#ifdef GHT_HAVE_CUDA
    GHT_CUDA_TRY(cudaMemcpy(b.device, bytes, n * esize(i), cudaMemcpyHostToDevice));
    // From pageable memory the copy may still be in flight on the legacy stream, which the
    // optimizer's non-blocking streams do not wait for.
    GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));
#endif
  }

  // State array i of rs as n fp32 values (bf16 m and v widened, exactly).
  void copy_out(const RegionState& rs, int i, float* dst) const {
    if (dst == nullptr) return;
    const std::size_t n = rs.desc.n;
    const StateBuffer& b = rs.st[i];
    std::vector<std::uint16_t> narrow(esize(i) == sizeof(bf16) ? n : 0);
    void* bytes = narrow.empty() ? static_cast<void*>(dst) : narrow.data();
    if (b.host != nullptr) {
      std::memcpy(bytes, b.host, n * esize(i));
    } else {
#ifdef GHT_HAVE_CUDA
      GHT_CUDA_TRY(cudaMemcpy(bytes, b.device, n * esize(i), cudaMemcpyDeviceToHost));
#endif
    }
    for (std::size_t j = 0; j < narrow.size(); ++j) dst[j] = bf16_bits_to_float(narrow[j]);
  }

  void zero(const RegionState& rs, int i) {
    const StateBuffer& b = rs.st[i];
    const std::size_t bytes = rs.desc.n * esize(i);
    if (b.host != nullptr) {
      zero_host(b.host, bytes, opts.cpu_threads);  // first touch by the team
      return;
    }
#ifdef GHT_HAVE_CUDA
    GHT_CUDA_TRY(cudaMemset(b.device, 0, bytes));
    GHT_CUDA_TRY(cudaStreamSynchronize(nullptr));  // see copy_in
#endif
  }

  RegionState& at(std::size_t r) {
    GHT_EXPECTS(r < regions.size(), "region index " + std::to_string(r) + " out of range (" +
                                        std::to_string(regions.size()) + " regions)");
    return regions[r];
  }
};

AdamW::AdamW(std::vector<Region> regions, AdamWOptions opts,
             std::shared_ptr<alloc::tiered_allocator> alloc)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.opts = opts;
  I.gpu = detail::gpu_available();
  const PathChoice choice = opts.path ? *opts.path : path_choice_from_config();
  I.link_mode = opts.link_mode ? *opts.link_mode : link_mode_from_config();
  I.state_type = opts.state_type ? *opts.state_type : state_type_from_config();
  if (choice == PathChoice::gpu_link || choice == PathChoice::device) {
    GHT_EXPECTS(I.gpu, "GHT_OPTIMIZER=" + std::string(to_string(choice)) +
                           " needs a GPU, and none is available");
  }
  if (!alloc) alloc = alloc::make_default_tiered_allocator();
  I.alloc = std::move(alloc);
  // The choice pins the state's tier; `auto` leaves it to the plan installed in the allocator.
  std::optional<TierKind> state_tier;
  if (choice == PathChoice::device) state_tier = TierKind::hbm;
  if (choice == PathChoice::gpu_link || choice == PathChoice::cpu) state_tier = TierKind::host;

  std::size_t chunk_bytes = opts.chunk_elems * sizeof(float);
  if (chunk_bytes == 0) {
    chunk_bytes = config::cfg().get_size(config::Key::GHT_OPT_CHUNK).resolve(0, "GHT_OPT_CHUNK");
  }
  // Multiples of 64 parameters keep every chunk's start 16-byte aligned for the vector kernel.
  I.chunk_elems = round_down(chunk_bytes / sizeof(float), 64);
  I.staging_bytes = opts.staging_bytes;
  if (I.staging_bytes == 0) {
    I.staging_bytes =
        config::cfg().get_size(config::Key::GHT_STAGING_BYTES).resolve(0, "GHT_STAGING_BYTES");
  }
  I.staging_bytes = round_down(I.staging_bytes, 64 * 8);

#ifdef GHT_HAVE_CUDA
  if (I.gpu) {
    cudaStream_t s = nullptr;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    I.link = s;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    I.down = s;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    I.up = s;
    GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    I.norm = s;
    I.produced = I.new_event();
    I.spec_ready = I.new_event();
    I.spec_fence = I.new_event();
    I.step_barrier = I.new_event();
  }
#endif

  std::size_t largest = 0;
  for (const Region& d : regions) largest = std::max(largest, d.n);
  I.dma_chunk = dma_chunk_params(largest);

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
      rs.mem[i] = alloc::unique_block(*I.alloc, rs.desc.n * I.esize(i), req);
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
    for (int i = 0; i < 3; ++i) I.zero(rs, i);
    I.configure(rs);
  }
  I.reserve_speculation();
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

void AdamW::set_step_count(std::int64_t t) {
  GHT_EXPECTS(t >= 0, "AdamW step count must be >= 0, got " + std::to_string(t));
  cancel_speculation();
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

CUevent_st* AdamW::chunk_event(std::size_t r, std::size_t c) const {
  const Impl::RegionState& rs = impl_->at(r);
  GHT_EXPECTS(c < rs.chunks, "chunk " + std::to_string(c) + " out of range for region '" +
                                 rs.desc.name + "' (" + std::to_string(rs.chunks) + " chunks)");
  return impl_->gpu ? rs.events[c] : nullptr;
}

CUevent_st* AdamW::region_event(std::size_t r) const {
  return chunk_event(r, impl_->at(r).chunks - 1);
}

void AdamW::synchronize() const {
#ifdef GHT_HAVE_CUDA
  for (CUstream_st* s : {impl_->link, impl_->down, impl_->up, impl_->norm}) {
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
  GHT_EXPECTS(impl_->spec.empty(), "AdamW::save_state: " + std::to_string(impl_->spec.size()) +
                                       " speculated chunks wait for begin_step or cancel_speculation");
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
#ifdef GHT_HAVE_CUDA
  if (I.gpu) {
    // Everything the producer queued (backward, accumulation) precedes every read of gradients
    // and every overwrite of weights by this step.
    I.record(I.produced, producer);
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.link, I.produced, 0));
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.down, I.produced, 0));
    // dma mode: this step's state reads must follow the previous step's write-backs (a
    // speculation already ordered them, and the write-backs on `down` since then are its own).
    if (I.spec.empty()) {
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
  GHT_EXPECTS(I.spec.empty() || lr == I.spec_lr, "AdamW::speculate_region('" + rs.desc.name +
                                                     "'): lr differs from this step's earlier speculation");
  if (!I.gpu || rs.path != Path::gpu_link || !rs.grad_on_device || rs.speculated) return Speculation::ineligible;
  if (I.spec_cap == 0 || I.spec_used + I.region_spec_bytes(rs) > I.spec_cap) return Speculation::no_room;
#ifdef GHT_HAVE_CUDA
  if (I.spec.empty()) {
    I.spec_lr = lr;
    I.spec_decay = make_step_scalars(I.opts.hyper, lr, I.t + 1, true, 1.0);
    I.spec_plain = make_step_scalars(I.opts.hyper, lr, I.t + 1, false, 1.0);
    // As in begin_step: this step's dma reads follow the previous step's write-backs.
    I.record(I.step_barrier, I.down);
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.up, I.step_barrier, 0));
  }
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
  if (I.spec.empty()) return;
  I.undo_speculation(false);
  I.end_speculation();
}

std::size_t AdamW::speculate_capacity() const { return impl_->spec_cap; }

void AdamW::update_region(std::size_t r) {
  Impl& I = *impl_;
  Impl::RegionState& rs = I.at(r);
  GHT_EXPECTS(I.step_open, "AdamW::update_region('" + rs.desc.name + "') before begin_step");
  GHT_EXPECTS(!rs.updated, "AdamW::update_region('" + rs.desc.name + "') twice in one step");
  rs.updated = true;
  if (rs.done_ahead) return;  // speculated; begin_step kept, recomputed or restored it
  if (I.skip) {
    for (CUevent_st* e : rs.events) I.record(e, I.link);
    return;
  }
  const StepScalars& k = rs.desc.weight_decay ? I.k_decay : I.k_plain;
  if (rs.path == Path::cpu) {
    I.update_cpu(rs, k);
  } else if (rs.dma) {
    I.update_gpu_dma(rs, k);
  } else {
    I.update_gpu(rs, k);
  }
}

StepResult AdamW::step(double lr, CUstream_st* producer) {
  const StepResult res = begin_step(lr, producer);
  for (std::size_t r = 0; r < num_regions(); ++r) update_region(r);
  return res;
}

}  // namespace ght::optimizer
