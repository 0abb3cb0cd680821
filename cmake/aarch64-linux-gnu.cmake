# Cross-build for Grace (aarch64, Neoverse V2) on an x86-64 Debian host, with Debian's multiarch
# packages (g++-aarch64-linux-gnu, lib*-dev:arm64) and qemu-user to run what is built.
# scripts/test-aarch64.sh installs them and uses this file:
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DGHT_ENABLE_CUDA=OFF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Debian's arm64 libraries sit in /usr/lib/aarch64-linux-gnu (found through
# CMAKE_LIBRARY_ARCHITECTURE), the cross compiler's runtime in /usr/aarch64-linux-gnu. Header-only packages
# (nlohmann-json, toml11, CLI11) are architecture-independent and live under /usr/share, hence
# "/" among the roots. Programs are the build machine's own.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Never the build machine's own libraries or package files.
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu)
set(CMAKE_IGNORE_PREFIX_PATH /usr/lib/x86_64-linux-gnu/cmake)

# Grace's cores. GCC 12 (Debian 12) knows Neoverse V2 by its code name, demeter; GCC 13 by name.
# cmake/GhtFlags.cmake leaves a -mcpu given here in place of its portable -march.
if(NOT DEFINED GHT_AARCH64_MCPU)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -mcpu=neoverse-v2 -E -x c++ /dev/null
                  RESULT_VARIABLE _ght_v2 OUTPUT_QUIET ERROR_QUIET)
  if(_ght_v2 EQUAL 0)
    set(GHT_AARCH64_MCPU neoverse-v2)
  else()
    set(GHT_AARCH64_MCPU demeter)
  endif()
endif()
set(CMAKE_C_FLAGS_INIT "-mcpu=${GHT_AARCH64_MCPU}")
set(CMAKE_CXX_FLAGS_INIT "-mcpu=${GHT_AARCH64_MCPU}")

# ctest runs the test binaries through qemu-user. The SVE vector length is the CPU model's:
# QEMU_CPU=max,sve128=on (or sve256=on ...) in the environment picks it per run
# (scripts/test-aarch64.sh runs both); without it qemu's max CPU has 512-bit vectors.
# The loader and C library come from libc6:arm64 (/lib/ld-linux-aarch64.so.1, pulled in by the
# lib*-dev:arm64 packages) where it is installed: with -L /usr/aarch64-linux-gnu, qemu would start
# the cross package's ld.so, which then loads libc6:arm64's libc.so.6 from /lib/aarch64-linux-gnu
# (a different glibc build): the first pthread_create spins forever in the stack cache.
find_program(GHT_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(GHT_QEMU_AARCH64 AND EXISTS /lib/ld-linux-aarch64.so.1)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${GHT_QEMU_AARCH64})
elseif(GHT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${GHT_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
