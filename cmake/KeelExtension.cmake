# keel_add_cpu_kernels(NAME SOURCES ...)
#   Two object libraries NAME_base and NAME_avx2 from the same torch-free kernel
#   sources: baseline x86-64, and AVX2+FMA+F16C. ops/cpu_isa.cpp picks one at run time.
#   Kernel sources get no torch include path, so a stray torch include fails to build.
#
# keel_add_library(NAME SOURCES ... [OBJECTS ...] [DEFINITIONS ...] TORCH_LIBS ... [LINK ...]
#                  [OUTPUT_NAME N] [SUBDIR D] [INCLUDES ...])
#   One stable-ABI shared library keel/[D/]N.abi3.so (N defaults to NAME): hidden visibility,
#   no RPATH, C++17, linked against the given torch libraries (never libc10.so).

set(KEEL_CXX_FLAGS -O3 -fvisibility=hidden -fvisibility-inlines-hidden -fopenmp-simd
    -Wall -Wextra -Wno-unused-parameter)

function(keel_add_cpu_kernels name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  foreach(isa base avx2)
    add_library(${name}_${isa} OBJECT ${ARG_SOURCES})
    target_include_directories(${name}_${isa} PRIVATE "${PROJECT_SOURCE_DIR}/csrc")
    target_compile_features(${name}_${isa} PRIVATE cxx_std_17)
    set_target_properties(${name}_${isa} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    # no FP exception flags or errno are observed by kernels: lets selects and sqrt vectorize
    target_compile_options(${name}_${isa} PRIVATE ${KEEL_CXX_FLAGS} -fno-trapping-math -fno-math-errno)
    target_compile_definitions(${name}_${isa} PRIVATE KEEL_CPU_NS=cpu_${isa})
    if(isa STREQUAL "avx2")
      target_compile_options(${name}_${isa} PRIVATE -mavx2 -mfma -mf16c)
    endif()
  endforeach()
  message(STATUS "keel: building CPU kernels for baseline x86-64 and AVX2+FMA+F16C")
endfunction()

function(keel_add_library name)
  cmake_parse_arguments(ARG "" "OUTPUT_NAME;SUBDIR" "SOURCES;OBJECTS;DEFINITIONS;TORCH_LIBS;LINK;INCLUDES" ${ARGN})
  if(NOT ARG_OUTPUT_NAME)
    set(ARG_OUTPUT_NAME ${name})
  endif()
  set(_dest keel)
  if(ARG_SUBDIR)
    set(_dest keel/${ARG_SUBDIR})
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${ARG_INCLUDES})
  foreach(obj IN LISTS ARG_OBJECTS)
    target_sources(${name} PRIVATE $<TARGET_OBJECTS:${obj}>)
  endforeach()
  target_link_libraries(${name} PRIVATE keel_stable ${ARG_TORCH_LIBS} ${ARG_LINK})
  target_compile_definitions(${name} PRIVATE ${ARG_DEFINITIONS})
  target_compile_features(${name} PRIVATE cxx_std_17)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KEEL_CXX_FLAGS}>)
  set_target_properties(${name} PROPERTIES
    OUTPUT_NAME ${ARG_OUTPUT_NAME} PREFIX "" SUFFIX ".abi3.so"
    SKIP_BUILD_RPATH ON INSTALL_RPATH "" BUILD_WITH_INSTALL_RPATH OFF
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # every symbol must resolve against the listed libraries (catches a missing stub entry)
  target_link_options(${name} PRIVATE -Wl,--no-undefined -Wl,--as-needed -Wl,-z,now)
  if(ARG_SUBDIR)
    # setup.py points CMAKE_LIBRARY_OUTPUT_DIRECTORY at the package folder keel/
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/${ARG_SUBDIR}")
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION ${_dest})
  message(STATUS "keel: building ${_dest}/${ARG_OUTPUT_NAME}.abi3.so against ${ARG_TORCH_LIBS}")
endfunction()
