// The CUPTI activity tracer (see kernel_trace.hpp). CUPTI hands full record buffers to a
// process-wide callback on its own thread; the live tracer's Collector receives them. The op
// labels are joined in at finish(): a kernel record carries the correlation id of the API call
// that launched it, and an external-correlation record maps that id to the op's id.
#include "trainer/cuda/kernel_trace.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "alloc/block.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUPTI
#include <cupti.h>
#endif

namespace ght::trainer {

#ifdef GHT_HAVE_CUPTI

bool kernel_trace_built() { return true; }

namespace {

[[noreturn]] void throw_cupti_error(CUptiResult r, const char* call, const char* file, int line) {
  const char* what = nullptr;
  if (cuptiGetResultString(r, &what) != CUPTI_SUCCESS || what == nullptr) what = "unknown status";
  std::string msg = std::string("CUPTI error ") + std::to_string(static_cast<int>(r)) + " (" + what + ") in " +
                    call + " at " + file + ":" + std::to_string(line);
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) {
    msg += "; profiling is restricted to admin users on this machine (driver option "
           "NVreg_RestrictProfilingToAdminUsers)";
  }
  throw ght::cuda_error(msg);
}

}  // namespace

// Check a CUPTI call; throw ght::cuda_error naming the call, its status and file:line.
#define GHT_CUPTI_TRY(call)                                                   \
  do {                                                                        \
    CUptiResult ght_cupti_r_ = (call);                                        \
    if (ght_cupti_r_ != CUPTI_SUCCESS) [[unlikely]] {                         \
      ::ght::trainer::throw_cupti_error(ght_cupti_r_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

namespace {

constexpr std::size_t kBufferBytes = std::size_t{8} << 20;  // CUPTI suggests 1-10 MB
constexpr CUpti_ExternalCorrelationKind kOpKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
// External ids are attached to API records, so the runtime and driver API kinds are on too
// (cuBLAS and cuDNN launch through the driver API); their records themselves are skipped.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

// A GPU record as delivered, before its op label is known.
struct RawActivity {
  GpuActivity::Kind kind;
  std::uint32_t name;  // index into Collector::names
  std::uint32_t correlation, stream;
  std::uint64_t start, end, bytes;
};

const char* memcpy_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy (array)";
  }
}

// What the buffer callbacks collect for the live tracer (filled on CUPTI's thread).
struct Collector {
  std::vector<RawActivity> acts;
  std::unordered_map<std::uint32_t, std::uint64_t> op_of;  // CUPTI correlation id -> op id
  std::vector<std::string> names;                           // kernel names as CUPTI gives them
  std::unordered_map<std::string, std::uint32_t> name_index;
  std::uint64_t dropped = 0;

  std::uint32_t intern(const char* name) {
    const auto [it, added] = name_index.try_emplace(name, static_cast<std::uint32_t>(names.size()));
    if (added) names.emplace_back(name);
    return it->second;
  }

  void parse(std::uint8_t* buffer, std::size_t valid) {
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          acts.push_back({GpuActivity::Kind::kernel, intern(k->name != nullptr ? k->name : "(unnamed kernel)"),
                          k->correlationId, k->streamId, k->start, k->end, 0});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          acts.push_back({GpuActivity::Kind::memcpy, intern(memcpy_name(m->copyKind)), m->correlationId,
                          m->streamId, m->start, m->end, m->bytes});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          acts.push_back({GpuActivity::Kind::memset, intern("memset"), m->correlationId, m->streamId, m->start,
                          m->end, m->bytes});
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
          if (x->externalKind == kOpKind) op_of[x->correlationId] = x->externalId;
          break;
        }
        default:
          break;  // API records: only their external-correlation records matter
      }
    }
  }
};

constexpr std::size_t kPoolBuffers = 32;  // 256 MiB: a traced step fills a few (bench/results)

std::mutex g_mu;                   // guards the two below and what they point to
Collector* g_collector = nullptr;  // the live tracer's, or null
// The live tracer's record buffers not lent to CUPTI. The callbacks only take and return them:
// they make no CUDA or allocator call, since CUPTI calls buffer_requested from inside CUDA API
// calls, the allocator's own (cudaHostAlloc) included, which would re-enter g_mu or the
// allocator's lock (the trace hung that way, bench/results/2026-12-01-h200-offload.md).
std::vector<std::uint8_t*>* g_free = nullptr;
std::size_t g_lent = 0;  // buffers CUPTI holds

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  // No tracer or an empty pool hands CUPTI no buffer: it drops records and counts them.
  *buffer = nullptr;
  *max_records = 0;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_free != nullptr && !g_free->empty()) {
    *buffer = g_free->back();
    g_free->pop_back();
    ++g_lent;
  }
  *size = *buffer != nullptr ? kBufferBytes : 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, std::uint32_t stream, std::uint8_t* buffer, std::size_t /*size*/,
                               std::size_t valid) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_collector != nullptr) {
    try {
      g_collector->parse(buffer, valid);
    } catch (const std::bad_alloc&) {
      ++g_collector->dropped;  // a record we could not keep (CUPTI's thread must not throw)
    }
    std::size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g_collector->dropped += dropped;
  }
  if (buffer != nullptr && g_free != nullptr) {
    g_free->push_back(buffer);  // reserved in the constructor: no allocation here
    --g_lent;
  }
}

std::string demangle(const std::string& name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;  // not a mangled name (C kernels, "memset")
  std::string out(d);
  std::free(d);
  return out;
}

}  // namespace

struct KernelTracer::Impl {
  Collector col;
  std::unordered_map<std::string, std::uint64_t> id_of;  // op label -> external id (1-based)
  std::vector<std::string> labels;                        // external id - 1 -> op label
  std::map<std::string, std::int64_t, std::less<>> calls;
  std::mutex labels_mu;  // id_of, labels, calls: worker threads label their work too (ThreadOp)
  bool pushed = false;   // set_op's id, on the owning thread
  std::vector<CUpti_ActivityKind> enabled;
  std::shared_ptr<alloc::tiered_allocator> alloc;  // kept alive while its blocks are
  std::vector<alloc::unique_block> pool;            // the record buffers, from `alloc`
  std::vector<std::uint8_t*> free_list;

  // Everything CUPTI-side undone, ignoring errors: for the destructor and a failed start.
  void stop() noexcept {
    if (pushed) (void)cuptiActivityPopExternalCorrelationId(kOpKind, nullptr);
    pushed = false;
    for (CUpti_ActivityKind k : enabled) (void)cuptiActivityDisable(k);
    if (!enabled.empty()) (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    enabled.clear();
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_collector == &col) g_collector = nullptr;
    if (g_free == &free_list) {
      g_free = nullptr;
      if (g_lent != 0) {
        // CUPTI still holds buffers after a forced flush: never free memory it may write.
        for (auto& b : pool) (void)b.release_ownership();
        g_lent = 0;
      }
    }
  }
};

KernelTracer::KernelTracer(std::shared_ptr<alloc::tiered_allocator> alloc) : impl_(std::make_unique<Impl>()) {
  GHT_EXPECTS(alloc != nullptr, "KernelTracer: null allocator");
  // Every buffer is taken now, before any activity is enabled (see g_free).
  impl_->alloc = alloc;
  for (std::size_t i = 0; i < kPoolBuffers; ++i) {
    auto& b = impl_->pool.emplace_back(*alloc, kBufferBytes,
                                       alloc::AllocRequest{TensorClass::other, "kernel_trace.cupti_buffers", TierKind::host, false});
    impl_->free_list.push_back(b.as<std::uint8_t>());
  }
  impl_->free_list.reserve(kPoolBuffers);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    GHT_EXPECTS(g_collector == nullptr && g_free == nullptr,
                "KernelTracer: another tracer is alive (CUPTI's buffers are process-wide)");
    g_collector = &impl_->col;
    g_free = &impl_->free_list;
    g_lent = 0;
  }
  try {
    GHT_CUPTI_TRY(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (CUpti_ActivityKind k : kKinds) {
      GHT_CUPTI_TRY(cuptiActivityEnable(k));
      impl_->enabled.push_back(k);
    }
  } catch (...) {
    impl_->stop();
    throw;
  }
}

KernelTracer::~KernelTracer() {
  if (impl_) impl_->stop();
}

std::uint64_t KernelTracer::label_id(std::string_view label) {
  Impl& I = *impl_;
  std::lock_guard<std::mutex> lk(I.labels_mu);
  auto it = I.id_of.find(std::string(label));
  if (it == I.id_of.end()) {
    I.labels.emplace_back(label);
    it = I.id_of.emplace(std::string(label), I.labels.size()).first;
  }
  I.calls[I.labels[it->second - 1]] += 1;
  return it->second;
}

void KernelTracer::set_op(std::string_view label) {
  Impl& I = *impl_;
  const std::uint64_t id = label_id(label);
  if (I.pushed) GHT_CUPTI_TRY(cuptiActivityPopExternalCorrelationId(kOpKind, nullptr));
  I.pushed = false;
  GHT_CUPTI_TRY(cuptiActivityPushExternalCorrelationId(kOpKind, id));
  I.pushed = true;
}

KernelTracer::ThreadOp::ThreadOp(KernelTracer& tracer, std::string_view label) {
  GHT_CUPTI_TRY(cuptiActivityPushExternalCorrelationId(kOpKind, tracer.label_id(label)));
  pushed_ = true;
}

KernelTracer::ThreadOp::~ThreadOp() {
  if (pushed_) (void)cuptiActivityPopExternalCorrelationId(kOpKind, nullptr);
}

std::uint64_t KernelTracer::now_ns() {
  std::uint64_t t = 0;
  GHT_CUPTI_TRY(cuptiGetTimestamp(&t));
  return t;
}

std::vector<GpuActivity> KernelTracer::finish(TraceWindow& window) {
  Impl& I = *impl_;
  if (I.pushed) GHT_CUPTI_TRY(cuptiActivityPopExternalCorrelationId(kOpKind, nullptr));
  I.pushed = false;
  for (CUpti_ActivityKind k : I.enabled) GHT_CUPTI_TRY(cuptiActivityDisable(k));
  I.enabled.clear();
  GHT_CUPTI_TRY(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));  // blocks until delivered
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_collector = nullptr;
  }
  std::size_t dropped = 0;  // the global queue's, not yet counted by a buffer callback
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) I.col.dropped += dropped;

  std::vector<std::string> names;
  names.reserve(I.col.names.size());
  for (const auto& n : I.col.names) names.push_back(demangle(n));
  std::vector<GpuActivity> out;
  out.reserve(I.col.acts.size());
  for (const RawActivity& r : I.col.acts) {
    GpuActivity a;
    a.kind = r.kind;
    a.name = names[r.name];
    a.stream = r.stream;
    a.start_ns = r.start;
    a.end_ns = r.end;
    a.bytes = r.bytes;
    if (const auto it = I.col.op_of.find(r.correlation); it != I.col.op_of.end() && it->second >= 1 &&
                                                         it->second <= I.labels.size()) {
      a.op = I.labels[it->second - 1];
    }
    out.push_back(std::move(a));
  }
  window.op_calls = I.calls;
  window.dropped_records = I.col.dropped;
  I.col = Collector{};
  return out;
}

#else  // built without CUPTI

bool kernel_trace_built() { return false; }

struct KernelTracer::Impl {};

KernelTracer::KernelTracer(std::shared_ptr<alloc::tiered_allocator> /*alloc*/) {
  throw ght::logic_error("kernel tracing: this build has no CUPTI (built without CUPTI: CUDA::cupti was not found "
                         "at configure time)");
}
KernelTracer::~KernelTracer() = default;
void KernelTracer::set_op(std::string_view /*label*/) {}
std::uint64_t KernelTracer::label_id(std::string_view /*label*/) { return 0; }
KernelTracer::ThreadOp::ThreadOp(KernelTracer& /*tracer*/, std::string_view /*label*/) {}
KernelTracer::ThreadOp::~ThreadOp() = default;
std::uint64_t KernelTracer::now_ns() { return 0; }
std::vector<GpuActivity> KernelTracer::finish(TraceWindow& /*window*/) { return {}; }

#endif

}  // namespace ght::trainer
