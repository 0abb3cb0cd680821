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
target_compile_options(ght_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${GHT_ARCH_FLAGS}>)

# Sanitizer builds (presets asan, tsan) pass GHT_SANITIZE; host code only.
set(GHT_SANITIZE "" CACHE STRING "address,undefined | thread | empty")
if(GHT_SANITIZE)
  target_compile_options(ght_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GHT_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(ght_flags INTERFACE -fsanitize=${GHT_SANITIZE})
endif()
