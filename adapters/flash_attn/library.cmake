# keel/vendored/flash_attn: the vendored flash-attention-style kernels (vendored_deps/flash_attn)
# behind keel_flash_attn's stable schemas (adapters/flash_attn/bindings.cpp): _C (CPU) and the
# _C_cuda twin (the same adapter, device tensors, the fork's CUDA kernel).
set(_fa "${PROJECT_SOURCE_DIR}/vendored_deps/flash_attn/src")
keel_add_vendored_library(flash_attn
  DEP_SOURCES "${_fa}/flash_api.cpp"
  DEP_ISA_SOURCES "${_fa}/cpu/flash_fwd_cpu.cpp"
  DEP_CUDA_SOURCES "${_fa}/cuda/flash_fwd_cuda.cu"
  ADAPTER_CPU_SOURCES "${PROJECT_SOURCE_DIR}/adapters/flash_attn/bindings.cpp"
  ADAPTER_SOURCES "${PROJECT_SOURCE_DIR}/adapters/flash_attn/flash_attn.cpp")
