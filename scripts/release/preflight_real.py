#!/usr/bin/env python
"""`keel-audit preflight` on real wheels, checked against what the dynamic loader then does.

For each torch version: predict, from the wheels alone (torch's .whl plus the nvidia-* wheels pip
fetches for it, none installed), whether every library of vllm 0.33.0 and of keel's own wheel
loads; then install that torch (and vllm, keel with --no-deps) into a fresh venv, and load each
library with `ctypes.CDLL(path, RTLD_NOW)` after `import torch`, one process per library. One row
per (torch, library): predicted, observed, and the reason when they differ. The venv and the
downloaded dependencies are deleted after each version (a CUDA torch with its nvidia-* wheels is
5-7 GB installed). This machine has no NVIDIA driver: libraries that need libcuda.so.1 cannot load
here, and the prediction says so (a third column predicts with `--assume libcuda.so.1`, a GPU host).

    python scripts/release/preflight_real.py --wheels /work/wt/torchwheels --work /work/wt/pfwork \\
        --versions 2.12.1 2.13.0 2.14.1 2.15.0 2.9.1 --out /work/wt/pfwork/results.json
    python scripts/release/preflight_real.py --table /work/wt/pfwork/results.json    # the markdown table

`--wheels` holds torch-X-*.whl (pip download torch==X --no-deps) and vllm-0.33.0-*.whl; keel's
wheel is dist/keel-*.whl (scripts/test.sh builds it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

from keel_audit.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
LOAD = (
    "import sys, os, ctypes\n"
    "import torch\n"
    "try:\n"
    "    ctypes.CDLL(sys.argv[1], os.RTLD_NOW)\n"
    "except OSError as e:\n"
    "    print(str(e).splitlines()[0][-300:]); sys.exit(3)\n"
)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def _pip_env() -> dict[str, str]:
    # this machine caps torch at 2.14.1 through /etc/xdg/pip/constraints.txt; lift it for these commands
    return {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _summ(lib: dict) -> str:  # type: ignore[type-arg]
    why = [f"needs {u['name']}" for u in lib["unprovided"]]
    why += [
        f"{m['symbol']}" for m in lib["missing"] if m["expected_from"] not in {u["name"] for u in lib["unprovided"]}
    ]
    why += [f"version {v['version']} of {v['file']}" for v in lib["missing_versions"]]
    return "; ".join(why[:4]) + (" ..." if len(why) > 4 else "")


def _is_executable(path: Path) -> bool:
    """An ELF with PT_INTERP (a program such as vllm's vllm-rs): dlopen refuses it, the loader runs it."""
    head = path.read_bytes()[:65536]
    if head[:4] != b"\x7fELF" or head[4] != 2:
        return False
    (phoff,) = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    return any(struct.unpack_from("<I", head, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def observe(py: str, path: Path) -> dict:  # type: ignore[type-arg]
    """What the loader does: dlopen(RTLD_NOW) after `import torch`; a program is started with
    LD_BIND_NOW=1 (every symbol bound before main) and `--help`."""
    if _is_executable(path):
        env = {**os.environ, "LD_BIND_NOW": "1"}
        try:
            done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=30, env=env)
        except subprocess.TimeoutExpired:
            return {"loads": True, "rc": None, "error": "", "how": "exec --help (still running after 30 s)"}
        text = done.stderr + done.stdout
        bad = "error while loading shared libraries" in text or "symbol lookup error" in text
        msg = next((ln for ln in text.splitlines() if "error" in ln), "")[-300:] if bad else ""
        return {"loads": not bad, "rc": done.returncode, "error": msg, "how": "exec --help, LD_BIND_NOW=1"}
    done = subprocess.run([py, "-c", LOAD, str(path)], capture_output=True, text=True)
    msg = ""
    if done.returncode:
        out = (done.stdout.strip() or done.stderr.strip()).splitlines()
        msg = out[-1] if out else f"exit code {done.returncode}"
    return {"loads": done.returncode == 0, "rc": done.returncode, "error": msg, "how": "ctypes.CDLL RTLD_NOW"}


def stub_driver(work: Path, preds: list[dict]) -> Path:  # type: ignore[type-arg]
    """A stand-in libcuda.so.1 defining every symbol the predictions expected from it, each a function
    returning CUDA_ERROR_UNKNOWN (999): with it on LD_LIBRARY_PATH the loader gets past the missing
    driver to symbol resolution, which is what the `--assume libcuda.so.1` column predicts (it checks
    binding, not that a driver works)."""
    names = sorted(
        {
            m["symbol"]
            for doc in preds
            for lib in doc["libraries"]
            for m in lib["missing"]
            if m["expected_from"] == "libcuda.so.1"
        }
    )
    d = work / "stub-driver"
    d.mkdir(parents=True, exist_ok=True)
    src = d / "libcuda.c"
    src.write_text("".join(f"int {n}(void) {{ return 999; }}\n" for n in names))
    lib = d / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src), "-Wl,-soname,libcuda.so.1"], check=True)
    return d


def one_version(version: str, wheels: Path, keel: Path, work: Path, stub: bool = False) -> dict:  # type: ignore[type-arg]
    torch_whl = next(
        iter(sorted(wheels.glob(f"torch-{version}-*.whl")) + sorted(wheels.glob(f"torch-{version}+*.whl")))
    )
    vllm = next(iter(sorted(wheels.glob("vllm-0.33.0-*.whl"))))
    deps = work / f"deps-{version}"
    venv = work / f"venv-{version}"
    shutil.rmtree(deps, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    out: dict = {"torch": version, "torch_wheel": torch_whl.name, "packages": {}}  # type: ignore[type-arg]
    try:
        # the dependencies pip would install, as wheels (nothing installed yet)
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(deps), str(torch_whl)],
            _pip_env(),
        )
        nvidia = sorted(str(p) for p in deps.glob("*.whl") if p.name.startswith(("nvidia", "cuda_")))
        out["also"] = [Path(p).name for p in nvidia]
        for name, target in (("vllm", vllm), ("keel", keel)):
            t0 = time.perf_counter()
            pred = preflight([str(target)], str(torch_whl), also=nvidia)
            secs = time.perf_counter() - t0
            drv = preflight([str(target)], str(torch_whl), also=nvidia, assume=["libcuda.so.1"])
            out["packages"][name] = {
                "wheel": target.name,
                "seconds": round(secs, 2),
                "predicted": pred.to_json(),
                "predicted_with_driver": {lib.path: lib.loads for lib in drv.libraries},
            }
        _run([sys.executable, "-m", "venv", str(venv)])
        py = str(venv / "bin" / "python")
        _run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(deps), str(torch_whl)], _pip_env())
        _run([py, "-m", "pip", "install", "-q", "--no-deps", str(vllm), str(keel)], _pip_env())
        site = Path(
            subprocess.run(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        out["torch_version"] = subprocess.run(
            [py, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], capture_output=True, text=True
        ).stdout.strip()
        for name in ("vllm", "keel"):
            observed = {}
            for lib in out["packages"][name]["predicted"]["libraries"]:
                observed[lib["path"]] = observe(py, site / lib["path"])
            out["packages"][name]["observed"] = observed
            if stub:  # the same loads with a stand-in libcuda.so.1: what the GPU-host column predicts
                d = stub_driver(work, [out["packages"][n]["predicted"] for n in ("vllm", "keel")])
                old = os.environ.get("LD_LIBRARY_PATH")
                os.environ["LD_LIBRARY_PATH"] = f"{d}:{old}" if old else str(d)
                try:
                    out["packages"][name]["observed_stub_driver"] = {
                        lib["path"]: observe(py, site / lib["path"])
                        for lib in out["packages"][name]["predicted"]["libraries"]
                    }
                finally:
                    if old is None:
                        os.environ.pop("LD_LIBRARY_PATH", None)
                    else:
                        os.environ["LD_LIBRARY_PATH"] = old
            # the same prediction against the installed environment (site-packages: torch and nvidia/*)
            inst = preflight([str(site / name)], str(site))
            out["packages"][name]["predicted_installed"] = {f"{name}/{lib.path}": lib.loads for lib in inst.libraries}
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(deps, ignore_errors=True)
    return out


def table(results: list[dict]) -> str:  # type: ignore[type-arg]
    rows = [
        "| torch | library | predicted (wheels) | predicted, GPU host | observed here | agree "
        "| why (predicted) / loader error |",
        "|---|---|---|---|---|---|---|",
    ]
    agree = total = 0
    stub_rows: list[tuple[str, str, bool | None, dict]] = []  # type: ignore[type-arg]
    for r in results:
        for pkg in r["packages"].values():
            if "observed" not in pkg:
                continue
            for lib in pkg["predicted"]["libraries"]:
                obs = pkg["observed"][lib["path"]]
                same = lib["loads"] == obs["loads"]
                agree += same
                total += 1
                drv = pkg["predicted_with_driver"].get(lib["path"])
                stub = pkg.get("observed_stub_driver", {}).get(lib["path"])
                if stub is not None:
                    stub_rows.append((r["torch"], lib["path"], drv, stub))
                why = _summ(lib) or "-"
                if not same or not obs["loads"]:
                    why += f" / `{obs['error'][:120]}`" if obs["error"] else f" / rc {obs['rc']}"
                rows.append(
                    f"| {r['torch']} | {lib['path']} | {'loads' if lib['loads'] else 'does not load'} | "
                    f"{'loads' if drv else 'does not load'} | {'loads' if obs['loads'] else 'does not load'} | "
                    f"{'yes' if same else '**no**'} | {why} |"
                )
    if stub_rows:
        rows += [
            "",
            "| torch | library | predicted, GPU host | loaded with a stub libcuda.so.1 | agree | loader error |",
        ]
        rows.append("|---|---|---|---|---|---|")
        for torch, path, drv, stub in stub_rows:
            same = drv == stub["loads"]
            agree += same
            total += 1
            rows.append(
                f"| {torch} | {path} | {'loads' if drv else 'does not load'} | "
                f"{'loads' if stub['loads'] else 'does not load'} | {'yes' if same else '**no**'} | "
                f"{('`' + stub['error'][:120] + '`') if stub['error'] else '-'} |"
            )
    rows.append("")
    rows.append(f"{agree} of {total} predictions agree with the loader.")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", type=Path, default=Path("/work/wt/torchwheels"))
    ap.add_argument("--keel", type=Path, help="keel's wheel (default: dist/keel-*.whl)")
    ap.add_argument("--work", type=Path, default=Path("/work/wt/pfwork"))
    ap.add_argument("--versions", nargs="+", default=["2.12.1", "2.13.0", "2.14.1", "2.15.0", "2.9.1"])
    ap.add_argument("--out", type=Path, help="results JSON (appended per version as they finish)")
    ap.add_argument("--table", type=Path, metavar="RESULTS", help="print the markdown table of a results file")
    ap.add_argument(
        "--stub-driver",
        action="store_true",
        help="also load every library with a stand-in libcuda.so.1 (checks the --assume libcuda.so.1 column)",
    )
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    keel = args.keel or next(iter(sorted((ROOT / "dist").glob("keel-*.whl"))), None)
    if keel is None:
        print("preflight_real: no dist/keel-*.whl; run scripts/test.sh first or pass --keel", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.out or args.work / "results.json"
    results = json.loads(out.read_text()) if out.exists() else []
    done = {r["torch"] for r in results}
    for v in args.versions:
        if v in done:
            continue
        results.append(one_version(v, args.wheels, keel, args.work, args.stub_driver))
        out.write_text(json.dumps(results, indent=1))
        print(f"== torch {v} done", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
