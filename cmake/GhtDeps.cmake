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
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c
                    "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
                    OUTPUT_VARIABLE _ght_cutlass_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    list(APPEND _ght_cutlass_hints ${_ght_cutlass_py})
  endif()
  find_path(GHT_CUTLASS_INCLUDE cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp
            HINTS ${_ght_cutlass_hints} NO_DEFAULT_PATH)
  if(GHT_CUTLASS_INCLUDE)
    set(GHT_HAVE_CUTLASS ON)
  endif()
endif()
message(STATUS "ghtier: CUTLASS ${GHT_HAVE_CUTLASS} (${GHT_CUTLASS_INCLUDE})")
