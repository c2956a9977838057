"""What the inventory reports for one file: each kind of unstable use with its replacement, nothing
inside comments, strings or `#if 0`, header-only c10 names left alone, tensor methods only on
tensors, and the TORCH_TARGET_VERSION that stable uses (and their feature guards) imply."""

from __future__ import annotations

import pytest

from keel_audit.inventory.knowledge import knowledge
from keel_audit.inventory.scan import FileScan, Scanner


@pytest.fixture(scope="module")
def scan() -> object:
    scanner = Scanner(knowledge())
    return scanner.scan


def _found(result: FileScan) -> list[tuple[int, str, str]]:
    return [(f.line, f.kind, f.what) for f in result.findings]


def test_each_kind_with_its_replacement(scan) -> None:  # type: ignore[no-untyped-def]
    text = """#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/some_internal.h>
at::Tensor f(const torch::Tensor& x, at::ScalarType t) {
  TORCH_CHECK(x.numel() > 0, "empty");
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] { x.data_ptr<scalar_t>(); });
  return x.contiguous();
}
TORCH_LIBRARY(ns, m) { m.def("f(Tensor x) -> Tensor"); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
"""
    result = scan(text)
    found = {(kind, what): f for f in result.findings for kind, what in [(f.kind, f.what)]}
    assert set(found) == {
        ("include", "#include <torch/extension.h>"),
        ("include", "#include <ATen/cuda/CUDAContext.h>"),
        ("include", "#include <c10/util/some_internal.h>"),
        ("name", "at::Tensor"),
        ("name", "torch::Tensor"),
        ("name", "at::ScalarType"),
        ("name", "at::cuda::getCurrentCUDAStream"),
        ("macro", "TORCH_CHECK"),
        ("macro", "AT_DISPATCH_FLOATING_TYPES"),
        ("macro", "TORCH_LIBRARY"),
        ("macro", "PYBIND11_MODULE"),
        ("method", "x.data_ptr"),
        ("method", "x.contiguous"),
    }
    assert found[("macro", "TORCH_CHECK")].rule.replacement == "STD_TORCH_CHECK"
    assert found[("name", "at::Tensor")].rule.replacement == "torch::stable::Tensor"
    assert found[("macro", "TORCH_LIBRARY")].rule.since == (2, 10)  # TORCH_BOX came with 2.10
    assert found[("include", "#include <c10/util/some_internal.h>")].rule.status == "none"
    assert (found[("method", "x.contiguous")].line, found[("method", "x.contiguous")].col) == (8, 10)
    assert result.target() == (2, 10)


def test_comments_strings_and_disabled_branches_are_not_code(scan) -> None:  # type: ignore[no-untyped-def]
    text = """// at::Tensor TORCH_CHECK
/* #include <torch/extension.h> */
const char* s = "at::Tensor TORCH_CHECK(";
#if 0
at::Tensor dead;
#include <ATen/ATen.h>
#elif defined(USE_ROCM)
at::Tensor rocm_only;
#endif
#if 1
#else
TORCH_CHECK(false);
#endif
"""
    assert _found(scan(text)) == [(8, "name", "at::Tensor")]


def test_stable_code_is_clean_and_sets_the_target(scan) -> None:  # type: ignore[no-untyped-def]
    text = """#include <torch/csrc/stable/library.h>
#include <torch/headeronly/core/ScalarType.h>
using torch::stable::Tensor;
Tensor f(const Tensor& x) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float, "float");
  c10::BFloat16 b;  // header-only: no ABI tie
  auto* p = x.mutable_data_ptr<float>();
  return torch::stable::empty_like(x);
}
STABLE_TORCH_LIBRARY(ns, m) {}
"""
    result = scan(text)
    assert result.findings == []
    assert result.target() == (2, 10)  # mutable_data_ptr sits under a 2.10 feature guard
    assert {"torch::stable::Tensor::mutable_data_ptr", "STD_TORCH_CHECK", "torch::stable::empty_like"} <= set(
        result.uses
    )


def test_uses_under_a_feature_guard_do_not_raise_the_target(scan) -> None:  # type: ignore[no-untyped-def]
    guarded = """#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
void g() { torch_exception_get_what(); }
#endif
void h() { aoti_torch_get_current_cuda_stream(0, nullptr); }
"""
    assert scan(guarded).target() == (2, 9)
    assert scan(guarded.replace("#if TORCH", "#if X && TORCH").replace("2_13", "2_11")).target() == (2, 13)


def test_using_namespace_and_receiver_types(scan) -> None:  # type: ignore[no-untyped-def]
    text = """using namespace at;
Tensor f(Tensor x, std::vector<int> v) {
  auto y = at::empty({2}, x.options());
  v.clear();
  y.zero_();
  return x;
}
void g() {
  Vec data(1);
  data.save(nullptr);
}
void k(const at::Tensor& data) { data.options(); }
"""
    found = _found(scan(text))
    assert (2, "name", "at::Tensor") in found
    assert (3, "method", "x.options") in found and (5, "method", "y.zero_") in found
    assert not any(w in ("v.clear", "data.save") for _, _, w in found)  # not tensors
    assert (12, "method", "data.options") in found  # this `data` is a tensor


def test_project_macros_and_header_only_names(scan) -> None:  # type: ignore[no-untyped-def]
    text = """#define AT_DISPATCH_BOOL(v, ...) if (v) { __VA_ARGS__ }
#define MY_CHECK(x) TORCH_CHECK(x, "failed")
void f(bool b) { AT_DISPATCH_BOOL(b, MY_CHECK(b)); c10::Half h; c10::irange(3); at::vec::Vectorized<float> v; }
"""
    found = _found(scan(text))
    assert found == [(2, "macro", "TORCH_CHECK"), (3, "name", "at::vec::Vectorized")]


def test_spaces_and_global_qualifiers(scan) -> None:  # type: ignore[no-untyped-def]
    text = "::at::Tensor a; at::Tensor  b; mylib::at::Tensor c; x.at(0); std::vector<at::Tensor> d;\n"
    assert [(f.col, f.what) for f in scan(text).findings] == [(3, "at::Tensor"), (17, "at::Tensor"), (74, "at::Tensor")]
