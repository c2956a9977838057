#!/usr/bin/env python
"""keel's main job: build one wheel against torch A, audit it, then run that same file on other torches.

  python scripts/release/pipeline.py [--torch-a 2.13.0] [--targets 2.14.1 2.15.0 2.10.0] [--pythons 3.11 3.12]
                             [--below-floor 2.9.1] [--reuse-envs] [--wheel WHEEL] [--json OUT.json]

1. build the wheel in the build environment (torch A; `.venv` for 2.13.0) and audit it: a finding
   stops the run (`scripts/release/build_wheel.sh` gates the build, `keel audit` gives verdict and floor);
   then build every library once more from a copy of the checkout at another path (check_reproducible): the
   bytes must be the wheel's, and no library may name a path of the build machine;
2. for torch A and each target torch B (and each Python): a fresh virtual environment with only
   torch B, keel's runtime requirements (read from the wheel), pytest and keel-audit; the SAME wheel file;
3. there: the op tests of the checkout against the installed wheel (keel's and both vendored libraries',
   counted per library), and one process (scripts/release/demo_generate.py) that checks every op against plain
   torch with a stated error bound (scripts/release/demo_ops.py), greedy-generates with keel's default model,
   computes its logits along torch A's tokens, and hashes every keel library in its own memory map;
   those hashes must equal the built libraries' hashes;
4. below the floor (torch older than the audited `torch>=`), keel must refuse to import with its
   own error, not crash;
   before each torch B is installed, `keel-audit preflight` reads B's .whl (downloaded once with
   `pip download --no-deps`, then installed from that file) and predicts which keel libraries load;
   the prediction must equal what the probe process mapped (the "preflight" column);
5. one table; exit 0 only when every row holds: same library bytes, op tests pass, every op within its
   bound, logits within scripts/release/pipeline_checks.py's LOGIT_ATOL of torch A's, and greedy tokens equal to
   A's up to A's first near-tie (the parity rule of dev/keel_dev/parity.py; the table says where).

Uses only the standard library (and the checkout's pure-Python scripts/release/pipeline_checks.py and
dev/keel_dev/parity.py): it drives the environments, it does not import keel or torch.
Logs of every step go to .cache/pipeline/.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

from pipeline_checks import (  # scripts/release/pipeline_checks.py (this script's folder is on sys.path)
    OP_TESTS,
    Row,
    check_preflight,
    check_probe_ops,
    compare_to_reference,
    count_tests,
    table,
)

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / ".cache" / "pipeline"
# what the op tests need besides torch and the wheel: pytest, the checkout's keel-audit (pure Python), which
# tests/test_wheel_libraries.py runs over the installed libraries, and keel-dev (dev/keel_dev: the
# helpers the tests and the probe share, e.g. the parity rule)
TEST_TOOLS = ["pytest", str(ROOT / "audit"), str(ROOT / "dev")]
# This machine's pip config caps torch (a constraints file); the pipeline's own installs lift it.
# An empty PIP_CONSTRAINT is ignored by some pip releases, /dev/null (no constraints) never is.
PIP_ENV = {"PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


class PipelineError(RuntimeError):
    """A step failed; the message says which, why, and where its log is."""


def log_path(name: str) -> Path:
    LOGS.mkdir(parents=True, exist_ok=True)
    return LOGS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log"


def run(
    cmd: list[str], log: str, *, cwd: Path = ROOT, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` with its output in the log `log`; on failure raise with the log's last lines."""
    full_env = {**os.environ, **PIP_ENV, **(env or {})}
    path = log_path(log)
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    path.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}")
    if check and proc.returncode != 0:
        tail = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("WARNING: Location"))[-2500:]
        raise PipelineError(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode} (log: {path})\n{tail}")
    return proc


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve_python(spec: str) -> str:
    """An interpreter path for `3.12` (PATH, then pyenv) or a path given as is."""
    if os.sep in spec:
        return spec
    found = shutil.which(f"python{spec}") if re.fullmatch(r"3\.\d+", spec) else shutil.which(spec)
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{spec}.*/bin/python"))
    for exe in [*candidates, found]:  # pyenv's real interpreter first: its shims depend on a .python-version
        if exe and subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0:
            return exe
    raise PipelineError(f"pipeline: no Python {spec} found (PATH, {pyenv_root}/versions); pass a path to --pythons")


def python_version(exe: str) -> str:
    return subprocess.run(
        [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True, capture_output=True, text=True
    ).stdout.strip()


def installed_torch(env: Path) -> str | None:
    proc = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return proc.stdout.strip().split("+")[0] if proc.returncode == 0 else None


def wheel_facts(wheel: Path) -> tuple[dict[str, str], list[str]]:
    """The sha256 of every native library under keel/ in the wheel, and its non-torch requirements."""
    libs, requires = {}, []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("keel/") and name.endswith(".abi3.so"):
                libs[name.removeprefix("keel/")] = sha256(zf.read(name))
            elif name.endswith(".dist-info/METADATA"):
                for line in zf.read(name).decode().splitlines():
                    if line.startswith("Requires-Dist:") and "extra ==" not in line:
                        req = line.split(":", 1)[1].strip()
                        if not re.match(r"torch\b", req):
                            requires.append(req)
    if not libs:
        raise PipelineError(f"pipeline: {wheel} holds no keel/**/*.abi3.so")
    return dict(sorted(libs.items())), requires


def build(torch_a: str, build_env: Path, build_python: str) -> Path:
    """scripts/release/build_wheel.sh in the build environment (its own audit gate stops on a finding)."""
    print(f"### build the wheel against torch {torch_a} in {build_env.name} (log: {log_path('build')})", flush=True)
    run(
        ["bash", str(ROOT / "scripts" / "release" / "build_wheel.sh"), str(build_env)],
        "build",
        env={"KEEL_BUILD_TORCH": torch_a, "PYTHON": build_python},
    )
    wheels = sorted((ROOT / "dist").glob("keel-*.whl"))
    if len(wheels) != 1:
        raise PipelineError(f"pipeline: expected one wheel in dist/, found {[w.name for w in wheels]}")
    return wheels[0]


def check_build_tree(libs: dict[str, str]) -> None:
    """The libraries in build/lib*/keel/ (what CMake produced) must be the wheel's bytes."""
    for tree in sorted((ROOT / "build").glob("lib*/keel")):
        built = {p.relative_to(tree).as_posix(): sha256(p.read_bytes()) for p in tree.rglob("*.abi3.so")}
        if built and built != libs:
            raise PipelineError(f"pipeline: the libraries in {tree} differ from the wheel's")


# what the second build's copy of the checkout leaves out: git metadata, environments, build outputs, caches
COPY_SKIP = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", ".cache", "__pycache__", "*.so", "*.whl", ".pytest_cache", ".ruff_cache",
    ".mypy_cache", "*.egg-info", "bench_out", ".devpkgs", "node_modules", "site",
)  # fmt: skip


def reproducibility_findings(first: dict[str, bytes], second: dict[str, str], paths: list[str]) -> list[str]:
    """What keeps two builds from being one: libraries only one build has, libraries whose bytes differ
    (`first`: the wheel's bytes, `second`: the other build's sha256), and build-machine paths a library names."""
    found = [
        f"{rel}: only in the {'wheel' if rel in first else 'second build'}" for rel in sorted(set(first) ^ set(second))
    ]
    found += [f"{rel}: bytes differ" for rel in sorted(set(first) & set(second)) if sha256(first[rel]) != second[rel]]
    for rel, data in sorted(first.items()):
        named = sorted(p for p in set(paths) if len(p) > 1 and p.encode() in data)
        found += [f"{rel}: names the build machine's path {p}" for p in named]
    return found


def check_reproducible(wheel: Path, build_env: Path) -> None:
    """Build every library once more, from a copy of the checkout at another path and depth, in the build
    environment with the same settings (the CUDA twins where the wheel has them): each must equal the wheel's
    byte for byte and name no path of this machine (the checkout, the copy, the environment, home)."""
    with zipfile.ZipFile(wheel) as zf:
        first = {n.removeprefix("keel/"): zf.read(n) for n in zf.namelist() if n.endswith(".abi3.so")}
    cuda = any(rel.endswith("_C_cuda.abi3.so") for rel in first)
    print(f"### reproducible: every library built again elsewhere (log: {log_path('reproducible')})", flush=True)
    with tempfile.TemporaryDirectory(prefix="keel-repro-") as tmp:
        dest = Path(tmp) / "elsewhere" / "much-deeper" / "checkout"
        shutil.copytree(ROOT, dest, ignore=COPY_SKIP)
        env = {"KEEL_CUDA": "on" if cuda else "off", "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))}
        run(
            [str(build_env / "bin" / "python"), "setup.py", "-q", "build_ext", "--inplace"],
            "reproducible",
            cwd=dest,
            env=env,
        )
        tree = dest / "src" / "keel"  # build_ext --inplace writes into the package folder
        second = {p.relative_to(tree).as_posix(): sha256(p.read_bytes()) for p in sorted(tree.rglob("*.abi3.so"))}
    found = reproducibility_findings(first, second, [tmp, str(ROOT), str(build_env), sys.prefix, str(Path.home())])
    if found:
        raise PipelineError("pipeline: the build is not reproducible:\n  " + "\n  ".join(found))
    print(f"  {len(second)} libraries, byte-identical, no build-machine path")


def audit(env: Path, wheel: Path, target: str) -> tuple[str, str]:
    """`keel audit --json` of the wheel (strict): (verdict, torch floor); a failing gate stops the run."""
    proc = run(
        [str(env / "bin" / "keel"), "audit", str(wheel), "--target-torch", target, "--strict", "--json"],
        "audit",
        check=False,
    )
    try:
        doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError as exc:
        raise PipelineError(f"pipeline: keel audit gave no JSON (log: {log_path('audit')})") from exc
    if proc.returncode != 0 or not doc.get("passed"):
        findings = "; ".join(str(f) for f in doc.get("findings", []))[:1500]
        raise PipelineError(f"pipeline: the audit of {wheel.name} failed ({doc.get('verdict')}): {findings}")
    return doc["verdict"], doc["torch_floor"]


def torch_install_error(torch: str, python: str, pip_output: str, log: Path) -> PipelineError:
    """What pip said when torch==`torch` would not install, and what to do about it."""
    said = [ln for ln in pip_output.splitlines() if ln.startswith("ERROR")] or pip_output.splitlines()[-3:]
    if "No space left on device" in pip_output:  # the release exists; the disk is full
        todo = (
            f"free disk space where {ROOT} lies (each environment takes 5.5-7 GB; remove unused "
            f".venv-pipe-* folders) and run again"
        )
    else:
        todo = (
            f"see what the indexes offer with `PIP_CONSTRAINT=/dev/null {python} -m pip index versions torch`, "
            f"then choose another --targets entry (or --pythons)"
        )
    return PipelineError(
        f"torch=={torch} cannot be installed for Python {python_version(python)}: {' | '.join(said)[:600]}. "
        f"{todo[0].upper()}{todo[1:]}. Log: {log}"
    )


def fetch_torch(python: str, torch: str, tag: str) -> Path:
    """torch==`torch`'s wheel for `python` (`pip download --no-deps`, kept under .cache/pipeline/torch-wheels):
    the file the preflight reads and the environment then installs (downloaded once)."""
    dest = LOGS / "torch-wheels" / f"py{python_version(python)}"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary",
        ":all:",
        f"torch=={torch}",
        "-d",
        str(dest),
    ]
    proc = run(cmd, f"{tag}-torch-download", check=False)
    found = sorted(dest.glob(f"torch-{torch}-*.whl")) + sorted(dest.glob(f"torch-{torch}+*.whl"))
    if proc.returncode != 0 or not found:
        raise torch_install_error(torch, python, proc.stdout, log_path(f"{tag}-torch-download"))
    return found[0]


def preflight(tool_env: Path, wheel: Path, candidate: str, tag: str) -> tuple[dict[str, bool], str]:
    """`keel-audit preflight WHEEL --torch CANDIDATE --json` (a torch .whl, nothing installed, or `installed`):
    (library under keel/ -> predicted to load, '' or why it could not run)."""
    cmd = [str(tool_env / "bin" / "keel-audit"), "preflight", str(wheel), "--torch", candidate, "--json"]
    proc = run(cmd, f"{tag}-preflight", check=False)
    try:
        doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        last = (proc.stdout.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {}, f"could not run: {last[:200]} (log: {log_path(tag + '-preflight')})"
    predicted = {lib["path"].removeprefix("keel/"): bool(lib["loads"]) for lib in doc["libraries"]}
    print(
        f"  preflight ({doc['seconds']:.1f} s): {sum(predicted.values())}/{len(predicted)} predicted to load",
        flush=True,
    )
    return predicted, ""


def make_env(
    env: Path, python: str, torch: str, requires: list[str], *, fresh: bool, tag: str, torch_file: Path | None = None
) -> None:
    """A virtual environment with exactly torch==`torch` (from `torch_file` when given: the wheel the
    preflight read), keel's runtime requirements and TEST_TOOLS."""
    if fresh and env.exists():
        shutil.rmtree(env)
    if not (env / "bin" / "python").exists():
        run([python, "-m", "venv", str(env)], f"{tag}-venv")
    if installed_torch(env) != torch:
        print(f"  installing torch=={torch} into {env.name} (PyPI builds of some releases are several GB)", flush=True)
        proc = run(
            [
                str(env / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                str(torch_file or f"torch=={torch}"),
            ],
            f"{tag}-torch",
            check=False,
        )
        if proc.returncode != 0:
            raise torch_install_error(torch, python, proc.stdout, log_path(f"{tag}-torch"))
    install_requirements(env, requires, tag)


def install_requirements(env: Path, requires: list[str], tag: str) -> None:
    """keel's runtime requirements (read from the wheel) and TEST_TOOLS; torch is already there."""
    run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", *requires, *TEST_TOOLS], f"{tag}-deps")


def install_wheel(env: Path, wheel: Path, torch: str, tag: str) -> None:
    """The one wheel file, without touching the environment's torch (checked afterwards)."""
    run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)],
        f"{tag}-wheel",
    )
    if installed_torch(env) != torch:
        raise PipelineError(
            f"pipeline: {env.name} has torch {installed_torch(env)} after installing the wheel, not {torch}"
        )


def op_tests(env: Path, tag: str) -> tuple[bool, str, dict[str, list[int]]]:
    """The checkout's op tests against the installed wheel: (all passed, 'N passed, M skipped', per library
    [passed, failed, skipped])."""
    junit = LOGS / f"{tag}-junit.xml"
    junit.unlink(missing_ok=True)
    proc = run(
        [str(env / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *OP_TESTS],
        f"{tag}-optests",
        check=False,
    )
    if not junit.exists():
        return False, f"pytest exited {proc.returncode} (log: {log_path(tag + '-optests')})", {}
    counts = count_tests(junit)
    passed, failed, skipped = (sum(c[i] for c in counts.values()) for i in range(3))
    text = f"{passed} passed, {skipped} skipped" + (f", {failed} FAILED" if failed else "")
    return proc.returncode == 0 and failed == 0 and passed > 0, text, counts


def probe(env: Path, tag: str, max_tokens: int, reference: Path | None) -> dict:
    """scripts/release/demo_generate.py in `env`, run from an empty folder so the checkout is not on sys.path;
    with `reference` (torch A's probe.json) it also computes its logits on A's tokens and compares."""
    work = LOGS / f"{tag}-run"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "probe.json"
    out.unlink(missing_ok=True)
    cmd = [str(env / "bin" / "python"), str(ROOT / "scripts" / "release" / "demo_generate.py"), str(out)]
    cmd += ["--max-tokens", str(max_tokens)] + (["--reference", str(reference)] if reference else [])
    proc = run(cmd, f"{tag}-probe", cwd=work, env={"HF_HUB_OFFLINE": "1"}, check=False)
    if not out.exists():  # exit 1 with OUT.json written: an op beyond its bound, which the row shows
        tail = proc.stdout[-2000:]
        raise PipelineError(
            f"the probe exited {proc.returncode} without results (log: {log_path(tag + '-probe')})\n{tail}"
        )
    return json.loads(out.read_text())


def compare_libraries(built: dict[str, str], mapped: dict[str, str], keel_dir: str, env: Path) -> tuple[bool, str]:
    """Mapped keel libraries must be the built bytes, from the environment's keel, and include _C."""
    if not keel_dir.startswith(str(env.resolve())):
        return False, f"no: keel ran from {keel_dir}"
    same = [rel for rel, digest in mapped.items() if built.get(rel) == digest]
    ok = bool(mapped) and len(same) == len(mapped) and "_C.abi3.so" in mapped
    text = f"{'yes' if ok else 'no'} ({len(same)}/{len(mapped)} mapped"
    unmapped = sorted(set(built) - set(mapped))
    return ok, text + (f"; not loaded: {', '.join(unmapped)})" if unmapped else ")")


def run_row(
    row: Row,
    env: Path,
    python: str,
    wheel: Path,
    built: dict[str, str],
    requires: list[str],
    args: argparse.Namespace,
    reference: dict | None,
    *,
    build_env: bool,
) -> tuple[Row, dict | None]:
    """One environment's row, and its probe's result (None when it failed before the probe)."""
    tag = f"py{row.python}-torch{row.torch_b}"
    print(f"### torch {row.torch_b}, Python {row.python}: {env.name}", flush=True)
    try:
        if not build_env:  # the build's own environment got its requirements before fetch-demo
            # the preflight reads torch B's wheel before anything is installed; the env then installs that file
            torch_file = fetch_torch(python, row.torch_b, tag)
            row.predicted, why = preflight(args.tool_env, wheel, str(torch_file), tag)
            make_env(env, python, row.torch_b, requires, fresh=not args.reuse_envs, tag=tag, torch_file=torch_file)
        else:  # torch A is installed already: the preflight reads the installed torch
            row.predicted, why = preflight(env, wheel, "installed", tag)
        row.preflight = why or row.preflight
        install_wheel(env, wheel, row.torch_b, tag)
        row.op_tests_ok, row.op_tests, row.test_counts = op_tests(env, tag)
        print(f"  op tests: {row.op_tests} ({row.test_counts})", flush=True)
        result = probe(env, tag, args.max_tokens, reference["probe_json"] if reference else None)
    except PipelineError as exc:
        row.status = "not installable" if "cannot be installed" in str(exc) else "failed"
        row.detail = str(exc)
        print(f"  {row.status}: {exc}", file=sys.stderr, flush=True)
        return row, None
    row.libraries_same, row.libraries = compare_libraries(built, result["mapped_libraries"], result["keel_dir"], env)
    check_preflight(row, sorted(built), sorted(result["mapped_libraries"]))
    row.tok_s, row.ttft_ms = result["decode_tok_s"], result["ttft_s"] * 1e3
    row.token_ids = result["token_ids"]
    check_probe_ops(row, result.get("op_checks", []))
    compare_to_reference(row, result, reference)
    print(
        f"  libraries same: {row.libraries}; probe ops: {row.probe_ops}; logits vs A: {row.logits}; "
        f"tokens vs A: {row.tokens}; {len(row.token_ids)} tokens, {row.tok_s:.1f} tok/s; "
        f"answer: {result['text'][:80]!r}",
        flush=True,
    )
    return row, result


def below_floor(
    env: Path, python: str, torch: str, wheel: Path, requires: list[str], floor: str, args: argparse.Namespace
) -> Row:
    """Torch older than the audited floor: `import keel` must fail with keel's error naming the floor."""
    row = Row(args.torch_a, torch, python_version(python), env.name)
    tag = f"py{row.python}-torch{torch}"
    print(f"### below the floor: torch {torch} (the wheel says torch>={floor}), {env.name}", flush=True)
    try:
        torch_file = fetch_torch(python, torch, tag)
        row.predicted, why = preflight(args.tool_env, wheel, str(torch_file), tag)
        n = sum(row.predicted.values())
        row.preflight = why or f"{n}/{len(row.predicted)} predicted to load"
        make_env(env, python, torch, requires, fresh=not args.reuse_envs, tag=tag, torch_file=torch_file)
        # --no-deps: pip would otherwise replace torch to satisfy the wheel's torch>= requirement.
        install_wheel(env, wheel, torch, tag)
    except PipelineError as exc:
        row.status, row.detail = ("not installable" if "cannot be installed" in str(exc) else "failed"), str(exc)
        return row
    work = LOGS / f"{tag}-run"
    work.mkdir(parents=True, exist_ok=True)
    proc = run([str(env / "bin" / "python"), "-c", "import keel"], f"{tag}-import", cwd=work, check=False)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    clear = proc.returncode == 1 and "NativeLibraryError" in last and f"torch>={floor}" in last
    row.status = "refused import" if clear else "failed"
    row.detail = f"exit {proc.returncode}: {last}; preflight: {row.preflight}"
    if row.predicted and any(row.predicted.values()):  # below the floor nothing of keel can load
        row.status, row.preflight_ok = "failed", False
    print(f"  {'ok, keel refuses' if clear else 'NOT a clean refusal'}: {row.detail}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-a", default="2.13.0", help="the torch the wheel is built against")
    ap.add_argument("--targets", nargs="+", default=["2.14.1", "2.15.0", "2.10.0"], help="torch releases to swap in")
    ap.add_argument(
        "--pythons", nargs="+", default=[], help="Pythons for the targets (3.12 or a path); default: the build's"
    )
    ap.add_argument("--build-python", default=os.environ.get("PYTHON", "python3.11"))
    ap.add_argument("--below-floor", default="2.9.1", help="a torch under the floor that must be refused ('' skips)")
    ap.add_argument("--reuse-envs", action="store_true", help="keep existing .venv-pipe-* environments")
    ap.add_argument("--build-env", type=Path, help="torch A's environment (default .venv for 2.13.0)")
    ap.add_argument("--wheel", type=Path, help="use this wheel instead of building one (still audited)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    args.tool_env = None  # the environment whose keel-audit runs the preflights (the build environment)

    build_python = resolve_python(args.build_python)
    build_py = python_version(build_python)
    build_env = (
        args.build_env.resolve()
        if args.build_env
        else (ROOT / (".venv" if args.torch_a == "2.13.0" else f".venv-pipe-py{build_py}-torch{args.torch_a}"))
    )
    args.tool_env = build_env
    try:
        built_wheel = args.wheel.resolve() if args.wheel else build(args.torch_a, build_env, build_python)
        # every environment gets this copy: a rebuild into dist/ meanwhile cannot change what is tested
        wheel = LOGS / "wheel" / built_wheel.name
        wheel.parent.mkdir(parents=True, exist_ok=True)
        for old in wheel.parent.glob("*.whl"):
            old.unlink()
        shutil.copy2(built_wheel, wheel)
        built, requires = wheel_facts(wheel)
        if not args.wheel:
            check_build_tree(built)
            check_reproducible(wheel, build_env)
        wheel_sha = sha256(wheel.read_bytes())
        print(f"### the one wheel: {wheel.name}  sha256 {wheel_sha}")
        for rel, digest in built.items():
            print(f"  built keel/{rel}  sha256 {digest}")
        if args.wheel:  # a wheel built elsewhere (CI): torch A's environment is made here
            make_env(build_env, build_python, args.torch_a, requires, fresh=False, tag=f"py{build_py}-build")
        install_wheel(build_env, wheel, args.torch_a, f"py{build_py}-torch{args.torch_a}")
        # the wheel went in without dependencies: `keel models fetch-demo` below already needs them
        install_requirements(build_env, requires, f"py{build_py}-torch{args.torch_a}")
        verdict, floor = audit(build_env, wheel, os.environ.get("KEEL_TORCH_TARGET", "2.10"))
        print(f"### audit: {verdict}, torch>={floor}")
        run([str(build_env / "bin" / "keel"), "models", "fetch-demo"], "fetch-demo")
    except PipelineError as exc:
        print(f"pipeline: STOPPED: {exc}", file=sys.stderr)
        return 1

    row_a, result_a = run_row(
        Row(args.torch_a, args.torch_a, build_py, build_env.name),
        build_env,
        build_python,
        wheel,
        built,
        requires,
        args,
        None,
        build_env=True,
    )
    rows = [row_a]
    reference = None
    if result_a and result_a["token_ids"]:  # what every torch B is compared with
        reference = {**result_a, "probe_json": LOGS / f"py{build_py}-torch{args.torch_a}-run" / "probe.json"}
    pythons = [resolve_python(p) for p in args.pythons] or [build_python]
    for python in pythons:
        py = python_version(python)
        for torch in args.targets:
            env = ROOT / f".venv-pipe-py{py}-torch{torch}"
            row, _ = run_row(
                Row(args.torch_a, torch, py, env.name),
                env,
                python,
                wheel,
                built,
                requires,
                args,
                reference,
                build_env=False,
            )
            rows.append(row)
    floor_row = None
    if args.below_floor:
        env = ROOT / f".venv-pipe-py{build_py}-torch{args.below_floor}"
        floor_row = below_floor(env, build_python, args.below_floor, wheel, requires, floor, args)

    print(f"\nwheel {wheel.name} sha256 {wheel_sha[:16]}, built once against torch {args.torch_a}\n")
    print(table(rows, verdict, floor))
    if floor_row:
        print(
            f"\nbelow the floor: torch {floor_row.torch_b} (Python {floor_row.python}): {floor_row.status}: "
            f"{floor_row.detail}"
        )
    refused = floor_row is None or floor_row.status == "refused import"
    ok = all(r.ok for r in rows) and reference is not None and refused
    print("\nPIPELINE PASSED" if ok else "\nPIPELINE FAILED")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "wheel": wheel.name,
                    "wheel_sha256": wheel_sha,
                    "built_libraries": built,
                    "audit_verdict": verdict,
                    "torch_floor": floor,
                    "rows": [asdict(r) for r in rows],
                    "below_floor": asdict(floor_row) if floor_row else None,
                    "passed": ok,
                },
                indent=1,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
