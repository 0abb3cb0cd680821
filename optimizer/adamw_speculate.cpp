// AdamW's speculation: updating a region ahead of begin_step with the scalars of an unclipped
// step, the undo arenas (HBM for gpu_link chunks, host for cpu regions), and begin_step's verdict
// (keep, recompute or restore).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "optimizer/adamw.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

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

// ---- AdamW: speculation -----------------------------------------------------------------------

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

}  // namespace ght::optimizer
