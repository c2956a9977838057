"""The inventory on real sdists nobody here wrote, when they are in a local cache (no network in the
suite): KEEL_INVENTORY_SDISTS, else the checkout's .cache/inventory/ (docs/measurements/2026-12-07-inventory.md
says how they were fetched). vLLM 0.34.0: its CPU and ROCm sources flagged, its stable library clean but for
the explained files, every hit of vLLM's regex hook on torch's API a finding; flash-attention 2.8.3.post2:
FA2 flagged, the vendored composable_kernel and CUTLASS trees left out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from audit_support import load_script

from keel_audit.inventory.knowledge import knowledge
from keel_audit.inventory.project import analyse
from keel_audit.inventory.sources import Tree

pytestmark = pytest.mark.slow
CACHE = Path(os.environ.get("KEEL_INVENTORY_SDISTS", Path(__file__).resolve().parents[2] / ".cache/inventory"))
# paths-of: the vllm 0.34.0 and flash_attn 2.8.3.post2 sdists
# vLLM sources outside csrc/cpu and csrc/rocm that may stay unstable, and why (the measurement page's table)
VLLM_EXPLAINED = {
    "csrc/attention/octave_": "the ROCm-only legacy _C (CMakeLists.txt)",
    "vllm/models/deepseek_v41/amd/ops/topk512_gfx942.cu": "built at run time on AMD gfx942",
    "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/utils/hf3fs_utils.cpp": "a cpp_extension JIT module",
    "csrc/quantization/w8a8/fp8/common.cuh": "its USE_ROCM branch without TORCH_TARGET_VERSION",
    "csrc/core/registration.h": "TORCH_LIBRARY_EXPAND, used by the legacy _C",
}


def _sdist(name: str) -> Path:
    path = CACHE / name
    if not path.is_file():
        pytest.skip(f"{path} is not in the local cache (see docs/measurements/2026-12-07-inventory.md)")
    return path


def test_vllm_0_34_0() -> None:
    measure = load_script("measure_inventory")
    sdist = _sdist("vllm-0.34.0.tar.gz")
    trees: dict[str, Tree] = {}
    (project,) = analyse([str(sdist)], knowledge(), trees=trees)
    paths = {path for path, _ in project.findings}
    assert any(p.startswith("csrc/cpu/") for p in paths) and any(p.startswith("csrc/rocm/") for p in paths)
    unexplained = sorted(
        p for p in paths if not p.startswith(("csrc/cpu/", "csrc/rocm/")) and not p.startswith(tuple(VLLM_EXPLAINED))
    )
    assert unexplained == []
    assert ".".join(map(str, project.target or ())) == "2.10"
    hook = measure.recall(project, trees[str(sdist)])
    assert hook["hook_hits"] > 1500
    defined = set().union(*(r.scan.defines for r in project.files.values()))
    # every hook hit the inventory does not report is a macro of vLLM's own (defined in its sources)
    for miss in hook["not_found"]:
        assert miss["pattern"] == "AT_DISPATCH_" and any(name in miss["source"] for name in defined), miss


def test_flash_attn_2_8_3_post2() -> None:
    measure = load_script("measure_inventory")
    sdist = _sdist("flash_attn-2.8.3.post2.tar.gz")
    trees: dict[str, Tree] = {}
    (project,) = analyse([str(sdist)], knowledge(), trees=trees)
    assert project.third_party == ["csrc/composable_kernel", "csrc/cutlass"]
    paths = [path for path, _ in project.findings]
    assert sum(p.startswith("csrc/flash_attn/") for p in paths) > 400
    assert not any(p.startswith(("csrc/composable_kernel/", "csrc/cutlass/")) for p in paths)
    hook = measure.recall(project, trees[str(sdist)])
    assert hook["hook_hits"] > 800 and hook["not_found"] == []
