# Finds every third-party dependency once, as imported targets. All come from Debian packages
# (scripts/install-deps.sh) or from the CUDA toolkit.

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(toml11 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(TBB REQUIRED)  # host task concurrency (trainer: checkpoint files in parallel)
# hwloc and xxHash: plain header + library lookups, so that packages staged under a prefix
# (tools/stage-deps.sh, CMAKE_PREFIX_PATH) are found as well as system ones.
function(ght_find_c_library target header lib)
  find_path(${target}_INCLUDE_DIR ${header} REQUIRED)
  find_library(${target}_LIBRARY ${lib} REQUIRED)
  add_library(${target} INTERFACE)
  target_include_directories(${target} SYSTEM INTERFACE ${${target}_INCLUDE_DIR})
  target_link_libraries(${target} INTERFACE ${${target}_LIBRARY})
endfunction()
ght_find_c_library(ght_hwloc hwloc.h hwloc)
ght_find_c_library(ght_xxhash xxhash.h xxhash)

ght_find_c_library(ght_numa numa.h numa)

# Google Highway (Debian: libhwy-dev; arm64 cross builds: libhwy-dev:arm64): the host's SIMD loops
# (optimizer/detail/adamw_simd.cpp, tier/detail/triad_simd.cpp), one source for every ISA. Its
# CMake package first, then pkg-config's libhwy.
find_package(hwy CONFIG QUIET)
if(NOT TARGET hwy::hwy)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(GHT_HWY QUIET IMPORTED_TARGET libhwy)
  endif()
  if(NOT GHT_HWY_FOUND)
    message(FATAL_ERROR "ghtier: Google Highway not found (neither hwy-config.cmake nor pkg-config's "
            "libhwy). Install libhwy-dev (scripts/install-deps.sh), or libhwy-dev:arm64 for the "
            "aarch64 cross build (scripts/test-aarch64.sh), or point CMAKE_PREFIX_PATH at it.")
  endif()
  add_library(hwy::hwy ALIAS PkgConfig::GHT_HWY)
endif()
# Every target Highway can compile for in the SIMD files, the scalar fallback included, so that
# the tests check each one the CPU runs (tests/optimizer/simd_kernels_test.cpp).
set(GHT_HWY_DEFINITIONS HWY_COMPILE_ALL_ATTAINABLE)

# mimalloc (optional): system_host's blocks up to 128 KiB, from an arena of ghtier's own on the host
# NUMA node (alloc/detail/small_heap.cpp). Needs 2.0.9 (exclusive arenas, heaps bound to one); the
# library is loaded at run time, and a machine without it uses the slab pool.
# Without it, and in sanitizer builds (the sanitizers cannot see into the uninstrumented
# library), small host blocks come from ghtier's slab pool.
option(GHT_WITH_MIMALLOC "Serve small host blocks from mimalloc when it is found" ON)
set(GHT_HAVE_MIMALLOC OFF)
set(_ght_mi_why "not found (Debian: libmimalloc-dev)")
if(NOT GHT_WITH_MIMALLOC)
  set(_ght_mi_why "off (GHT_WITH_MIMALLOC=OFF)")
elseif(GHT_SANITIZE)
  set(_ght_mi_why "off in a sanitizer build")
else()
  find_package(mimalloc 2.0 CONFIG QUIET)
  if(mimalloc_FOUND AND TARGET mimalloc)
    get_target_property(_ght_mi_inc mimalloc INTERFACE_INCLUDE_DIRECTORIES)
    find_file(_ght_mi_header mimalloc.h HINTS ${_ght_mi_inc} NO_CACHE)
    if(_ght_mi_header)
      file(STRINGS ${_ght_mi_header} _ght_mi_v REGEX "^#define MI_MALLOC_VERSION ")
      string(REGEX REPLACE "^#define MI_MALLOC_VERSION +([0-9]+).*" "\\1" GHT_MIMALLOC_VERSION "${_ght_mi_v}")
    endif()
    if(GHT_MIMALLOC_VERSION AND GHT_MIMALLOC_VERSION GREATER_EQUAL 209)
      # The header only: small_heap.cpp opens the library with dlopen(RTLD_LOCAL), since Debian's
      # libmimalloc.so also exports malloc/free and, linked, would replace malloc process-wide.
      add_library(ght_mimalloc INTERFACE)
      target_include_directories(ght_mimalloc SYSTEM INTERFACE ${_ght_mi_inc})
      target_compile_definitions(ght_mimalloc INTERFACE GHT_HAVE_MIMALLOC=1
                                 GHT_MIMALLOC_SONAME="libmimalloc.so.${mimalloc_VERSION_MAJOR}")
      set(GHT_HAVE_MIMALLOC ON)
    else()
      set(_ght_mi_why "${GHT_MIMALLOC_VERSION} is older than 209 (2.0.9)")
    endif()
  endif()
endif()
if(GHT_HAVE_MIMALLOC)
  message(STATUS "ghtier: mimalloc ON (MI_MALLOC_VERSION ${GHT_MIMALLOC_VERSION}, libmimalloc.so.${mimalloc_VERSION_MAJOR} at run time): small host blocks")
else()
  message(STATUS "ghtier: mimalloc ${_ght_mi_why}: small host blocks from the slab pool")
endif()

# MPI (optional): CPU collectives between the processes of an mpirun/srun launch (trainer/dist).
# Only the C API is used. Without it the build runs one process per job.
option(GHT_WITH_MPI "Build the MPI communicator when MPI is found" ON)
set(GHT_HAVE_MPI OFF)
if(GHT_WITH_MPI)
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(GHT_HAVE_MPI ON)
  endif()
endif()
message(STATUS "ghtier: MPI ${GHT_HAVE_MPI}")

if(GHT_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(GHT_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "ghtier: Google Benchmark not found; bench/ is skipped")
  endif()
endif()

if(GHT_HAVE_CUDA)
  # cuDNN ships inside the toolkit directory on our machines; look there and on the system.
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(CUDNN_LIBRARY AND CUDNN_INCLUDE_DIR)
    add_library(ght_cudnn INTERFACE)
    target_include_directories(ght_cudnn SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR})
    target_link_libraries(ght_cudnn INTERFACE ${CUDNN_LIBRARY})
    set(GHT_HAVE_CUDNN ON)
  else()
    set(GHT_HAVE_CUDNN OFF)
  endif()
  message(STATUS "ghtier: cuDNN ${GHT_HAVE_CUDNN} (${CUDNN_LIBRARY})")
endif()

# ght_python_dir(OUT CODE): the directory python3 prints for CODE (a package's location, asked of
# an installed Python package without building anything), appended to the list OUT; nothing when
# there is no python3 or CODE fails (the package is not installed).
function(ght_python_dir out code)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "${code}" OUTPUT_VARIABLE dir
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(dir)
      set(${out} ${${out}} ${dir} PARENT_SCOPE)
    endif()
  endif()
endfunction()

# CUTLASS (optional, header-only): the sm90 grouped GEMM of the MoE experts (kernels/cuda/cutlass).
# Looked for in GHT_CUTLASS_DIR, then $CUTLASS_INCLUDE_DIR (.deps/env.sh on the GPU machine), then
# .pydeps/ (scripts/install-deps.sh installs the nvidia-cutlass wheel there), then an installed
# nvidia-cutlass Python package. Needs sm_90 among GHT_CUDA_ARCH (its kernels are built for 90a).
set(GHT_CUTLASS_DIR "" CACHE PATH "CUTLASS include directory (the one holding cutlass/ and cute/)")
option(GHT_WITH_CUTLASS "Build the CUTLASS grouped GEMM when CUTLASS is found" ON)
set(GHT_HAVE_CUTLASS OFF)
if(GHT_WITH_CUTLASS AND GHT_HAVE_CUDA AND ("90" IN_LIST GHT_CUDA_ARCH OR "90a" IN_LIST GHT_CUDA_ARCH))
  set(_ght_cutlass_hints ${GHT_CUTLASS_DIR} $ENV{CUTLASS_INCLUDE_DIR}
      ${PROJECT_SOURCE_DIR}/.pydeps/cutlass_library/source/include)
  ght_python_dir(_ght_cutlass_hints
                 "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
  find_path(GHT_CUTLASS_INCLUDE cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp
            HINTS ${_ght_cutlass_hints} NO_DEFAULT_PATH)
  if(GHT_CUTLASS_INCLUDE)
    set(GHT_HAVE_CUTLASS ON)
  endif()
endif()
message(STATUS "ghtier: CUTLASS ${GHT_HAVE_CUTLASS} (${GHT_CUTLASS_INCLUDE})")

# cudnn-frontend (optional, header-only): cuDNN's C++ graph API, whose SDPA nodes run the
# attention (kernels/cuda/cudnn_frontend; AttentionImpl::cudnn). Looked for in
# GHT_CUDNN_FRONTEND_DIR, then $CUDNN_FRONTEND_INCLUDE_DIR (.deps/env.sh on the GPU machine), then
# .pydeps/ (scripts/install-deps.sh puts the nvidia-cudnn-frontend wheel's include/ there), then
# the include/ beside an installed nvidia-cudnn-frontend Python package (found without importing
# it). Needs cuDNN; without it the attention keeps the hand-written backend graph.
set(GHT_CUDNN_FRONTEND_DIR "" CACHE PATH "cudnn-frontend include directory (the one holding cudnn_frontend.h)")
option(GHT_WITH_CUDNN_FRONTEND "Build the cudnn-frontend attention when its headers are found" ON)
set(GHT_HAVE_CUDNN_FRONTEND OFF)
if(GHT_WITH_CUDNN_FRONTEND AND GHT_HAVE_CUDA AND GHT_HAVE_CUDNN)
  set(_ght_cfe_hints ${GHT_CUDNN_FRONTEND_DIR} $ENV{CUDNN_FRONTEND_INCLUDE_DIR}
      ${PROJECT_SOURCE_DIR}/.pydeps/cudnn_frontend/include)
  ght_python_dir(_ght_cfe_hints
                 "import importlib.util, os; s = importlib.util.find_spec('cudnn'); print(os.path.join(os.path.dirname(os.path.dirname(s.origin)), 'include'))")
  find_path(GHT_CUDNN_FRONTEND_INCLUDE cudnn_frontend/graph_interface.h HINTS ${_ght_cfe_hints} NO_DEFAULT_PATH)
  if(GHT_CUDNN_FRONTEND_INCLUDE)
    file(STRINGS ${GHT_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend_version.h _ght_cfe_v
         REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
    string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*MINOR_VERSION ([0-9]+).*PATCH_VERSION ([0-9]+).*"
           "\\1.\\2.\\3" GHT_CUDNN_FRONTEND_VERSION "${_ght_cfe_v}")
    # The SDPA attributes used (set_generate_stats, diagonal bands) are those of 1.32.
    if(GHT_CUDNN_FRONTEND_VERSION VERSION_LESS 1.32)
      message(STATUS "ghtier: cudnn-frontend ${GHT_CUDNN_FRONTEND_VERSION} at ${GHT_CUDNN_FRONTEND_INCLUDE} is older than 1.32; not used")
    else()
      set(GHT_HAVE_CUDNN_FRONTEND ON)
    endif()
  endif()
endif()
message(STATUS "ghtier: cudnn-frontend ${GHT_HAVE_CUDNN_FRONTEND} (${GHT_CUDNN_FRONTEND_VERSION} ${GHT_CUDNN_FRONTEND_INCLUDE})")

# NCCL (optional): GPU collectives for the CUDA backend's data parallel (trainer/dist/nccl).
# Looked for in GHT_NCCL_DIR, $NCCL_HOME / $NCCL_ROOT, the system, .pydeps/nvidia/nccl
# (scripts/install-deps.sh installs the nvidia-nccl-cu13 wheel there), then the nvidia.nccl
# package of python3 (PyTorch brings one). The wheel's lib/ holds only libnccl.so.2 (no
# unversioned libnccl.so), hence the second name. GHT_HAVE_NCCL needs CUDA as well.
set(GHT_NCCL_DIR "" CACHE PATH "NCCL prefix (the directory holding include/nccl.h and lib/libnccl.so*)")
option(GHT_WITH_NCCL "Build the NCCL GPU communicator when NCCL is found" ON)
set(GHT_HAVE_NCCL OFF)
if(GHT_WITH_NCCL AND GHT_HAVE_CUDA)
  set(_ght_nccl_hints ${GHT_NCCL_DIR} $ENV{NCCL_HOME} $ENV{NCCL_ROOT})
  set(_ght_nccl_late ${PROJECT_SOURCE_DIR}/.pydeps/nvidia/nccl)
  # nvidia.nccl is a namespace package: no __file__, its directory is __path__[0].
  ght_python_dir(_ght_nccl_late "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")
  # Hints first (explicit choices), then the system and the CUDA toolkit, then the wheels.
  find_path(GHT_NCCL_INCLUDE_DIR nccl.h HINTS ${_ght_nccl_hints} PATH_SUFFIXES include
            PATHS ${CUDAToolkit_INCLUDE_DIRS} ${_ght_nccl_late})
  # The library beside that header first (a wheel's header with the system's library would
  # mismatch), then anywhere; per directory, either name.
  if(GHT_NCCL_INCLUDE_DIR)
    get_filename_component(_ght_nccl_prefix ${GHT_NCCL_INCLUDE_DIR} DIRECTORY)
    find_library(GHT_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_ght_nccl_prefix}
                 PATH_SUFFIXES lib lib64 lib/${CMAKE_LIBRARY_ARCHITECTURE} NO_DEFAULT_PATH)
  endif()
  find_library(GHT_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_ght_nccl_hints}
               PATH_SUFFIXES lib lib64 PATHS ${CUDAToolkit_LIBRARY_DIR} ${_ght_nccl_late})
  if(GHT_NCCL_INCLUDE_DIR AND GHT_NCCL_LIBRARY)
    file(STRINGS ${GHT_NCCL_INCLUDE_DIR}/nccl.h _ght_nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
           GHT_NCCL_VERSION "${_ght_nccl_v}")
    # Non-blocking communicators (ncclConfig_t, ncclCommGetAsyncError polling) need 2.14.
    if(GHT_NCCL_VERSION VERSION_LESS 2.14)
      message(STATUS "ghtier: NCCL ${GHT_NCCL_VERSION} at ${GHT_NCCL_INCLUDE_DIR} is older than 2.14; not used")
    else()
      # The library only: trainer/CMakeLists.txt gives the header to the files that include it.
      add_library(ght_nccl INTERFACE)
      target_link_libraries(ght_nccl INTERFACE ${GHT_NCCL_LIBRARY})
      set(GHT_HAVE_NCCL ON)
    endif()
  endif()
endif()
message(STATUS "ghtier: NCCL ${GHT_HAVE_NCCL} (${GHT_NCCL_VERSION} ${GHT_NCCL_LIBRARY})")
