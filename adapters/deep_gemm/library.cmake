# keel/vendored/deep_gemm/_C.abi3.so (+ _C_cuda twin): the DeepGEMM-style FP8 GEMM fork in
# vendored_deps/deep_gemm behind its stable-ABI adapter (namespace keel_deep_gemm).
set(_dg "${PROJECT_SOURCE_DIR}/vendored_deps/deep_gemm/csrc")
keel_add_vendored_library(deep_gemm
  DEP_SOURCES "${_dg}/apis/gemm.cpp" "${_dg}/apis/cast.cpp" "${_dg}/apis/runtime.cpp"
  DEP_ISA_SOURCES "${_dg}/cpu/gemm_kernels.cpp"
  DEP_CUDA_SOURCES "${_dg}/cuda/gemm.cu" "${_dg}/cuda/cast.cu"
  ADAPTER_CPU_SOURCES "${PROJECT_SOURCE_DIR}/adapters/deep_gemm/bindings.cpp"
  ADAPTER_SOURCES "${PROJECT_SOURCE_DIR}/adapters/deep_gemm/deep_gemm.cpp")
