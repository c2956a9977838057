# keel/vendored/flash_attn: the vendored flash-attention-style kernels (vendored_deps/flash_attn)
# behind keel_flash_attn's stable schemas (adapters/flash_attn/bindings.cpp).
keel_add_vendored_library(flash_attn
  DEP_SOURCES "${PROJECT_SOURCE_DIR}/vendored_deps/flash_attn/src/flash_api.cpp"
  DEP_ISA_SOURCES "${PROJECT_SOURCE_DIR}/vendored_deps/flash_attn/src/cpu/flash_fwd_cpu.cpp"
  ADAPTER_CPU_SOURCES "${PROJECT_SOURCE_DIR}/adapters/flash_attn/bindings.cpp"
                      "${PROJECT_SOURCE_DIR}/adapters/flash_attn/flash_attn.cpp")
