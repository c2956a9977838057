"""Every CUDA path keel has, the tests that exercise it (by junit id) and the benchmark figure that measures it.

A path ran when at least one of its tests ran (was not skipped) and passed when none failed. A GPU run fails
when a path ran no test; the dry run (no GPU) fails when a path has no test at all, so a renamed test or a
wrong selector shows up here, not on the first GPU. Test ids are junit's `classname::name`, for example
`tests.ops.test_cuda::test_rms_norm[contiguous-(3, 64)-dtype0]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaPath:
    name: str
    tests: str  # regex over junit ids
    figure: str = ""  # key in the benchmarks' "figures"


_OPS = r"tests\.ops\."
_DG = r"tests\.vendored\.deep_gemm\.test_cuda::"
_FA = r"tests\.vendored\.flash_attn\.test_cuda::"
_NONFINITE = r"test_cuda_nonfinite::"
CUDA_PATHS = [
    CudaPath(
        "keel::fused_muladd",
        _OPS + r"test_fused_muladd::.*cuda|" + _OPS + r"test_cuda::test_fused_muladd",
        "keel::fused_muladd",
    ),
    CudaPath("keel::rms_norm", _OPS + r"test_rms_norm::.*cuda|" + _OPS + r"test_cuda::test_rms_norm", "keel::rms_norm"),
    CudaPath(
        "keel::fused_add_rms_norm",
        _OPS + r"test_fused_add_rms_norm::.*cuda|" + _OPS + r"test_cuda::test_fused_add",
        "keel::fused_add_rms_norm",
    ),
    CudaPath(
        "keel::rotary_embedding",
        _OPS + r"test_rotary_embedding::.*cuda|" + _OPS + r"test_cuda::test_rotary",
        "keel::rotary_embedding",
    ),
    CudaPath(
        "keel::silu_and_mul",
        _OPS + r"test_silu_and_mul::.*cuda|" + _OPS + r"test_cuda::test_silu",
        "keel::silu_and_mul",
    ),
    CudaPath(
        "keel::reshape_and_cache",
        _OPS + r"test_reshape_and_cache::.*cuda|" + _OPS + r"test_cuda::test_reshape",
        "keel::reshape_and_cache",
    ),
    CudaPath(
        "keel::linear (cuBLAS through the dispatcher)",
        _OPS + r"test_linear::.*cuda|" + _OPS + r"test_cuda::test_linear",
    ),
    CudaPath(
        "keel ops: aliasing, streams, devices", _OPS + r"test_cuda::test_(aliased|other_stream|mixed|two_devices)"
    ),
    CudaPath("keel ops: device-side range checks", _OPS + r"test_cuda::test_device_check"),
    CudaPath("deep_gemm fp8_gemm_nt", _DG + r"test_(fp8_gemm|gemm_on|mixed|two_devices)", "deep_gemm fp8_gemm_nt"),
    CudaPath("deep_gemm bf16_gemm_nt", _DG + r"test_bf16", "deep_gemm bf16_gemm_nt"),
    CudaPath(
        "deep_gemm casts (per-token, 1x128, 128x128)", _DG + r"test_(per_token|per_block|casts)", "deep_gemm casts"
    ),
    CudaPath("flash_attn varlen", _FA + r"test_cuda_matches_reference_and_cpu\[varlen", "flash_attn varlen"),
    CudaPath("flash_attn paged varlen", _FA + r"test_cuda_matches_reference_and_cpu\[paged"),
    CudaPath(
        "flash_attn kvcache paged (decode)",
        _FA + r"test_cuda_matches_reference_and_cpu\[kv_paged",
        "flash_attn kvcache paged",
    ),
    CudaPath(
        "flash_attn kvcache dense", _FA + r"test_cuda_matches_reference_and_cpu\[kv_dense|" + _FA + r"test_batch_above"
    ),
    CudaPath(
        "flash_attn num_splits, streams, host checks", _FA + r"test_(num_splits|side_stream|host_checks|two_devices)"
    ),
    CudaPath("flash_attn device-side checks", _FA + r"test_device_check"),
    CudaPath("keel ops: non-finite input, rows past the grid, unaligned views", _OPS + _NONFINITE),
    CudaPath("deep_gemm: non-finite input", r"tests\.vendored\.deep_gemm\." + _NONFINITE),
    CudaPath("flash_attn: non-finite input (NaN as the CPU twin)", r"tests\.vendored\.flash_attn\." + _NONFINITE),
    CudaPath("engine on CUDA, bf16", r"tests\.engine\.test_cuda_engine::.*bf16"),
    CudaPath("engine on CUDA, fp8", r"tests\.engine\.test_cuda_engine::.*fp8"),
    CudaPath("keel serve --device cuda", r"tests\.entrypoints\.test_cuda_serve::"),
]


def classify(cases: list[dict[str, str]], benches: dict[str, dict], gpu: bool) -> list[dict]:
    """One row per CUDA path: counts of its tests by outcome, a status, its benchmark figure."""
    figures: dict[str, str] = {}
    for bench in benches.values():
        figures.update(bench.get("figures", {}))
    rows = []
    for path in CUDA_PATHS:
        pattern = re.compile(path.tests)
        mine = [c for c in cases if pattern.search(c["id"])]
        count = {o: sum(c["outcome"] == o for c in mine) for o in ("passed", "failed", "skipped")}
        ran = count["passed"] + count["failed"]
        if count["failed"]:
            status = "failed"
        elif ran:
            status = "passed"
        elif gpu:
            status = "not run"  # a GPU run must run every path
        else:
            status = "skipped (no GPU)" if mine else "not run"  # the dry run: every path must have tests
        rows.append(
            {
                "path": path.name,
                "status": status,
                "ran": ran,
                **count,
                "figure": figures.get(path.figure, "") if path.figure else "",
                "ids": [c["id"] for c in mine],
            }
        )
    return rows
