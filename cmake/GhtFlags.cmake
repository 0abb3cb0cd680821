# Warning and architecture flags for our own code. Third-party headers are included as SYSTEM.
add_library(ght_flags INTERFACE)
target_compile_options(ght_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unknown-pragmas>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-unknown-pragmas --expt-relaxed-constexpr -Werror=all-warnings -lineinfo>)

# Architecture flags depend on the target: Grace (aarch64) and x86-64 both build; no x86-only
# flag is ever applied to an aarch64 build.
# Portable by default (binaries may move between machines); -DGHT_TUNE_NATIVE=ON tunes for the
# build machine's CPU. (A CMake option, not a GHT_* environment variable: those are runtime
# options and the registry rejects unknown ones.)
option(GHT_TUNE_NATIVE "Tune host code for the build machine's CPU" OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
  set(GHT_ARCH_FLAGS -march=armv8.2-a)
  if(GHT_TUNE_NATIVE)
    set(GHT_ARCH_FLAGS -mcpu=native)
  endif()
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
  set(GHT_ARCH_FLAGS -march=x86-64-v2)
  if(GHT_TUNE_NATIVE)
    set(GHT_ARCH_FLAGS -march=native)
  endif()
else()
  set(GHT_ARCH_FLAGS "")
endif()
# A CPU that a toolchain file chose (cmake/aarch64-linux-gnu.cmake: -mcpu=neoverse-v2) stands:
# GCC rejects -mcpu and -march that name different architectures.
if(CMAKE_CXX_FLAGS MATCHES "(^| )-m(cpu|arch)=" AND NOT GHT_TUNE_NATIVE)
  set(GHT_ARCH_FLAGS "")
endif()
target_compile_options(ght_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${GHT_ARCH_FLAGS}>)

# Sanitizer builds (presets asan, tsan) pass GHT_SANITIZE; host code only.
set(GHT_SANITIZE "" CACHE STRING "address,undefined | thread | empty")
if(GHT_SANITIZE)
  target_compile_options(ght_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GHT_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(ght_flags INTERFACE -fsanitize=${GHT_SANITIZE})
endif()

# Cold code at -O1: argument parsing, config and TOML/JSON files, the CLI's commands, cudnn graph
# building and the test drivers run once per process (or per test), but at -O3 they took most of
# CI's build: 64-80% of such a file's compile time is -O3 optimisation of toml11, nlohmann-json,
# CLI11 and GoogleTest templates (cmd_plan.cpp: 33.6 s at -O3, 18.6 s at -O1; bench/results,
# 2026-12-03). Hot code (kernels, the optimizer, the training step, data loading) keeps the build
# type's level. Host code only: nvcc gets -O1 for its host compiler and keeps ptxas at -O3.
# GCC and Clang take the last -O on the command line, and these options come after the build
# type's flags (nvcc says so once per CUDA test file: "incompatible redefinition for option
# 'optimize', the last value of this option was used"). A Debug build (-O0) is left alone.
set(GHT_COLD_OPT
  $<$<AND:$<NOT:$<CONFIG:Debug>>,$<COMPILE_LANGUAGE:CXX>>:-O1>
  $<$<AND:$<NOT:$<CONFIG:Debug>>,$<COMPILE_LANGUAGE:CUDA>>:-O1>
  $<$<AND:$<NOT:$<CONFIG:Debug>>,$<COMPILE_LANGUAGE:CUDA>>:-Xptxas=-O3>)
# ght_cold_sources(a.cpp b.cpp): those files of this directory's targets at GHT_COLD_OPT.
function(ght_cold_sources)
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${GHT_COLD_OPT}")
endfunction()
