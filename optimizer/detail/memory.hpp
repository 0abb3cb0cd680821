#pragma once
// Internal: where a pointer lives and how each side reaches it.
#include <cstddef>
#include <string>

namespace ght::optimizer::detail {

/// True when this build has CUDA and a device is usable (checked once).
bool gpu_available();

/// True for device or managed memory (never in a CPU-only build).
bool is_device_memory(const void* p);

/// The address a kernel uses for `p`, or null when the GPU cannot reach it (no GPU, pageable
/// memory over PCIe, pinned memory that is not mapped).
void* device_address(const void* p);

/// The address a kernel uses for `p`: itself for device, managed or (on c2c) pageable memory, the
/// mapped alias for pinned memory. Throws ght::logic_error naming `what` when the GPU cannot
/// reach `p` (pageable memory over PCIe).
void* device_alias(const void* p, const std::string& what);

}  // namespace ght::optimizer::detail
