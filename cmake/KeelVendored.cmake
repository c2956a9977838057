# keel_add_vendored_library(NAME
#     [DEP_SOURCES ...]          torch-free sources of vendored_deps/NAME, compiled once (linked
#                                into both libraries, as are the ISA objects)
#     [DEP_ISA_SOURCES ...]      torch-free CPU kernels of the fork, compiled once per ISA of
#                                KEEL_VENDORED_CPU_ISAS with -DVENDORED_CPU_ISA_NS=cpu_<isa>
#                                and -DVENDORED_CPU_ISA_<ISA>; the fork picks one at run time
#     [DEP_CUDA_SOURCES ...]     the fork's .cu files (CUDA twin only)
#     [ADAPTER_CPU_SOURCES ...]  adapters/NAME sources for _C only (bindings.cpp: the schemas)
#     [ADAPTER_SOURCES ...]      adapters/NAME sources for both libraries (the CUDA twin compiles
#                                them with -DKEEL_CUDA_LIBRARY -DUSE_CUDA)
#     [ADAPTER_CUDA_SOURCES ...] adapters/NAME sources for the CUDA twin only)
#
# Produces keel/vendored/NAME/_C.abi3.so and, when the CUDA library is built, its twin
# keel/vendored/NAME/_C_cuda.abi3.so: each vendored dependency is its own stable-ABI library
# in the wheel, as vLLM ships its DeepGEMM and flash-attention forks. The fork's code (a static
# library per kind) sees no torch and no keel include path: only the adapter knows both.

set(KEEL_VENDORED_CPU_ISAS base avx2 avx512)
set(KEEL_VENDORED_ISA_FLAGS_base "")
set(KEEL_VENDORED_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
# AVX-512 F/BW/VL/DQ + BF16: the fork must check all of them at run time before using this build
set(KEEL_VENDORED_ISA_FLAGS_avx512 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16)
set(KEEL_VENDORED_DEP_FLAGS -O3 -fvisibility=hidden -fvisibility-inlines-hidden -fno-math-errno
    -fno-trapping-math -Wall -Wextra -Wno-unused-parameter)

function(_keel_vendored_dep_target target name)
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/vendored_deps/${name}")
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

function(keel_add_vendored_library name)
  cmake_parse_arguments(ARG "" ""
    "DEP_SOURCES;DEP_ISA_SOURCES;DEP_CUDA_SOURCES;ADAPTER_CPU_SOURCES;ADAPTER_SOURCES;ADAPTER_CUDA_SOURCES" ${ARGN})
  set(_dep_dir "${PROJECT_SOURCE_DIR}/vendored_deps/${name}")
  set(_objects "")
  if(ARG_DEP_SOURCES)
    add_library(vendored_${name}_dep OBJECT ${ARG_DEP_SOURCES})
    _keel_vendored_dep_target(vendored_${name}_dep ${name})
    target_compile_features(vendored_${name}_dep PRIVATE cxx_std_17)
    target_compile_options(vendored_${name}_dep PRIVATE ${KEEL_VENDORED_DEP_FLAGS})
    list(APPEND _objects vendored_${name}_dep)
  endif()
  if(ARG_DEP_ISA_SOURCES)
    foreach(isa IN LISTS KEEL_VENDORED_CPU_ISAS)
      set(_t vendored_${name}_dep_${isa})
      add_library(${_t} OBJECT ${ARG_DEP_ISA_SOURCES})
      _keel_vendored_dep_target(${_t} ${name})
      target_compile_features(${_t} PRIVATE cxx_std_17)
      string(TOUPPER "${isa}" _ISA)
      target_compile_definitions(${_t} PRIVATE VENDORED_CPU_ISA_NS=cpu_${isa} VENDORED_CPU_ISA_${_ISA}=1)
      target_compile_options(${_t} PRIVATE ${KEEL_VENDORED_DEP_FLAGS} ${KEEL_VENDORED_ISA_FLAGS_${isa}})
      list(APPEND _objects ${_t})
    endforeach()
    message(STATUS "keel: building vendored ${name} CPU kernels for ${KEEL_VENDORED_CPU_ISAS}")
  endif()

  set(_includes "${PROJECT_SOURCE_DIR}/adapters" "${_dep_dir}")
  keel_add_library(vendored_${name}_C
    OUTPUT_NAME _C SUBDIR vendored/${name}
    SOURCES ${ARG_ADAPTER_CPU_SOURCES} ${ARG_ADAPTER_SOURCES}
    OBJECTS ${_objects}
    INCLUDES ${_includes}
    TORCH_LIBS "${KEEL_LIBTORCH_CPU}")

  if(KEEL_BUILD_CUDA AND (ARG_ADAPTER_SOURCES OR ARG_ADAPTER_CUDA_SOURCES))
    set(_cuda_objects ${_objects})  # the fork's host code serves both libraries
    if(ARG_DEP_CUDA_SOURCES)
      set(_t vendored_${name}_dep_cuda)
      add_library(${_t} OBJECT ${ARG_DEP_CUDA_SOURCES})
      _keel_vendored_dep_target(${_t} ${name})
      set_target_properties(${_t} PROPERTIES CUDA_STANDARD 17 CUDA_ARCHITECTURES "${KEEL_CUDA_ARCHS}")
      target_compile_options(${_t} PRIVATE ${KEEL_CUDA_FLAGS})
      list(APPEND _cuda_objects ${_t})
      message(STATUS "keel: building vendored ${name} CUDA kernels for archs ${KEEL_CUDA_ARCHS}")
    endif()
    keel_add_library(vendored_${name}_C_cuda
      OUTPUT_NAME _C_cuda SUBDIR vendored/${name}
      SOURCES ${ARG_ADAPTER_SOURCES} ${ARG_ADAPTER_CUDA_SOURCES}
      OBJECTS ${_cuda_objects}
      INCLUDES ${_includes}
      DEFINITIONS KEEL_CUDA_LIBRARY USE_CUDA
      TORCH_LIBS "${KEEL_LIBTORCH_CPU};${KEEL_LIBTORCH_CUDA}"
      LINK CUDA::cudart_static)
  elseif(NOT KEEL_BUILD_CUDA)
    message(STATUS "keel: not building vendored/${name}/_C_cuda because the CUDA library is off")
  endif()
endfunction()
