// The cpu path of AdamW: its worker thread and the jobs it runs (adamw.hpp, "The cpu path runs on
// a host thread of the optimizer's own").
//
// Per chunk of a job (staging slots alternate over every staged chunk the worker handles, so the
// download of the next chunk, possibly the next job's first, overlaps this chunk's AdamW and the
// upload of the previous one):
//   gradient in HBM: D2H into the slot on cpu_down (after the job's `ready` event), wait for it;
//   speculate: copy master, m, v (and a host weight) into the chunk's undo copy first;
//   redo: copy the undo copy back first (then the update reads the state the plain step read);
//   adamw_cpu on the pinned team, the bf16 weight into the slot (weight in HBM) or in place;
//   weight in HBM: (speculate: D2H of the old weight into the undo copy) H2D from the slot on
//   cpu_up; the chunk's event on cpu_up.
// restore copies the undo copy back (a weight in HBM by H2D on cpu_up); mark records the events.
#include <cstring>
#include <utility>

#include "optimizer/adamw.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_impl.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace ght::optimizer {

// ---- the worker ---------------------------------------------------------------------------------

namespace detail {

CpuWorker::CpuWorker(int device, Run run) : run_(std::move(run)) {
  thread_ = std::thread([this, device] { loop(device); });
}

CpuWorker::~CpuWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t CpuWorker::push(CpuJob job) {
  std::uint64_t t = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_) std::rethrow_exception(error_);
    t = job.ticket = ++pushed_;
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return t;
}

void CpuWorker::wait(std::uint64_t ticket) const {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= ticket; });
  if (error_ && ticket >= failed_) std::rethrow_exception(error_);
}

void CpuWorker::drain() const {
  std::uint64_t last = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = pushed_;
  }
  wait(last);
}

void CpuWorker::loop(int device) {
#ifdef GHT_HAVE_CUDA
  if (device >= 0 && cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    std::lock_guard<std::mutex> lk(mu_);
    error_ = std::make_exception_ptr(ght::cuda_error("AdamW cpu worker: cudaSetDevice(" + std::to_string(device) + ") failed"));
    failed_ = 1;
  }
#else
  (void)device;
#endif
  // The next job, while the current one runs: a reference into the deque stays valid while
  // other jobs are pushed behind it, and only this thread pops.
  const Peek peek = [this]() -> const CpuJob* {
    std::lock_guard<std::mutex> lk(mu_);
    return queue_.empty() || error_ ? nullptr : &queue_.front();
  };
  for (;;) {
    CpuJob job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      if (error_) {  // failed: the rest is dropped, and waits rethrow
        done_ = job.ticket;
        lk.unlock();
        cv_.notify_all();
        continue;
      }
    }
    std::exception_ptr failure;
    try {
      run_(job, peek);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failure) {
        error_ = failure;
        failed_ = job.ticket;
      }
      done_ = job.ticket;
    }
    cv_.notify_all();
  }
}

}  // namespace detail

// ---- the jobs -----------------------------------------------------------------------------------

using detail::CpuJob;

void AdamW::Impl::ensure_worker() {
  if (worker) return;
  cpu_ticket = std::make_unique<std::atomic<std::uint64_t>[]>(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) cpu_ticket[i].store(0);
  worker = std::make_unique<detail::CpuWorker>(
      gpu ? device : -1, [this](const CpuJob& j, const detail::CpuWorker::Peek& peek) { run_cpu_job(j, peek); });
}

void AdamW::Impl::enqueue_cpu(CpuJob job) {
  const std::size_t r = job.region;
  const RegionState& rs = regions[r];
  if (!on_worker(rs)) {
    run_cpu_job(job, [] { return static_cast<const CpuJob*>(nullptr); });
    return;
  }
  const std::uint64_t t = worker->push(std::move(job));
  cpu_ticket[r].store(t, std::memory_order_release);
}

void AdamW::Impl::wait_cpu_region(std::size_t r) const {
  if (!worker || !on_worker(regions[r])) return;
  worker->wait(cpu_ticket[r].load(std::memory_order_acquire));
}

bool AdamW::Impl::downloads(const CpuJob& job) const {
  const RegionState& rs = regions[job.region];
  const bool computes = job.kind == CpuJob::Kind::update || job.kind == CpuJob::Kind::speculate ||
                        job.kind == CpuJob::Kind::redo;
  return computes && rs.staged && rs.grad_on_device;
}

// Chunk c of the job into `slot`, on cpu_down once the job's gradients are final.
void AdamW::Impl::download(const CpuJob& job, std::size_t c, int slot) {
#ifdef GHT_HAVE_CUDA
  const RegionState& rs = regions[job.region];
  if (job.ready && down_waited != job.ticket) {
    GHT_CUDA_TRY(cudaStreamWaitEvent(cpu_down, job.ready.get(), 0));
    down_waited = job.ticket;
  }
  // The slot's last weight upload may be still reading bytes the gradients now cover (regions
  // of other gradient types lay the slot out differently).
  GHT_CUDA_TRY(cudaStreamWaitEvent(cpu_down, weight_sent[slot], 0));
  const std::size_t gsize = grad_type_size(rs.desc.grad_type);
  GHT_CUDA_TRY(cudaMemcpyAsync(slot_grad(slot), static_cast<const unsigned char*>(rs.desc.grad) + c * rs.chunk * gsize,
                               count_of(rs, c) * gsize, cudaMemcpyDeviceToHost, cpu_down));
  record(grad_ready[slot], cpu_down);
#else
  (void)job;
  (void)c;
#endif
  slot_ticket[slot] = job.ticket;
  slot_chunk[slot] = c;
}

// The slot chunk c of the job computes in: the one its gradients were prefetched into, else the
// next one (downloading them now).
int AdamW::Impl::take_slot(const CpuJob& job, std::size_t c) {
  for (int s = 0; s < 2; ++s) {
    if (slot_ticket[s] == job.ticket && slot_chunk[s] == c) {
      next_slot = 1 - s;
      return s;
    }
  }
  const int s = next_slot;
  next_slot = 1 - s;
  if (downloads(job)) {
    download(job, c, s);
  } else {
    slot_ticket[s] = job.ticket;
    slot_chunk[s] = c;
  }
  return s;
}

// The download after chunk c (the job's next chunk, or the next queued job's first) into the
// other slot, whose previous chunk has been computed.
void AdamW::Impl::prefetch_after(const CpuJob& job, std::size_t c, const detail::CpuWorker::Peek& peek) {
  const RegionState& rs = regions[job.region];
  if (c + 1 < rs.chunks) {
    if (downloads(job)) download(job, c + 1, next_slot);
    return;
  }
  const CpuJob* next = peek();
  if (next != nullptr && downloads(*next)) download(*next, 0, next_slot);
}

void AdamW::Impl::copy_undo(RegionState& rs, std::size_t off, std::size_t count, unsigned char* save, bool to_region) {
  for (int i = 0; i < 3; ++i) {
    unsigned char* state = static_cast<unsigned char*>(rs.st[i].host) + offset(i, off);
    unsigned char* saved = save + spec_offset(count, i);
    copy_host(to_region ? state : saved, to_region ? saved : state, bytes(i, count), opts.cpu_threads);
  }
  if (rs.desc.weight != nullptr && !rs.weight_on_device) {
    auto* w = static_cast<unsigned char*>(rs.desc.weight) + off * sizeof(bf16);
    unsigned char* saved = save + spec_offset(count, 3);
    std::memcpy(to_region ? w : saved, to_region ? saved : w, count * sizeof(bf16));
  }
}

void AdamW::Impl::run_cpu_job(const CpuJob& job, const detail::CpuWorker::Peek& peek) {
  RegionState& rs = regions[job.region];
  using Kind = CpuJob::Kind;
#ifdef GHT_HAVE_CUDA
  // Weights in HBM are overwritten only once the producer is done with them. (Staged regions
  // only: a region without device memory may run on the calling thread, and the bookkeeping
  // is the worker's.)
  if (gpu && job.ready && rs.staged && up_waited != job.ticket) {
    GHT_CUDA_TRY(cudaStreamWaitEvent(cpu_up, job.ready.get(), 0));
    up_waited = job.ticket;
  }
#endif
  // Gradients in host memory are read by the CPU: the producer's work up to `ready` must be done.
  const bool computes = job.kind == Kind::update || job.kind == Kind::speculate || job.kind == Kind::redo;
  if (computes && !downloads(job)) sync_event(job.ready.get());
  for (std::size_t c = 0; c < rs.chunks; ++c) {
    const std::size_t off = c * rs.chunk, count = count_of(rs, c);
    unsigned char* save = job.saves.empty() ? nullptr : job.saves[c];
    if (job.kind == Kind::mark) {
      record_chunk(rs, c, cpu_up);
      continue;
    }
    if (job.kind == Kind::restore) {
      copy_undo(rs, off, count, save, true);
#ifdef GHT_HAVE_CUDA
      if (rs.weight_on_device) {
        GHT_CUDA_TRY(cudaMemcpyAsync(static_cast<bf16*>(rs.weight_dev) + off, save + spec_offset(count, 3),
                                     count * sizeof(bf16), cudaMemcpyHostToDevice, cpu_up));
      }
#endif
      record_chunk(rs, c, cpu_up);
      continue;
    }
    const int slot = rs.staged ? take_slot(job, c) : 0;
    if (rs.staged) prefetch_after(job, c, peek);
    if (job.kind == Kind::redo) copy_undo(rs, off, count, save, true);
    if (job.kind == Kind::speculate) copy_undo(rs, off, count, save, false);
    AdamWSpan s = span(rs, off, count, false);
    if (downloads(job)) {
      sync_event(grad_ready[slot]);
      s.grad = slot_grad(slot);
    }
    if (rs.weight_on_device) {
      sync_event(weight_sent[slot]);  // this slot's previous upload has left
      s.weight = slot_weight(rs, slot);
    }
    adamw_cpu(s, job.k, opts.cpu_threads);
#ifdef GHT_HAVE_CUDA
    if (rs.weight_on_device) {
      bf16* w = static_cast<bf16*>(rs.weight_dev) + off;
      if (job.kind == Kind::speculate) {  // the old weight, for a restore; before the new one lands
        GHT_CUDA_TRY(cudaMemcpyAsync(save + spec_offset(count, 3), w, count * sizeof(bf16), cudaMemcpyDeviceToHost, cpu_up));
      }
      GHT_CUDA_TRY(cudaMemcpyAsync(w, s.weight, count * sizeof(bf16), cudaMemcpyHostToDevice, cpu_up));
      record(weight_sent[slot], cpu_up);
    }
#endif
    record_chunk(rs, c, cpu_up);
  }
}

}  // namespace ght::optimizer
