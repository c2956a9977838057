"""The table generator: guards become versions, header/export disagreements are recorded."""

from __future__ import annotations

from types import ModuleType

from audit_support import load_script

HEADER = """
#pragma once
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_old(int x);
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_10_0
AOTI_TORCH_EXPORT AOTITorchError
torch_split_decl(int a,
                 int b);
#ifdef USE_CUDA
AOTI_TORCH_EXPORT int32_t torch_cuda_thing(); // inside two guards
#endif
#endif // TORCH_FEATURE_VERSION >= TORCH_VERSION_2_10_0
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_14_0
AOTI_TORCH_EXPORT int32_t torch_brand_new();
#endif
"""


def _generator() -> ModuleType:
    return load_script("gen_shim_table")


def test_header_guards() -> None:
    assert _generator().header_symbols(HEADER) == {
        "aoti_torch_old": "2.9",
        "torch_split_decl": "2.10",
        "torch_cuda_thing": "2.10",
        "torch_brand_new": "2.14",
    }


def test_merge_records_disagreements() -> None:
    gen = _generator()
    a = {
        "version": "2.13.0",
        "declared": {"torch_x": "2.12", "torch_gone": "2.9"},
        "exported": {"torch_x": "libtorch_cpu.so", "torch_hidden": "libtorch_cpu.so"},
        "python_globals": {"THPVariableClass"},
        "header_only": {"c10::BFloat16"},
        "has_cuda": False,
    }
    b = {
        "version": "2.14.1",
        "declared": {"torch_x": "2.12", "torch_new": "2.14", "torch_gone": "2.9"},
        "exported": {
            "torch_x": "libtorch_cpu.so",
            "torch_new": "libtorch_cpu.so",
            "torch_gone": "libtorch_cpu.so",
        },
        "python_globals": set(),
        "header_only": {"c10::BFloat16", "c10::Float8_e8m0fnu"},
        "has_cuda": True,
    }
    table = gen.merge([b, a])
    assert table["torch_versions"] == ["2.13.0", "2.14.1"]
    assert {k: v["since"] for k, v in table["symbols"].items()} == {
        "torch_x": "2.12",  # exported by the oldest release read: its guard may be older
        "torch_gone": "2.14",  # declared since 2.9, first exported by 2.14
        "torch_hidden": "2.13",
        "torch_new": "2.14",
    }
    assert table["symbols"]["torch_new"]["library"] == "libtorch_cpu.so"
    assert table["header_only"] == {"c10::BFloat16": "2.13", "c10::Float8_e8m0fnu": "2.14"}
    kinds = {(d["symbol"], d["kind"]) for d in table["disagreements"]}
    assert kinds == {
        ("torch_gone", "declared-not-exported"),
        ("torch_gone", "guard-differs"),
        ("torch_hidden", "exported-not-declared"),
    }


HEADER_ONLY = """
#pragma once
#include <cstdint>
#define C10_THING(x) namespace c10 { struct NotReal {}; }
namespace c10 {
struct alignas(2) BFloat16 {
  uint16_t x;
  inline C10_HOST_DEVICE BFloat16 at(int i) const;  // a member, not c10::at
};
inline const char* toString(int t) { return "x"; }
namespace detail {
inline float f32_from_bits(uint16_t src) { return 0; }
} // namespace detail
namespace {
inline int local_only() { return 0; }
} // namespace
} // namespace c10
HIDDEN_NAMESPACE_BEGIN(torch, headeronly)
using c10::BFloat16;
using c10::operator<<;
HIDDEN_NAMESPACE_END(torch, headeronly)
"""


def test_header_only_names() -> None:
    assert _generator().header_only_names(HEADER_ONLY) == {
        "c10::BFloat16",
        "c10::toString",
        "c10::detail::f32_from_bits",
    }
