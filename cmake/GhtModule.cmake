# One module per top-level folder (tier, kernels, alloc, optimizer, trainer). A module is an
# OBJECT library `ght_<name>_obj` holding its sources, plus a STATIC library `ght_<name>` that
# tests and tools link (it pulls in the modules it depends on).
#
# Two shared libraries are built from the modules' objects (ght_add_library):
#   ghtier_alloc  (ght::ghtier_alloc)  modules marked ALLOC_LIB (tier, alloc): the tiered
#                 allocator, its C ABI and PyTorch's pluggable-allocator entry points. Needs only
#                 cudart, libnuma and hwloc, so it loads into a process beside PyTorch's own
#                 cuBLAS, cuDNN and OpenMP runtime (tests/alloc/lean_library_test.sh checks).
#   ghtier        (ght::ghtier)        the other modules (kernels, optimizer, trainer), linked
#                 against ghtier_alloc.
# and one static library with every module, `ghtier_static` (libghtier.a).
#
#   ght_module(NAME tier SOURCES a.cpp b.cu DEPS ght_numa [MODULES tier] [OPENMP] [ALLOC_LIB])
# OPENMP: the module's code uses OpenMP (never in an ALLOC_LIB module).
#   ght_module_objects(NAME kernels OBJECTS ght_kernels_cutlass)
# adds another OBJECT library's objects to a module (sources that need their own compile options,
# e.g. another CUDA architecture): they go wherever the module's own objects go.
set_property(GLOBAL PROPERTY GHT_MODULES "")

function(ght_module)
  cmake_parse_arguments(M "OPENMP;ALLOC_LIB" "NAME" "SOURCES;CUDA_SOURCES;DEPS;MODULES" ${ARGN})
  if(M_OPENMP AND M_ALLOC_LIB)
    message(FATAL_ERROR "ght_module(${M_NAME}): the allocator library must not use OpenMP")
  endif()
  set(srcs ${M_SOURCES})
  if(GHT_HAVE_CUDA)
    list(APPEND srcs ${M_CUDA_SOURCES})
  endif()
  if(NOT srcs)
    set(srcs ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  set(deps ${M_DEPS} Threads::Threads)
  if(M_OPENMP)
    list(APPEND deps OpenMP::OpenMP_CXX)
  endif()
  add_library(ght_${M_NAME}_obj OBJECT ${srcs})
  target_include_directories(ght_${M_NAME}_obj PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/alloc/include>)
  target_link_libraries(ght_${M_NAME}_obj PUBLIC ${deps} PRIVATE ght_flags)
  foreach(dep ${M_MODULES})
    target_link_libraries(ght_${M_NAME}_obj PUBLIC ght_${dep})
  endforeach()
  if(GHT_HAVE_CUDA)
    target_compile_definitions(ght_${M_NAME}_obj PUBLIC GHT_HAVE_CUDA=1)
    target_link_libraries(ght_${M_NAME}_obj PUBLIC CUDA::cudart)
    set_target_properties(ght_${M_NAME}_obj PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  endif()
  add_library(ght_${M_NAME} STATIC $<TARGET_OBJECTS:ght_${M_NAME}_obj>)
  target_link_libraries(ght_${M_NAME} PUBLIC ght_${M_NAME}_obj)
  set_property(GLOBAL APPEND PROPERTY GHT_MODULES ${M_NAME})
  set_property(GLOBAL PROPERTY GHT_MODULE_DEPS_${M_NAME} ${deps})
  set_property(GLOBAL PROPERTY GHT_MODULE_ALLOC_LIB_${M_NAME} ${M_ALLOC_LIB})
endfunction()

# Link `target` against the external dependencies of `mods`, with the usage requirements every
# module carries (include directories, GHT_HAVE_CUDA, cudart). CUDART: CUDA::cudart (default) or
# CUDA::cudart_static (linked privately).
function(ght_module_objects)
  cmake_parse_arguments(O "" "NAME" "OBJECTS" ${ARGN})
  foreach(o ${O_OBJECTS})
    target_sources(ght_${O_NAME} PRIVATE $<TARGET_OBJECTS:${o}>)
    set_property(GLOBAL APPEND PROPERTY GHT_MODULE_EXTRA_OBJS_${O_NAME} $<TARGET_OBJECTS:${o}>)
  endforeach()
endfunction()

# The objects of module `m` (its own and those added with ght_module_objects) into `out`.
function(ght_objects_of m out)
  get_property(extra GLOBAL PROPERTY GHT_MODULE_EXTRA_OBJS_${m})
  set(${out} $<TARGET_OBJECTS:ght_${m}_obj> ${extra} PARENT_SCOPE)
endfunction()

function(ght_link_module_deps target mods)
  cmake_parse_arguments(L "" "CUDART" "" ${ARGN})
  set(ext "")
  foreach(m ${mods})
    get_property(d GLOBAL PROPERTY GHT_MODULE_DEPS_${m})
    list(APPEND ext ${d})
  endforeach()
  list(REMOVE_DUPLICATES ext)
  target_link_libraries(${target} PUBLIC ${ext})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/alloc/include>)
  if(GHT_HAVE_CUDA)
    target_compile_definitions(${target} PUBLIC GHT_HAVE_CUDA=1)
    if(L_CUDART STREQUAL "CUDA::cudart_static")
      target_link_libraries(${target} PRIVATE CUDA::cudart_static)
    else()
      target_link_libraries(${target} PUBLIC CUDA::cudart)
    endif()
  endif()
endfunction()

function(ght_add_library)
  get_property(mods GLOBAL PROPERTY GHT_MODULES)
  set(alloc_mods "")
  set(rest_mods "")
  set(all_objs "")
  foreach(m ${mods})
    get_property(lean GLOBAL PROPERTY GHT_MODULE_ALLOC_LIB_${m})
    if(lean)
      list(APPEND alloc_mods ${m})
    else()
      list(APPEND rest_mods ${m})
    endif()
    ght_objects_of(${m} objs)
    list(APPEND all_objs ${objs})
  endforeach()
  set(alloc_objs "")
  foreach(m ${alloc_mods})
    ght_objects_of(${m} objs)
    list(APPEND alloc_objs ${objs})
  endforeach()
  set(rest_objs "")
  foreach(m ${rest_mods})
    ght_objects_of(${m} objs)
    list(APPEND rest_objs ${objs})
  endforeach()

  # The allocator library carries its own copy of the CUDA runtime (as RMM's wheels do): a
  # libcudart.so.13 of ours, loaded before PyTorch, would stand in for the one PyTorch ships
  # (measured: a crash in `import torch` after loading it without RTLD_GLOBAL). Pointers,
  # streams and events are the driver's, so they cross between the two runtimes.
  add_library(ghtier_alloc SHARED ${alloc_objs})
  ght_link_module_deps(ghtier_alloc "${alloc_mods}" CUDART CUDA::cudart_static)
  add_library(ghtier SHARED ${rest_objs})
  ght_link_module_deps(ghtier "${rest_mods}")
  target_link_libraries(ghtier PUBLIC ghtier_alloc)
  # A symbol the allocator library misses (a call into kernels/ or optimizer/) fails the link
  # here instead of a dlopen later; the shared runtime keeps cudart a dependency, not a copy.
  foreach(t ghtier_alloc ghtier)
    target_link_options(${t} PRIVATE -Wl,--no-undefined -Wl,--as-needed)
    set_target_properties(${t} PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  endforeach()
  set_target_properties(ghtier_alloc PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  set_target_properties(ghtier PROPERTIES CUDA_RUNTIME_LIBRARY Shared)

  add_library(ghtier_static STATIC ${all_objs})
  set_target_properties(ghtier_static PROPERTIES OUTPUT_NAME ghtier)
  ght_link_module_deps(ghtier_static "${mods}")

  add_library(ght::ghtier_alloc ALIAS ghtier_alloc)
  add_library(ght::ghtier ALIAS ghtier)
  add_library(ght::ghtier_static ALIAS ghtier_static)
endfunction()

# ght_test(NAME alloc_pool_test SOURCES pool_test.cpp LIBS ght_alloc [LABELS gpu])
function(ght_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main ght_flags)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # GoogleTest's macros declare members that nvcc's front end reports as unreferenced (#177);
  # newer GoogleTest releases trigger it, so silence that one diagnostic in test code only.
  target_compile_options(${T_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
  # Test drivers are cold code (cmake/GhtFlags.cmake); the library code they test keeps its level.
  target_compile_options(${T_NAME} PRIVATE ${GHT_COLD_OPT})
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${T_LABELS}")
endfunction()
