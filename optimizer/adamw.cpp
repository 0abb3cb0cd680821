// AdamW: construction (the state's blocks, the streams, each region's layout), the step (begin_step's
// gradient norm and clip, update_region, update_all) and the state's accessors. The update paths
// are in their own files: adamw_device.cpp (in place on the GPU), adamw_link.cpp (gpu_link in dma
// mode), adamw_cpu_path.cpp (the cpu worker), with adamw_path_choice.cpp choosing among them,
// adamw_state.cpp for the state precision and adamw_speculate.cpp for speculation; the shared
// state is detail/adamw_impl.hpp.
#include "optimizer/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "alloc/block.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

using detail::kDmaSlots;
using detail::kStateClass;
using detail::round_down;

#ifdef GHT_HAVE_CUDA
namespace detail {

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

}  // namespace detail
#endif

// ---- Impl: CUDA helpers, regions ---------------------------------------------------------------

void AdamW::Impl::release() noexcept {
  worker.reset();  // finishes its job in progress; its streams are still here
#ifdef GHT_HAVE_CUDA
  for (CUstream_st* s : {link, hbm, down, up, norm, cpu_down, cpu_up}) {
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
  for (CUstream_st* s : {link, hbm, down, up, norm, cpu_down, cpu_up}) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  link = hbm = down = up = norm = cpu_down = cpu_up = nullptr;
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

// The optimizer's streams and its step events (nothing without a GPU).
void AdamW::Impl::create_streams() {
#ifdef GHT_HAVE_CUDA
  if (!gpu) return;
  GHT_CUDA_TRY(cudaGetDevice(&device));
  link = detail::make_stream();
  hbm = detail::make_stream();
  down = detail::make_stream();
  up = detail::make_stream();
  norm = detail::make_stream();
  cpu_down = detail::make_stream();
  cpu_up = detail::make_stream();
  produced = new_event();
  spec_ready = new_event();
  spec_fence = new_event();
  step_barrier = new_event();
#endif
}

// Region rs's state blocks (master, m, v) in the allocator: on `state_tier` when the choice pins
// it, spilling unless the choice is device.
void AdamW::Impl::allocate_state(RegionState& rs, PathChoice choice, std::optional<TierKind> state_tier) {
  for (int i = 0; i < 3; ++i) {
    const alloc::AllocRequest req{kStateClass[i], rs.desc.name, state_tier,
                                  /*may_spill=*/choice != PathChoice::device};
    rs.mem[i] = alloc::unique_block(*alloc, bytes(i, rs.desc.n), req);
    rs.st[i] = detail::state_view(rs.mem[i], gpu);
  }
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
    rs.dma = rs.path == Path::gpu_link && link_mode == LinkMode::dma && detail::dma_reachable(rs.st);
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

AdamW::Impl::RegionState& AdamW::Impl::at(std::size_t r) {
  GHT_EXPECTS(r < regions.size(), "region index " + std::to_string(r) + " out of range (" +
                                      std::to_string(regions.size()) + " regions)");
  return regions[r];
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

  I.create_streams();

  std::size_t largest = 0;
  for (const Region& d : regions) largest = std::max(largest, d.n);
  I.dma_chunk = detail::dma_chunk_params(largest, I.state_type);

  std::set<std::string> names;
  I.regions.reserve(regions.size());
  for (Region& d : regions) {
    GHT_EXPECTS(!d.name.empty(), "AdamW: a region has an empty name");
    GHT_EXPECTS(d.n > 0, "AdamW: region '" + d.name + "' has no parameters");
    GHT_EXPECTS(names.insert(d.name).second, "AdamW: duplicate region name '" + d.name + "'");
    Impl::RegionState& rs = I.regions.emplace_back();
    rs.desc = std::move(d);
    rs.key = round_key(rs.desc.name);
    I.allocate_state(rs, choice, state_tier);
    I.choose_path(rs, choice);
  }

  if (choice == PathChoice::split) I.assign_split();

  for (Impl::RegionState& rs : I.regions) {
    for (int i = 0; i < 3; ++i) I.zero(rs, i);
    I.configure(rs);
  }

  I.size_kernels();

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
  for (CUstream_st* s : {impl_->link, impl_->hbm, impl_->down, impl_->up, impl_->norm, impl_->cpu_down, impl_->cpu_up}) {
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
    GHT_CUDA_TRY(cudaStreamWaitEvent(I.hbm, I.produced, 0));
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
    for (CUevent_st* e : rs.events) I.record(e, I.stream_of(rs));
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
  I.split_sms_for_update();
  I.update_gpu_batched(*this, launched);
  for (std::size_t r = 0; r < I.regions.size(); ++r) {
    if (!I.regions[r].updated) update(r);
  }
  I.split_link_sms = 0;  // the next step's speculative updates run beside the backward alone
}

StepResult AdamW::step(double lr, CUstream_st* producer) {
  const StepResult res = begin_step(lr, producer);
  update_all();
  return res;
}

}  // namespace ght::optimizer
