"""The image build's torch gate: `keel-audit preflight` of the keel wheel against the candidate torch wheel.

    python preflight_gate.py KEEL_WHEEL TORCH_DIR

TORCH_DIR holds the candidate torch-*.whl and, for a CUDA build, its nvidia-* / cuda-* wheels (passed as
`--also`); the NVIDIA driver's libcuda.so.1 is assumed (the container runtime mounts it on GPU hosts).
Prints the preflight's table, then the verdict. Exit 0: every library of keel loads on this torch, or, on a
CPU-only torch, every library except the CUDA twins, which fail only for the CUDA libraries a CPU-only torch
does not have (keel then runs its CPU kernels, as `keel doctor` reports). Exit 1: the preflight refused this
torch (the reason is printed); exit 2: an input could not be read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def cuda_only_failure(lib: dict[str, Any]) -> bool:
    """A CUDA twin that fails only because a CPU-only torch provides no CUDA library."""
    unprovided = {u["name"] for u in lib["unprovided"]}
    return (
        bool(unprovided)
        and all("cuda" in name for name in unprovided)
        and all(m.get("expected_from") in unprovided for m in lib["missing"])
        and not lib["missing_versions"]
        and lib["python_ok"]
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: preflight_gate.py KEEL_WHEEL TORCH_DIR", file=sys.stderr)
        return 2
    from keel_audit.errors import AuditError
    from keel_audit.preflight import preflight

    wheel, torch_dir = argv[0], Path(argv[1])
    torches = sorted(torch_dir.glob("torch-*.whl"))
    if len(torches) != 1:
        print(f"preflight gate: expected one torch-*.whl in {torch_dir}, found {len(torches)}", file=sys.stderr)
        return 2
    also = sorted(str(p) for p in torch_dir.glob("*.whl") if p.name.startswith(("nvidia", "cuda_")))
    try:
        result = preflight([wheel], str(torches[0]), also=also, assume=["libcuda.so.1"])
    except AuditError as exc:
        print(f"keel-audit preflight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(result.render(), flush=True)
    doc = result.to_json()
    version = doc["candidate"]["version"]
    cpu_only = doc["candidate"]["cuda"] is None
    refused = []
    for lib in doc["libraries"]:
        if lib["loads"]:
            continue
        if cpu_only and cuda_only_failure(lib):
            print(f"preflight gate: {lib['path']}: a CUDA twin; torch {version} is CPU-only, keel uses its CPU kernels")
            continue
        missing = ", ".join(m["symbol"] for m in lib["missing"][:4])
        more = f" (+{len(lib['missing']) - 4} more)" if len(lib["missing"]) > 4 else ""
        why = f"missing {missing}{more}" if missing else "; ".join(u["why"] for u in lib["unprovided"]) or "see above"
        refused.append(f"{lib['path']}: {lib['verdict']}: {why}")
    if refused:
        print(f"keel-audit preflight REFUSED torch {version} for {Path(wheel).name}:", file=sys.stderr)
        for line in refused:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"preflight gate: torch {version} accepted for {Path(wheel).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
