"""The Python half of scripts/device_check.sh: install carried wheels, check the import, write the summary.

    python scripts/device_check.py env OUT_JSON                      what this machine has (GPU, torch, tools)
    python scripts/device_check.py install PREFIX WHEEL... [--only-missing]
                                                                     unpack wheels into PREFIX (no pip needed)
    python scripts/device_check.py import PREFIX OUT_JSON [--need-cuda]
                                                                     keel from PREFIX, not the checkout
    python scripts/device_check.py summary OUT_DIR --mode gpu|dry    summary.md + summary.json, exit 1 on a failure

Standard library only (the device machine has no network): a wheel is a zip, and unpacking one into a
folder on PYTHONPATH installs it (console scripts aside). With --only-missing a carried wheel is unpacked
only when this interpreter lacks that distribution or has an older version, so the machine's own torch
stack is never shadowed by an older copy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_paths import classify  # noqa: E402

NEVER_SHADOW = {"torch", "triton", "pip"}  # the machine's own; never replaced by a carried wheel


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_key(v: str) -> tuple:
    """A comparable key of a release version (enough for carried wheels: digits, then the rest)."""
    parts = re.findall(r"\d+|[a-z]+", v.lower())
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def cmd_env(out_json: str) -> int:
    info: dict[str, object] = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except Exception as e:  # noqa: BLE001 - reported, the caller decides
        info["torch_error"] = f"{type(e).__name__}: {e}"
    for tool in ("nvcc", "cmake", "ninja", "nvidia-smi"):
        path = shutil.which(tool)
        info[tool] = path
        if path and tool == "nvcc":
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
            info["nvcc_version"] = out[-1] if out else ""
    Path(out_json).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0


def _wheel_dist(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return _norm(name), version


def cmd_install(prefix: str, wheels: list[str], only_missing: bool) -> int:
    target = Path(prefix)
    target.mkdir(parents=True, exist_ok=True)
    for w in map(Path, wheels):
        name, version = _wheel_dist(w)
        if name in NEVER_SHADOW:
            print(f"skip {w.name}: the machine's own {name} is never shadowed")
            continue
        if only_missing:
            try:
                have = metadata.version(name)
            except metadata.PackageNotFoundError:
                have = None
            if have is not None and _version_key(have) >= _version_key(version):
                print(f"skip {w.name}: {name} {have} is installed")
                continue
        with zipfile.ZipFile(w) as z:
            z.extractall(target)
        print(f"unpacked {w.name} into {target}")
    return 0


def cmd_import(prefix: str, out_json: str, need_cuda: bool) -> int:
    """Imports keel and both vendored libraries; keel must come from `prefix`, never from the checkout."""
    root = Path(__file__).resolve().parents[1]
    info: dict[str, object] = {"sys_path_has_checkout": any(Path(p or ".").resolve() == root for p in sys.path)}
    import keel
    import keel.vendored.deep_gemm
    import keel.vendored.flash_attn  # noqa: F401 - loads its library
    from keel.vendored._loader import loaded_vendored

    info["keel_file"] = keel.__file__
    info["from_prefix"] = Path(keel.__file__).resolve().is_relative_to(Path(prefix).resolve())
    info["loaded"] = sorted(keel._native.loaded_libraries())
    info["vendored_cuda"] = {
        name: (str(lib.cuda) if lib.cuda else f"not loaded: {lib.cuda_error}")
        for name, lib in loaded_vendored().items()
    }
    problems = []
    if info["sys_path_has_checkout"]:
        problems.append("the checkout is on sys.path")
    if not info["from_prefix"]:
        problems.append(f"keel was imported from {keel.__file__}, not from {prefix}")
    if need_cuda:
        if "_C_cuda" not in info["loaded"]:
            problems.append("keel/_C_cuda.abi3.so is not loaded")
        problems += [f"{n}: {s}" for n, s in info["vendored_cuda"].items() if s.startswith("not loaded")]
    info["problems"] = problems
    Path(out_json).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 1 if problems else 0


def _junit_cases(path: Path) -> list[dict[str, str]]:
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        cases.append({"id": f"{tc.get('classname', '')}::{tc.get('name', '')}", "outcome": outcome})
    return cases


def cmd_summary(out_dir: str, mode: str) -> int:
    out = Path(out_dir)
    steps = []
    if (out / "steps.tsv").is_file():
        for line in (out / "steps.tsv").read_text().splitlines():
            name, rc, secs, note = (line.split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "rc": int(rc), "seconds": float(secs or 0), "note": note})
    benches = {}
    for f in sorted(out.glob("bench_*.json")):
        try:
            benches[f.stem] = json.loads(f.read_text())
        except ValueError as e:
            benches[f.stem] = {"error": f"unreadable: {e}"}
    cases = _junit_cases(out / "junit.xml")
    rows = classify(cases, benches, gpu=mode == "gpu")
    failures = [f"step {s['step']} exited {s['rc']}" for s in steps if s["rc"] != 0]
    failures += [f"{r['path']}: {r['status']}" for r in rows if r["status"] in ("failed", "not run")]
    unmatched = [c["id"] for c in cases if c["outcome"] != "skipped" and not any(c["id"] in r["ids"] for r in rows)]
    summary = {
        "mode": mode,
        "env": json.loads((out / "env.json").read_text()) if (out / "env.json").is_file() else {},
        "steps": steps,
        "paths": [{k: v for k, v in r.items() if k != "ids"} for r in rows],
        "tests": {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")},
        "tests_outside_the_paths": unmatched,
        "failures": failures,
        "result": "FAILED" if failures else "PASSED",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render_md(summary))
    print(render_md(summary))
    return 1 if failures else 0


def render_md(s: dict) -> str:
    env = s["env"]
    lines = [
        f"# keel device check ({'GPU run' if s['mode'] == 'gpu' else 'CPU dry run: no CUDA path ran'})",
        "",
        f"devices {env.get('devices', 'none')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
        f"Python {env.get('python')}, nvcc {env.get('nvcc_version', 'absent')}",
        "",
        "| step | exit | seconds | note |",
        "|---|---:|---:|---|",
        *[f"| {st['step']} | {st['rc']} | {st['seconds']:.0f} | {st['note']} |" for st in s["steps"]],
        "",
        "| CUDA path | status | tests ran | passed | failed | skipped | figure |",
        "|---|---|---:|---:|---:|---:|---|",
        *[
            "| "
            + " | ".join(str(r[k]) for k in ("path", "status", "ran", "passed", "failed", "skipped", "figure"))
            + " |"
            for r in s["paths"]
        ],
        "",
        f"tests: {s['tests']}",
    ]
    if s["tests_outside_the_paths"]:
        lines.append(f"tests that ran outside every path: {len(s['tests_outside_the_paths'])}")
    lines += ["", f"**{s['result']}**" + ("" if not s["failures"] else ": " + "; ".join(s["failures"])), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "env":
        return cmd_env(rest[0])
    if cmd == "install":
        only = "--only-missing" in rest
        return cmd_install(rest[0], [a for a in rest[1:] if a != "--only-missing"], only)
    if cmd == "import":
        return cmd_import(rest[0], rest[1], "--need-cuda" in rest)
    if cmd == "summary":
        return cmd_summary(rest[0], rest[rest.index("--mode") + 1] if "--mode" in rest else "gpu")
    print(f"device_check.py: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
