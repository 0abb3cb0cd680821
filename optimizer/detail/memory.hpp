#pragma once
// Internal: where a pointer lives and how each side reaches it, host buffers for staging.
#include <cstddef>
#include <string>

namespace ght::optimizer::detail {

/// True when this build has CUDA and a device is usable (checked once).
bool gpu_available();

/// True when the GPU can read and write plain (pageable) host memory: c2c links.
bool gpu_reads_pageable();

/// True for device or managed memory (never in a CPU-only build).
bool is_device_memory(const void* p);

/// The address a kernel uses for `p`: itself for device, managed or (on c2c) pageable memory, the
/// mapped alias for pinned memory. Throws ght::logic_error naming `what` when the GPU cannot
/// reach `p` (pageable memory over PCIe).
void* device_alias(const void* p, const std::string& what);

/// Host memory for staging: pinned (cudaHostAlloc, mapped) when a GPU is present, else 64-byte
/// aligned. Never returns null (throws ght::out_of_memory). Free with free_staging.
void* alloc_staging(std::size_t bytes, bool* pinned);
void free_staging(void* p, bool pinned) noexcept;

}  // namespace ght::optimizer::detail
