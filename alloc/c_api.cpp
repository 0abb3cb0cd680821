// The C ABI (alloc/include/ght/ght.h): one process-wide tiered allocator behind extern "C"
// functions that never let an exception out.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "alloc/device_direct.hpp"
#include "alloc/device_pool.hpp"
#include "alloc/managed.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "ght/ght.h"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/log.hpp"
#include "tier/topology.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tier/cuda_check.hpp"
#endif

namespace {

using namespace ght;
using namespace ght::alloc;

thread_local std::string t_error;  // ght_last_error()
thread_local std::string t_stats;  // ght_stats_json()'s buffer
thread_local int t_torch_tier = GHT_TIER_AUTO;  // ght_torch_set_thread_tier()

/// How CUDA kernels reach host-tier blocks.
enum class HostReach { direct, mapped, none };

struct State {
  std::unique_ptr<tiered_allocator> alloc;
  TierKind torch_tier = TierKind::hbm;
  int device = -1;  // device of the hbm tier, -1 without one
  HostReach reach = HostReach::direct;
  pinned_host* pinned = nullptr;

  // Host blocks handed to PyTorch by device address, where that differs from the host address.
  std::mutex map_mu;
  std::unordered_map<void*, void*> dev_to_host;

#ifdef GHT_HAVE_CUDA
  // Host blocks PyTorch freed while work queued on their stream may still read them: released
  // once the event recorded on that stream at free time has completed.
  struct Pending {
    void* host_ptr;
    cudaEvent_t done;
  };
  std::mutex pending_mu;
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> spare_events;
#endif

  /// Release deferred host frees whose work has finished (all of them when `wait`).
  /// @return whether anything was released
  bool reap(bool wait) {
#ifdef GHT_HAVE_CUDA
    std::vector<void*> ready;
    {
      std::lock_guard lock(pending_mu);
      auto keep = pending.begin();
      for (auto& p : pending) {
        const cudaError_t e = wait ? cudaEventSynchronize(p.done) : cudaEventQuery(p.done);
        if (e == cudaErrorNotReady) {
          *keep++ = p;
          continue;
        }
        if (e != cudaSuccess) (void)cudaGetLastError();  // released anyway: nothing waits on it
        ready.push_back(p.host_ptr);
        spare_events.push_back(p.done);
      }
      pending.erase(keep, pending.end());
    }
    for (void* p : ready) alloc->deallocate(p);
    return !ready.empty();
#else
    (void)wait;
    return false;
#endif
  }

  ~State() {
#ifdef GHT_HAVE_CUDA
    try {
      reap(true);
    } catch (...) {
    }
    for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
#endif
  }
};

std::shared_mutex g_mu;
State* g_state = nullptr;  // never destroyed at exit: PyTorch may free blocks during its own exit

void flush_log_at_exit() {
  std::shared_lock lock(g_mu);
  if (g_state == nullptr) return;
  try {
    g_state->alloc->flush_log();
  } catch (...) {
  }
}

State* make_state() {
  auto s = std::make_unique<State>();
  s->alloc = make_default_tiered_allocator();
  const config::Registry& c = config::cfg();
  s->torch_tier = c.get_string(config::Key::GHT_TORCH_TIER) == "host" ? TierKind::host
                                                                        : TierKind::hbm;
  if (memory_resource* hbm = s->alloc->tier_resource(TierKind::hbm)) {
    if (auto* pool = dynamic_cast<device_pool*>(hbm)) s->device = pool->device();
    if (auto* direct = dynamic_cast<device_direct*>(hbm)) s->device = direct->device();
  }
  memory_resource* host = s->alloc->tier_resource(TierKind::host);
  if (host != nullptr) {
    s->pinned = dynamic_cast<pinned_host*>(host);
    if (s->pinned != nullptr) {
      s->reach = HostReach::mapped;
    } else if (dynamic_cast<managed*>(host) != nullptr || s->device < 0 ||
               tier::topology().link == LinkKind::c2c) {
      // Managed memory, coherent c2c system memory, or no GPU at all: the address is usable.
      s->reach = HostReach::direct;
    } else {
      s->reach = HostReach::none;  // system memory over pcie: the GPU cannot read it
    }
  }
  return s.release();
}

State& state() {
  {
    std::shared_lock lock(g_mu);
    if (g_state != nullptr) return *g_state;
  }
  std::unique_lock lock(g_mu);
  if (g_state == nullptr) {
    g_state = make_state();
    static std::once_flag registered;
    std::call_once(registered, [] { std::atexit(flush_log_at_exit); });
  }
  return *g_state;
}

template <typename R, typename F>
R guarded(R on_error, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    t_error = e.what();
  } catch (...) {
    t_error = "unknown error";
  }
  return on_error;
}

std::optional<TierKind> tier_hint(int hint) {
  GHT_EXPECTS(hint >= GHT_TIER_AUTO && hint < kNumTiers,
              "tier_hint " + std::to_string(hint) + " is not GHT_TIER_AUTO, _HBM or _HOST");
  if (hint == GHT_TIER_AUTO) return std::nullopt;
  return static_cast<TierKind>(hint);
}

TensorClass tensor_class(int cls) {
  GHT_EXPECTS(cls >= 0 && cls < kNumTensorClasses,
              "tensor_class " + std::to_string(cls) + " is not a GHT_CLASS_* value");
  return static_cast<TensorClass>(cls);
}

/// The device address of a block placed on `tier`.
void* device_address(State& s, void* p, TierKind tier) {
  if (tier == TierKind::hbm) return p;
  switch (s.reach) {
    case HostReach::direct:
      return p;
    case HostReach::mapped:
      return s.pinned->device_pointer(p);
    case HostReach::none:
      break;
  }
  GHT_FAIL("host-tier memory is system memory the GPU cannot reach over a pcie link; use "
           "GHT_HOST_MEMORY=pinned (or auto)");
}

/// The host block behind an address handed out by ght_torch_malloc.
void* host_address(State& s, void* p) {
  std::lock_guard lock(s.map_mu);
  const auto it = s.dev_to_host.find(p);
  return it == s.dev_to_host.end() ? p : it->second;
}

}  // namespace

extern "C" {

int ght_init(void) {
  return guarded(-1, [] {
    (void)state();
    return 0;
  });
}

int ght_finalize(void) {
  return guarded(-1, [] {
    std::unique_lock lock(g_mu);
    std::unique_ptr<State> s(g_state);
    g_state = nullptr;
    if (s) s->alloc->flush_log();  // reports a failed log write; the state goes either way
    return 0;
  });
}

void* ght_malloc(size_t size, int tensor_class_, int tier_hint_) {
  return ght_malloc_region(size, tensor_class_, tier_hint_, nullptr);
}

void* ght_malloc_region(size_t size, int tensor_class_, int tier_hint_, const char* region) {
  return guarded<void*>(nullptr, [&]() -> void* {
    AllocRequest req{tensor_class(tensor_class_), region != nullptr ? region : "",
                     tier_hint(tier_hint_), true};
    if (size == 0) return nullptr;
    return state().alloc->allocate(size, req);
  });
}

int ght_free(void* ptr) {
  return guarded(-1, [&] {
    if (ptr != nullptr) state().alloc->deallocate(ptr);
    return 0;
  });
}

int ght_where(const void* ptr, ght_placement* out) {
  return guarded(-1, [&] {
    GHT_EXPECTS(out != nullptr, "ght_where: out is NULL");
    State& s = state();
    std::optional<Placement> p = s.alloc->where(ptr);
    if (!p) p = s.alloc->where(host_address(s, const_cast<void*>(ptr)));
    if (!p) {
      t_error = "ght_where: pointer is not a live block of ghtier";
      return -1;
    }
    out->tier = static_cast<int>(p->tier);
    out->tensor_class = static_cast<int>(p->cls);
    out->bytes = p->bytes;
    out->spilled = p->spilled ? 1 : 0;
    // Region names are kept in a process-wide set, so the pointer outlives this call, the
    // block and even ght_finalize().
    out->region = "";
    if (!p->region.empty()) {
      static std::mutex mu;
      static std::set<std::string, std::less<>> names;  // one copy per distinct region name
      std::lock_guard lock(mu);
      out->region = names.emplace(p->region).first->c_str();
    }
    return 0;
  });
}

void* ght_device_pointer(void* ptr) {
  return guarded<void*>(nullptr, [&]() -> void* {
    State& s = state();
    const std::optional<Placement> p = s.alloc->where(ptr);
    GHT_EXPECTS(p.has_value(), "ght_device_pointer: pointer is not a live block of ghtier");
    return device_address(s, ptr, p->tier);
  });
}

const char* ght_stats_json(void) {
  return guarded<const char*>(nullptr, [] {
    t_stats = state().alloc->stats_json();
    return t_stats.c_str();
  });
}

const char* ght_last_error(void) { return t_error.c_str(); }

void* ght_torch_malloc(ssize_t size, int device, ght_stream_t stream) {
  void* result = guarded<void*>(nullptr, [&]() -> void* {
    GHT_EXPECTS(size >= 0, "ght_torch_malloc: negative size " + std::to_string(size));
    State& s = state();
    GHT_EXPECTS(s.device < 0 || device == s.device,
                "ght_torch_malloc: asked for device " + std::to_string(device) +
                    ", but ghtier serves device " + std::to_string(s.device) + " (GHT_DEVICE)");
    if (size == 0) return nullptr;
    s.reap(false);
    // Spilling PyTorch's blocks to host memory is only safe where kernels can reach it.
    const TierKind tier_asked =
        t_torch_tier == GHT_TIER_AUTO ? s.torch_tier : static_cast<TierKind>(t_torch_tier);
    const AllocRequest req{TensorClass::other, "torch", tier_asked, s.reach != HostReach::none};
    const auto bytes = static_cast<std::size_t>(size);
    void* p = nullptr;
    try {
      p = s.alloc->allocate(bytes, req, stream);
    } catch (const ght::out_of_memory&) {
      if (!s.reap(true)) throw;  // nothing was waiting to be freed: really out of memory
      p = s.alloc->allocate(bytes, req, stream);
    }
    const TierKind tier = s.alloc->where(p)->tier;
    void* d = nullptr;
    try {
      d = device_address(s, p, tier);
    } catch (...) {
      s.alloc->deallocate(p, stream);
      throw;
    }
    if (d != p) {
      std::lock_guard lock(s.map_mu);
      s.dev_to_host.emplace(d, p);
    }
    return d;
  });
  // PyTorch turns NULL into its own out-of-memory error without our reason; print it.
  if (result == nullptr && size > 0) {
    ght::log::error("ght_torch_malloc(" + std::to_string(size) + " bytes) failed: " + t_error);
  }
  return result;
}

void ght_torch_free(void* ptr, ssize_t size, int device, ght_stream_t stream) {
  (void)size;
  (void)device;
  const int rc = guarded(-1, [&] {
    if (ptr == nullptr) return 0;
    State& s = state();
    void* host = nullptr;
    {
      std::lock_guard lock(s.map_mu);
      const auto it = s.dev_to_host.find(ptr);
      if (it != s.dev_to_host.end()) {
        host = it->second;
        s.dev_to_host.erase(it);
      }
    }
    if (host == nullptr) host = ptr;
    const std::optional<Placement> p = s.alloc->where(host);
    GHT_EXPECTS(p.has_value(), "ght_torch_free: pointer is not a live block of ghtier");
#ifdef GHT_HAVE_CUDA
    if (p->tier == TierKind::host && s.device >= 0) {
      // HBM frees are stream-ordered by the pool; host memory is not, so wait for the stream
      // with an event instead of blocking here.
      cudaEvent_t ev = nullptr;
      {
        std::lock_guard lock(s.pending_mu);
        if (!s.spare_events.empty()) {
          ev = s.spare_events.back();
          s.spare_events.pop_back();
        }
      }
      if (ev == nullptr) GHT_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      const cudaError_t err = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        GHT_CUDA_TRY(err);
      }
      std::lock_guard lock(s.pending_mu);
      s.pending.push_back({host, ev});
      return 0;
    }
#endif
    s.alloc->deallocate(host, stream);
    s.reap(false);
    return 0;
  });
  // PyTorch's free hook cannot report failure; a failure here is a bug worth seeing.
  if (rc != 0) ght::log::error("ght_torch_free failed: " + t_error);
}

int ght_torch_set_thread_tier(int tier, int* previous) {
  return guarded(-1, [&] {
    GHT_EXPECTS(tier >= GHT_TIER_AUTO && tier < kNumTiers,
                "ght_torch_set_thread_tier: tier " + std::to_string(tier) +
                    " is not GHT_TIER_AUTO, GHT_TIER_HBM or GHT_TIER_HOST");
    if (previous != nullptr) *previous = t_torch_tier;
    t_torch_tier = tier;
    return 0;
  });
}

int ght_torch_thread_tier(void) { return t_torch_tier; }

}  // extern "C"

// Loaded by dlopen without RTLD_GLOBAL (Python's ctypes.CDLL default) before `import torch`,
// libghtier_alloc.so made that import crash (SIGSEGV, H200 machine, torch 2.11); loaded with
// RTLD_GLOBAL, or after torch, it did not. The cause is not identified. The library therefore
// promotes itself to the global scope when it is loaded: the same as RTLD_GLOBAL. In a program
// linked statically against ghtier (the path is not a shared ghtier library) this does nothing.
namespace {
__attribute__((constructor)) void ght_promote_to_global_scope() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ght_promote_to_global_scope), &info) == 0 || info.dli_fname == nullptr) return;
  const std::string path = info.dli_fname;
  if (path.find("libghtier") == std::string::npos || path.find(".so") == std::string::npos) return;
  if (void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
    (void)self;  // the reference stays: the library lives as long as the process
  }
}
}  // namespace
