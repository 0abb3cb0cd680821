#include "alloc/detail/small_heap.hpp"

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "alloc/detail/host_memory.hpp"
#include "alloc/resource.hpp"

#ifdef GHT_HAVE_MIMALLOC
#include <mimalloc.h>
#endif

namespace ght::alloc::detail {

#ifdef GHT_HAVE_MIMALLOC

namespace {

// Slot 0 is node -1 (no policy), slot k is node k-1. mimalloc allows 64 arenas per process.
constexpr int kSlots = 65;
// mimalloc's segments (and so its arena blocks) are 32 MiB, aligned to their size.
constexpr std::size_t kSegmentBytes = std::size_t{32} << 20;

// mimalloc is opened with RTLD_LOCAL rather than linked: Debian's libmimalloc.so.2 also exports
// malloc and free, and as a direct dependency of an executable it would take over the whole
// process's malloc (measured: libc's own calls bound to it). Opened locally, only the functions
// below are used. GHT_MIMALLOC_SONAME is the library's major version, whose ABI these match.
struct MiApi {
  decltype(&mi_version) version;
  decltype(&mi_manage_os_memory_ex) manage_os_memory_ex;
  decltype(&mi_heap_new_in_arena) heap_new_in_arena;
  decltype(&mi_heap_malloc_aligned_at) heap_malloc_aligned_at;
  decltype(&mi_free) free;
};

// nullptr when the library is missing, lacks a function or is older than 2.0.9.
const MiApi* mi_api() noexcept {
  static const MiApi* api = []() -> const MiApi* {
    void* lib = dlopen(GHT_MIMALLOC_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    static MiApi a{};
    a.version = reinterpret_cast<decltype(a.version)>(dlsym(lib, "mi_version"));
    a.manage_os_memory_ex =
        reinterpret_cast<decltype(a.manage_os_memory_ex)>(dlsym(lib, "mi_manage_os_memory_ex"));
    a.heap_new_in_arena =
        reinterpret_cast<decltype(a.heap_new_in_arena)>(dlsym(lib, "mi_heap_new_in_arena"));
    a.heap_malloc_aligned_at =
        reinterpret_cast<decltype(a.heap_malloc_aligned_at)>(dlsym(lib, "mi_heap_malloc_aligned_at"));
    a.free = reinterpret_cast<decltype(a.free)>(dlsym(lib, "mi_free"));
    const bool ok = a.version != nullptr && a.manage_os_memory_ex != nullptr &&
                    a.heap_new_in_arena != nullptr && a.heap_malloc_aligned_at != nullptr &&
                    a.free != nullptr && a.version() >= 209;
    return ok ? &a : nullptr;  // the library stays loaded: harmless, and a.free may be in use
  }();
  return api;
}

std::mutex g_create_mu;
std::array<std::atomic<small_heap*>, kSlots> g_heaps{};
std::array<bool, kSlots> g_failed{};  // under g_create_mu: do not try to map again

// This thread's mimalloc heap per slot. A mimalloc heap allocates only on the thread that made
// it; mimalloc deletes it when the thread ends (its pages stay valid for frees from elsewhere).
thread_local std::array<mi_heap_t*, kSlots> t_heaps{};

// kArenaBytes of address space aligned to kSegmentBytes, preferring `node`; nullptr on failure.
char* map_arena(int node) noexcept {
  const std::size_t len = small_heap::kArenaBytes, map_len = len + kSegmentBytes;
  // MAP_NORESERVE: the arena is address space; memory is charged only as pages are touched.
  void* raw = mmap(nullptr, map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* p = static_cast<char*>(raw);
  char* aligned = reinterpret_cast<char*>(align_up(reinterpret_cast<std::uintptr_t>(p), kSegmentBytes));
  const std::size_t head = static_cast<std::size_t>(aligned - p);
  if (head > 0) munmap(p, head);
  if (map_len - head - len > 0) munmap(aligned + len, map_len - head - len);
  if (bind_preferred(aligned, len, node) != 0) {
    munmap(aligned, len);
    return nullptr;
  }
  return aligned;
}

}  // namespace

bool small_heap::available() noexcept { return mi_api() != nullptr; }

small_heap* small_heap::for_node(int node) noexcept {
  const int slot = node + 1;
  if (slot < 0 || slot >= kSlots) return nullptr;
  const MiApi* mi = mi_api();
  if (mi == nullptr) return nullptr;
  if (small_heap* h = g_heaps[static_cast<std::size_t>(slot)].load(std::memory_order_acquire)) return h;
  std::lock_guard lock(g_create_mu);
  if (small_heap* h = g_heaps[static_cast<std::size_t>(slot)].load(std::memory_order_acquire)) return h;
  if (g_failed[static_cast<std::size_t>(slot)]) return nullptr;
  g_failed[static_cast<std::size_t>(slot)] = true;  // cleared below on success
  char* base = map_arena(node);
  if (base == nullptr) return nullptr;
  mi_arena_id_t id{};
  // Committed (no commit/decommit calls, which would remap and lose the NUMA policy), not large
  // OS pages, zeroed (fresh anonymous memory), exclusive: only heaps made for it allocate there.
  if (!mi->manage_os_memory_ex(base, kArenaBytes, /*is_committed=*/true, /*is_large=*/false,
                              /*is_zero=*/true, node, /*exclusive=*/true, &id)) {
    munmap(base, kArenaBytes);
    return nullptr;
  }
  // Lives as long as the process, like the arena it describes (mimalloc cannot remove one).
  auto* h = new (std::nothrow) small_heap(node, slot, base, kArenaBytes, static_cast<int>(id));
  if (h == nullptr) return nullptr;  // the arena stays registered, unused
  g_failed[static_cast<std::size_t>(slot)] = false;
  g_heaps[static_cast<std::size_t>(slot)].store(h, std::memory_order_release);
  return h;
}

void* small_heap::allocate(std::size_t bytes, std::size_t alignment) noexcept {
  mi_heap_t*& heap = t_heaps[static_cast<std::size_t>(slot_)];
  if (heap == nullptr) {
    heap = mi_api()->heap_new_in_arena(static_cast<mi_arena_id_t>(arena_id_));
    if (heap == nullptr) return nullptr;
  }
  // A multiple of the alignment (at most the slab pool's power-of-two class): a block smaller
  // than its alignment would take mimalloc's slow path (over-allocate, then shift the pointer).
  const std::size_t n = align_up(std::max(bytes, alignment), alignment);
  // nullptr when the arena has no free segment left: the caller falls back to its own path.
  // The _at form: 2.0.9's mi_heap_malloc_aligned assumes power-of-two blocks of 256 B to 1 KiB
  // are aligned to their size, which the first page of a segment breaks (128-aligned blocks seen).
  return mi_api()->heap_malloc_aligned_at(heap, n, alignment, 0);
}

void small_heap::deallocate(void* p) noexcept { mi_api()->free(p); }

#else  // no mimalloc: nothing is served here

bool small_heap::available() noexcept { return false; }
small_heap* small_heap::for_node(int) noexcept { return nullptr; }
void* small_heap::allocate(std::size_t, std::size_t) noexcept { return nullptr; }
void small_heap::deallocate(void*) noexcept {}

#endif

}  // namespace ght::alloc::detail
