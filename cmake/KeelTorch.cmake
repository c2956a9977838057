# Finds the torch package given by TORCH_ROOT (or asks the Python on PATH) and
# defines the stable shim target `keel_stable`: the only target that sees torch headers.

if(NOT TORCH_ROOT)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE TORCH_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
endif()

set(KEEL_TORCH_INCLUDE "${TORCH_ROOT}/include")
set(KEEL_LIBTORCH_CPU "${TORCH_ROOT}/lib/libtorch_cpu.so")
if(NOT EXISTS "${KEEL_TORCH_INCLUDE}/torch/csrc/stable/library.h")
  message(FATAL_ERROR "keel: ${TORCH_ROOT} has no stable-ABI headers (torch >= 2.10 needed)")
endif()
if(NOT EXISTS "${KEEL_LIBTORCH_CPU}")
  message(FATAL_ERROR "keel: ${KEEL_LIBTORCH_CPU} not found")
endif()

# "2.10" -> 0x020A000000000000 (TORCH_TARGET_VERSION: major << 56 | minor << 48)
string(REPLACE "." ";" _tv "${KEEL_TORCH_TARGET}")
list(GET _tv 0 _tmaj)
list(GET _tv 1 _tmin)
math(EXPR KEEL_TORCH_TARGET_HEX "(${_tmaj} << 56) | (${_tmin} << 48)" OUTPUT_FORMAT HEXADECIMAL)
string(REPLACE "." ";" _pv "${KEEL_PY_LIMITED_API}")
list(GET _pv 0 _pmaj)
list(GET _pv 1 _pmin)
math(EXPR KEEL_PY_LIMITED_HEX "(${_pmaj} << 24) | (${_pmin} << 16)" OUTPUT_FORMAT HEXADECIMAL)
message(STATUS "keel: torch at ${TORCH_ROOT}; TORCH_TARGET_VERSION=${KEEL_TORCH_TARGET_HEX}"
               " (${KEEL_TORCH_TARGET}); Py_LIMITED_API=${KEEL_PY_LIMITED_HEX}")

# The stable shim layer: csrc/stable/ headers + torch's stable/header-only headers.
add_library(keel_stable INTERFACE)
target_include_directories(keel_stable INTERFACE "${PROJECT_SOURCE_DIR}/csrc")
target_include_directories(keel_stable SYSTEM INTERFACE "${KEEL_TORCH_INCLUDE}")
target_compile_definitions(keel_stable INTERFACE
  TORCH_TARGET_VERSION=${KEEL_TORCH_TARGET_HEX}
  Py_LIMITED_API=${KEEL_PY_LIMITED_HEX})
