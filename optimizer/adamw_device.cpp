// AdamW's in-place GPU updates: regions whose state the kernel reads where it lives (device: HBM,
// on the `hbm` stream with GHT_OPT_SIDE_BY_SIDE; gpu_link zero-copy: mapped or coherent host
// memory, on `link`), one region at a time or batched over regions in update_all.
#include <functional>
#include <vector>

#include "optimizer/adamw.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {

void AdamW::Impl::update_gpu(RegionState& rs, const StepScalars& k, bool speculative) {
#ifdef GHT_HAVE_CUDA
  for (std::size_t c = 0; c < rs.chunks; ++c) {
    const std::size_t off = c * rs.chunk;
    const AdamWSpan s = span(rs, off, count_of(rs, c), true);
    if (speculative) save_for_undo(rs, c, s.master, s.m, s.v);
    adamw_gpu(s, k, stream_of(rs), kernel_sms(rs));
    record(rs.events[c], stream_of(rs));
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
  // Side by side, one batch per stream: device regions on `hbm`, gpu_link zero-copy regions on
  // `link`; otherwise one batch for both, on `link`.
  struct Queue {
    CUstream_st* stream;
    AdamWBatch batch;
    std::vector<CUevent_st*> pending;  // chunk events of the queued spans: recorded after their launch
  };
  Queue queues[2] = {{link, AdamWBatch(link, batch_spans), {}}, {hbm, AdamWBatch(hbm, batch_spans), {}}};
  std::vector<std::size_t> pending_regions;  // regions whose last chunk is among them
  auto flush = [&](Queue& q) {
    q.batch.flush();
    for (CUevent_st* e : q.pending) record(e, q.stream);
    q.pending.clear();
  };
  auto launch = [&] {
    for (Queue& q : queues) flush(q);
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
    Queue& q = queues[stream_of(rs) == hbm ? 1 : 0];
    for (std::size_t c = 0; c < rs.chunks; ++c) {
      const AdamWSpan s = span(rs, c * rs.chunk, count_of(rs, c), true);
      if (!q.batch.fits(s, k, sms)) flush(q);  // r's earlier chunks launch; r is reported later
      q.batch.add(s, k, sms);
      q.pending.push_back(rs.events[c]);
    }
    pending_regions.push_back(r);  // reported by the launch that records its last chunk's event
  }
  launch();
#else
  (void)self;
  (void)launched;
#endif
}

}  // namespace ght::optimizer
