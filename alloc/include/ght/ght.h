/**
 * @file ght.h
 * @brief ghtier's C ABI: the tiered allocator for other trainers, and the two entry points
 * PyTorch's CUDAPluggableAllocator loads.
 *
 * No C++ exception crosses this boundary. A function that fails returns NULL or -1 and leaves
 * a message for ght_last_error() on the calling thread. Every function except ght_finalize may
 * be called from any number of threads at once. The allocator is built from the GHT_*
 * environment on first use (or by ght_init) and lives until ght_finalize() or process exit.
 *
 * Link (or dlopen) libghtier_alloc.so, the allocator library: it needs only cudart, libnuma and
 * hwloc, so it loads beside PyTorch's own cuBLAS, cuDNN and OpenMP runtime.
 *   Python:  torch.cuda.memory.CUDAPluggableAllocator("build/lib/libghtier_alloc.so",
 *                                                     "ght_torch_malloc", "ght_torch_free")
 */
#ifndef GHT_GHT_H
#define GHT_GHT_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/** A CUDA stream: the same type as cudaStream_t, declared without the CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st* ght_stream_t;

/** Tensor classes (ght::TensorClass). */
enum {
  GHT_CLASS_WEIGHT = 0,
  GHT_CLASS_GRAD = 1,
  GHT_CLASS_MASTER = 2,
  GHT_CLASS_ADAM_M = 3,
  GHT_CLASS_ADAM_V = 4,
  GHT_CLASS_ACTIVATION = 5,
  GHT_CLASS_OTHER = 6
};

/** Tiers (ght::TierKind); GHT_TIER_AUTO lets the plan or the class defaults decide. */
enum { GHT_TIER_AUTO = -1, GHT_TIER_HBM = 0, GHT_TIER_HOST = 1 };

/** What ght_where() reports about a block. */
typedef struct ght_placement {
  int tier;           /**< GHT_TIER_HBM or GHT_TIER_HOST */
  int tensor_class;   /**< GHT_CLASS_* */
  size_t bytes;       /**< size as requested */
  const char* region; /**< region name ("" if none); valid until the process exits */
  int spilled;        /**< 1 when placed on a later tier because its tier was full */
} ght_placement;

/** Build the allocator from the GHT_* configuration (idempotent). @return 0, or -1 on error. */
int ght_init(void);

/**
 * Destroy the allocator and release all of its memory, live blocks included. No other ghtier
 * call may run concurrently. A later call builds a new allocator. @return 0 or -1.
 */
int ght_finalize(void);

/**
 * Allocate `size` bytes of class `tensor_class` (GHT_CLASS_*), on `tier_hint` (GHT_TIER_*),
 * spilling to the next tier if that one is full and GHT_SPILL=on.
 * @return the block (256-byte aligned); NULL for size 0 or on error (see ght_last_error).
 */
void* ght_malloc(size_t size, int tensor_class, int tier_hint);

/** As ght_malloc, with the plan's region name (may be NULL). */
void* ght_malloc_region(size_t size, int tensor_class, int tier_hint, const char* region);

/** Free a block from ght_malloc*. NULL is ignored. @return 0, or -1 for an unknown pointer. */
int ght_free(void* ptr);

/** Where a block lives. @return 0, or -1 when `ptr` is not a live block (or on error). */
int ght_where(const void* ptr, ght_placement* out);

/**
 * The address a CUDA kernel uses for a block: itself for HBM and for host memory the GPU reads
 * directly (coherent link, managed), the mapped device address for pinned host memory.
 * @return NULL on error (also for host memory the GPU cannot reach).
 */
void* ght_device_pointer(void* ptr);

/**
 * Statistics as JSON: per tier usage {current, peak, total, count}, budget, largest free block,
 * spills; per class usage; overall. The string stays valid until the next call on this thread.
 * @return NULL on error.
 */
const char* ght_stats_json(void);

/** The calling thread's last error message ("" if none). */
const char* ght_last_error(void);

/**
 * PyTorch's allocation hook. GHT_TORCH_TIER=hbm|host selects the tier; with host the block is
 * mapped pinned (or coherent system) memory and the device address is returned, so CUDA
 * kernels read the tensor over the link. Frees are ordered on `stream` (host blocks are
 * released once the work queued on it before the free has finished).
 * @return NULL on failure (PyTorch raises its out-of-memory error).
 */
void* ght_torch_malloc(ssize_t size, int device, ght_stream_t stream);

/** PyTorch's free hook, the counterpart of ght_torch_malloc. */
void ght_torch_free(void* ptr, ssize_t size, int device, ght_stream_t stream);

/**
 * Where ght_torch_malloc places the blocks the calling thread asks for from now on: GHT_TIER_HBM
 * or GHT_TIER_HOST, or GHT_TIER_AUTO to drop the setting (GHT_TORCH_TIER decides again). Blocks
 * already handed out stay where they are; other threads are not affected. Python's
 * ghtier.torch.placement() scopes it.
 * @param previous if not NULL, receives the setting it replaces (GHT_TIER_AUTO when none)
 * @return 0, or -1 for a value that is not a GHT_TIER_* (the setting is unchanged)
 */
int ght_torch_set_thread_tier(int tier, int* previous);

/** The calling thread's ght_torch_set_thread_tier setting (GHT_TIER_AUTO when none). */
int ght_torch_thread_tier(void);

#ifdef __cplusplus
}
#endif

#endif /* GHT_GHT_H */
