"""The Python half of scripts/device/check.sh: install carried wheels, check the import, run one test area,
write the summary.

    python scripts/device/check.py env OUT_JSON                      what this machine has (GPU, torch, tools)
    python scripts/device/check.py install PREFIX WHEEL... [--only-missing]
                                                                     unpack wheels into PREFIX (no pip needed)
    python scripts/device/check.py import PREFIX OUT_JSON [--need-cuda]
                                                                     keel from PREFIX, not the checkout
    python scripts/device/check.py area NAME WORK LIMIT_S TEST_TIMEOUT_S -- PYTEST_ARGS...
                                                                     one pytest process per area (restarted
                                                                     after a sticky fault), results in WORK
    python scripts/device/check.py summary WORK OUT_DIR --mode gpu|dry
                                                                     summary.md + summary.json + junit.xml,
                                                                     exit 1 on a failure

Standard library only (the device machine has no network): a wheel is a zip, and unpacking one into a
folder on PYTHONPATH installs it (console scripts aside). With --only-missing a carried wheel is unpacked
only when this interpreter lacks that distribution entirely and none of its top-level modules is importable:
the machine's own packages (its torch stack, pytest, numpy) are never shadowed, by an older or a newer copy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from types import ModuleType


def _sibling(name: str) -> ModuleType:
    """scripts/device/<name>.py by file path (scripts/ is no package and is never put on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"keel_device_{name}", Path(__file__).resolve().parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


classify = _sibling("paths").classify

NEVER_SHADOW = {"torch", "triton", "pip"}  # the machine's own; never replaced by a carried wheel


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
    for dist in ("pytest", "numpy"):  # the image's own: carried wheels never shadow them
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    for tool in ("nvcc", "cmake", "ninja", "nvidia-smi", "compute-sanitizer"):
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


def _top_level(z: zipfile.ZipFile) -> set[str]:
    """The importable top-level names a wheel installs (its folders and modules, not its .dist-info/.data)."""
    names = set()
    for n in z.namelist():
        top = n.split("/")[0]
        if top.endswith((".dist-info", ".data")) or not top:
            continue
        names.add(top[:-3] if top.endswith(".py") else top.split(".")[0])
    return names


def cmd_install(prefix: str, wheels: list[str], only_missing: bool) -> int:
    target = Path(prefix)
    target.mkdir(parents=True, exist_ok=True)
    for w in map(Path, wheels):
        name, version = _wheel_dist(w)
        if name in NEVER_SHADOW:
            print(f"skip {w.name}: the machine's own {name} is never shadowed")
            continue
        with zipfile.ZipFile(w) as z:
            if only_missing:
                try:
                    have = metadata.version(name)
                except metadata.PackageNotFoundError:
                    have = None
                if have is not None:  # older or newer: the machine's own copy stays the one imported
                    print(f"skip {w.name}: {name} {have} is installed")
                    continue
                present = sorted(m for m in _top_level(z) if importlib.util.find_spec(m) is not None)
                if present:
                    print(f"skip {w.name}: would shadow the installed module(s) {', '.join(present)}")
                    continue
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


def cmd_area(name: str, work: str, limit_s: float, test_timeout: float, pytest_args: list[str]) -> int:
    """One area's pytest process (area_plugin.py loaded), restarted for the remaining tests after a sticky CUDA
    fault or a test stuck in native code, until every test has a verdict, the area's limit is spent or three
    restarts are used. Results: WORK/results/NAME.jsonl (per test, as they finish), junit WORK/junit/NAME-<n>.xml.
    Exit 0 when every test that ran passed and the area finished."""
    wd = Path(work)
    (wd / "results").mkdir(parents=True, exist_ok=True)
    (wd / "junit").mkdir(parents=True, exist_ok=True)
    results = wd / "results" / f"{name}.jsonl"
    results.write_text("")
    env = {**os.environ, "KEEL_AREA_RESULTS": str(results), "KEEL_TEST_TIMEOUT": str(test_timeout)}
    t0, rc, attempt, sticky_before = time.monotonic(), 1, 0, 0
    for attempt in range(4):
        left = limit_s - (time.monotonic() - t0)
        if left < 5:
            print(f"area {name}: the {limit_s:.0f} s limit is spent")
            rc = 124
            break
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "area_plugin", "-rfE",
               f"--junitxml={wd / 'junit' / f'{name}-{attempt}.xml'}", *pytest_args]  # fmt: skip
        print(f"area {name}, run {attempt + 1}: {' '.join(cmd[1:])}", flush=True)
        try:
            rc = subprocess.run(cmd, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            print(f"area {name}: killed at its {limit_s:.0f} s limit")
            rc = 124
            break
        _mark_died(results, rc)
        sticky = sum(bool(r.get("sticky")) for r in _results(results).values())
        if sticky == sticky_before:
            break  # the session ran to its end (or failed for a reason a restart does not mend)
        sticky_before = sticky
        print(f"area {name}: exit {rc} after a sticky fault or a stuck test; restarting for the remaining tests")
    _mark_died(results, rc)
    rows = _results(results)
    failed = [i for i, r in rows.items() if r["outcome"] == "failed"]
    print(f"area {name}: {len(rows)} tests with a verdict, {len(failed)} failed, exit {rc}, runs {attempt + 1}")
    return 0 if rc in (0, 5) and not failed else (rc if rc == 124 else 1)


def _mark_died(results: Path, rc: int) -> None:
    """A test whose last row is "started": the process died (or was killed) inside it; its verdict is failed."""
    for nodeid, r in _results(results).items():
        if r["outcome"] == "started":
            row = {"nodeid": nodeid, "outcome": "failed", "sticky": True, "message": f"the process died in it ({rc})"}
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")


def _results(path: Path) -> dict[str, dict]:
    """nodeid -> its last row (a "started" row is the last when the process died inside the test)."""
    rows: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            rows[row["nodeid"]] = row
    return rows


def junit_id(nodeid: str) -> str:
    """tests/ops/test_cuda.py::test_x[a] -> tests.ops.test_cuda::test_x[a] (junit's classname::name)."""
    path, _, name = nodeid.partition("::")
    return path.removesuffix(".py").replace("/", ".") + "::" + name


def _cases(work: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Every test of every area (junit ids) with its outcome; a test a process died in counts as failed."""
    cases, areas = [], {}
    for f in sorted((work / "results").glob("*.jsonl")):
        for nodeid, r in _results(f).items():
            outcome = "failed" if r["outcome"] == "started" else r["outcome"]
            message = r.get("message", "the process died inside this test" if r["outcome"] == "started" else "")
            cases.append({"id": junit_id(nodeid), "outcome": outcome, "message": message, "area": f.stem})
            areas[f.stem] = areas.get(f.stem, "")
    return cases, areas


def merge_junit(work: Path, out: Path) -> None:
    """WORK/junit/*.xml (one per area process) -> OUT/junit.xml, one <testsuites>."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites")
    for f in sorted((work / "junit").glob("*.xml")):
        try:
            tree = ET.parse(f).getroot()
        except ET.ParseError:
            continue
        for suite in tree.iter("testsuite"):
            suite.set("name", f.stem)
            root.append(suite)
    ET.ElementTree(root).write(out / "junit.xml", encoding="unicode", xml_declaration=True)


def cmd_summary(work_dir: str, out_dir: str, mode: str) -> int:
    work, out = Path(work_dir), Path(out_dir)
    steps = []
    if (work / "steps.tsv").is_file():
        for line in (work / "steps.tsv").read_text().splitlines():
            name, rc, secs, note = (line.split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "rc": int(rc), "seconds": float(secs or 0), "note": note})
    benches = {}
    for f in sorted(out.glob("bench_*.json")):
        try:
            benches[f.stem] = json.loads(f.read_text())
        except ValueError as e:
            benches[f.stem] = {"error": f"unreadable: {e}"}
    merge_junit(work, out)
    cases, _ = _cases(work)
    rows = classify(cases, benches, gpu=mode == "gpu")
    optional = {"memcheck", "racecheck"}  # time-boxed: a timeout is a note, an error report a failure
    failures = [
        f"step {s['step']} exited {s['rc']}"
        for s in steps
        if s["rc"] != 0 and not (s["step"] in optional and s["rc"] == 124)
    ]
    failures += [f"{r['path']}: {r['status']}" for r in rows if r["status"] in ("failed", "not run")]
    failed_tests = [
        {"id": c["id"], "area": c["area"], "message": c["message"]} for c in cases if c["outcome"] == "failed"
    ]
    unmatched = [c["id"] for c in cases if c["outcome"] != "skipped" and not any(c["id"] in r["ids"] for r in rows)]
    by_area: dict[str, dict[str, int]] = {}
    for c in cases:
        by_area.setdefault(c["area"], {"passed": 0, "failed": 0, "skipped": 0})[c["outcome"]] += 1
    summary = {
        "mode": mode,
        "env": json.loads((work / "env.json").read_text()) if (work / "env.json").is_file() else {},
        "steps": steps,
        "areas": by_area,
        "paths": [{k: v for k, v in r.items() if k != "ids"} for r in rows],
        "tests": {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")},
        "failed_tests": failed_tests,
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
        f"tests: {s['tests']}; by area: {s.get('areas', {})}",
    ]
    if s.get("failed_tests"):
        lines += [
            "",
            "Failed tests:",
            *[f"- `{t['id']}` ({t['area']}): {t['message']}" for t in s["failed_tests"][:60]],
        ]
        if len(s["failed_tests"]) > 60:
            lines.append(f"- ... and {len(s['failed_tests']) - 60} more (summary.json)")
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
    if cmd == "area":
        i = rest.index("--")
        name, work, limit, timeout = rest[:4]
        return cmd_area(name, work, float(limit), float(timeout), rest[i + 1 :])
    if cmd == "summary":
        return cmd_summary(rest[0], rest[1], rest[rest.index("--mode") + 1] if "--mode" in rest else "gpu")
    print(f"check.py: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
