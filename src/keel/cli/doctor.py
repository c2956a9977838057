"""`keel doctor`: what keel will do with the torch of this environment, and the fix when it will not work.

Prints keel's version and native libraries, the installed torch (version, CUDA or CPU-only build),
the preflight of keel's libraries against that torch (`keel-audit preflight`, when the separate
keel-audit distribution is installed; keel does not depend on it at run time), the real load of
each library (`ctypes.CDLL(path, RTLD_NOW)` after `import torch`: what keel's import does), which
CUDA twins load and why not (CPU-only torch, no NVIDIA driver, a driver older than the CUDA
runtime the twins link statically), the CPU instruction set keel's kernels use, and where the model
caches are. Exit 0 when keel will work, 1 otherwise, with the fix.

This module imports nothing of keel at module level: when `import keel` itself fails (then `keel
doctor` cannot start, as the `keel` command imports the package), run it by path:

    python "$(python -c 'import importlib.util as u; print(u.find_spec("keel").origin)' \
        | xargs dirname)/cli/doctor.py"
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any


def _load_settings() -> ModuleType:
    """src/keel/_settings.py (the torch floor, the KEEL_CPU_ISA levels; it imports only the standard library):
    imported when this module runs as keel.cli.doctor, loaded by file path when it runs by path."""
    if __package__:  # keel.cli: `import keel` worked
        from keel import _settings

        return _settings
    path = Path(__file__).resolve().parents[1] / "_settings.py"
    spec = importlib.util.spec_from_file_location("_keel_settings", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"keel doctor: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_settings = _load_settings()
_NVCC_IDENT = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")


@dataclass
class Library:
    path: str  # relative to the keel package's parent (keel/_C.abi3.so)
    kind: str  # "CPU" or "CUDA twin"
    loads: bool | None = None  # None: not tried
    error: str = ""
    predicted: str | None = None  # the preflight's verdict
    note: str = ""


@dataclass
class Report:
    keel_version: str | None = None
    keel_dir: str | None = None
    libraries: list[Library] = field(default_factory=list)
    torch_version: str | None = None
    torch_cuda: str | None = None
    torch_error: str = ""
    torch_floor: tuple[int, int] = _settings.TORCH_FLOOR
    preflight: str = ""  # one line: what the preflight said, or why it did not run
    driver_cuda: tuple[int, int] | None = None  # the CUDA version the driver supports
    driver_note: str = ""
    twin_cuda: tuple[int, int] | None = None  # the CUDA toolkit keel's CUDA twins were built with
    cpu_isa: str = ""
    cpu_flags: list[str] = field(default_factory=list)
    huge_pages: str = ""  # where the engine puts CPU weights and K/V pools (src/keel/engine/host_memory.py)
    caches: dict[str, str] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (what is wrong, the fix)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _keel_dir() -> Path | None:
    spec = importlib.util.find_spec("keel")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _floor() -> tuple[int, int]:
    """The installed wheel's torch floor, else keel's (src/keel/_settings.py torch_floor)."""
    floor: tuple[int, int] = _settings.torch_floor()
    return floor


def _driver() -> tuple[tuple[int, int] | None, str]:
    """(CUDA version the NVIDIA driver supports, note) through the driver API (cuDriverGetVersion)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no NVIDIA driver (libcuda.so.1 not found)"
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None, "the NVIDIA driver did not report its version (cuDriverGetVersion failed)"
    v = version.value
    return (v // 1000, (v % 1000) // 10), ""


def _twin_cuda(paths: list[Path]) -> tuple[int, int] | None:
    """The CUDA toolkit release nvcc wrote into the CUDA twins (their static runtime is that release)."""
    for p in paths:
        m = _NVCC_IDENT.search(p.read_bytes())
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    have = set(m.group(1).split()) if m else set()
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16")
    return [f for f in wanted if f in have]


_LOAD_ALL = (
    "import sys, os, ctypes, json, torch\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        ctypes.CDLL(path, os.RTLD_NOW)\n"
    "        print(json.dumps([path, True, '']), flush=True)\n"
    "    except OSError as exc:\n"
    "        print(json.dumps([path, False, str(exc)]), flush=True)\n"
)


def _load_all(paths: list[Path]) -> dict[str, tuple[bool, str]]:
    """dlopen(RTLD_NOW) of each library after `import torch`, in a fresh interpreter (so a failure
    cannot touch this one) started outside any source tree; what a crash left unanswered is retried alone."""
    out: dict[str, tuple[bool, str]] = {}
    todo = [str(p) for p in paths]
    while todo:
        done = subprocess.run([sys.executable, "-c", _LOAD_ALL, *todo], capture_output=True, text=True, cwd="/")
        for line in done.stdout.splitlines():
            path, ok, err = json.loads(line)
            out[path] = (bool(ok), str(err)[-400:])
        left = [p for p in todo if p not in out]
        if left and done.returncode != 0:  # the first one left crashed the interpreter
            lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
            out[left[0]] = (False, (lines[-1] if lines else f"exit code {done.returncode}")[-400:])
            left = left[1:]
        todo = left
    return out


def _preflight(keel_dir: Path, report: Report) -> dict[str, str]:
    if importlib.util.find_spec("keel_audit") is None:
        report.preflight = (
            "not run: keel-audit is not installed (keel does not depend on it; `pip install keel-audit` or "
            "`pip install ./audit` from a keel checkout); the load check below is the real answer"
        )
        return {}
    from keel_audit.errors import AuditError
    from keel_audit.preflight import preflight

    try:
        result = preflight([str(keel_dir)], "installed")
    except AuditError as exc:
        report.preflight = f"could not run: {exc}"
        return {}
    verdicts = {f"keel/{lib.path}": lib.verdict for lib in result.libraries}
    good = sum(lib.ok for lib in result.libraries)
    report.preflight = (
        f"keel-audit preflight against torch {result.candidate['version']}: {good} of {len(result.libraries)} "
        f"libraries load ({result.seconds:.2f} s)"
    )
    for lib in result.libraries:
        if not lib.loads:
            why = [n for n, _w in lib.unprovided] + [m.symbol for m in lib.missing][:3]
            verdicts[f"keel/{lib.path}"] += f" ({', '.join(why)})"
    return verdicts


def gather(load: bool = True) -> Report:
    """Everything doctor prints; `problems` says what stops keel and how to fix it."""
    report = Report()
    keel_dir = _keel_dir()
    if keel_dir is None:
        report.problems.append(("keel is not installed in this environment", "pip install keel-*.whl"))
        return report
    report.keel_dir = str(keel_dir)
    try:
        report.keel_version = metadata.version("keel")
    except metadata.PackageNotFoundError:
        report.keel_version = None
    report.torch_floor = _floor()
    for p in sorted(keel_dir.rglob("_C*.abi3.so")):
        rel = str(p.relative_to(keel_dir.parent))
        report.libraries.append(Library(rel, "CUDA twin" if p.name.startswith("_C_cuda") else "CPU"))
    _check_torch(report)
    predicted = _preflight(keel_dir, report) if report.torch_version else {}
    report.driver_cuda, report.driver_note = _driver()
    twins = [keel_dir.parent / lib.path for lib in report.libraries if lib.kind == "CUDA twin"]
    report.twin_cuda = _twin_cuda(twins)
    _check_loads(report, keel_dir, predicted, load)
    if report.torch_cuda:
        _check_cuda(report)
    report.cpu_flags = _cpu_flags()
    try:
        level = _settings.cpu_isa_level()
    except _settings.CpuIsaError as exc:
        report.problems.append(
            (str(exc), f"unset KEEL_CPU_ISA or set it to one of {', '.join(_settings.CPU_ISA_LEVELS)}")
        )
        level = None
    isa = _cpu_isa(report) if load else "not asked (--no-load: keel's libraries were not loaded)"
    report.cpu_isa = isa + (f" (KEEL_CPU_ISA={level})" if level and level != "auto" else "")
    report.huge_pages = _huge_pages(report)
    report.caches = _caches()
    return report


def _check_torch(report: Report) -> None:
    """torch's version and CUDA build, or why it cannot be imported; a torch below keel's floor is a problem."""
    try:
        import torch

        report.torch_version = str(torch.__version__)
        report.torch_cuda = torch.version.cuda
    except Exception as exc:  # noqa: BLE001 - any failure to import torch is the finding
        report.torch_error = f"{type(exc).__name__}: {exc}"
        report.problems.append((f"torch cannot be imported ({report.torch_error})", "pip install 'torch>=2.10'"))
        return
    mm = tuple(int(x) for x in re.findall(r"\d+", report.torch_version.split("+")[0])[:2])
    fl = report.torch_floor
    if mm < fl:
        report.problems.append(
            (
                f"torch {report.torch_version} is older than keel's floor {fl[0]}.{fl[1]}",
                f"pip install 'torch>={fl[0]}.{fl[1]}'",
            )
        )


def _check_loads(report: Report, keel_dir: Path, predicted: dict[str, str], load: bool) -> None:
    """Each library's preflight verdict and, with `load`, whether it loads here; a CPU library that does not
    load is a problem (a CUDA twin on a CPU-only torch is not tried)."""
    tried = []
    for lib in report.libraries:
        lib.predicted = predicted.get(lib.path)
        if lib.kind == "CUDA twin" and report.torch_version and not report.torch_cuda:
            lib.note = "not used: this torch is a CPU-only build"
        elif load and report.torch_version:
            tried.append(lib)
    loaded = _load_all([keel_dir.parent / lib.path for lib in tried]) if tried else {}
    for lib in tried:
        lib.loads, lib.error = loaded[str(keel_dir.parent / lib.path)]
    for lib in report.libraries:
        if lib.loads is False and lib.kind == "CPU":
            report.problems.append(
                (
                    f"{lib.path} does not load with torch {report.torch_version}: {lib.error}",
                    f"install a keel wheel whose audited floor admits torch {report.torch_version} or a torch "
                    f"the preflight accepts (keel-audit preflight keel-*.whl --torch VERSION)",
                )
            )


def _check_cuda(report: Report) -> None:
    """On a CUDA torch: the driver against the CUDA runtime the twins link, and whether the twins load."""
    cuda_twins_ok = [lib.loads for lib in report.libraries if lib.kind == "CUDA twin" and lib.loads is not None]
    if report.driver_cuda is None:
        report.warnings.append(f"CUDA kernels cannot run: {report.driver_note}; keel runs on the CPU")
    elif report.twin_cuda and report.driver_cuda < (report.twin_cuda[0], 0):
        d, t = report.driver_cuda, report.twin_cuda
        report.problems.append(
            (
                f"the NVIDIA driver supports CUDA {d[0]}.{d[1]}, older than the CUDA {t[0]}.{t[1]} runtime keel's "
                "CUDA twins link statically",
                f"upgrade the NVIDIA driver to one for CUDA {t[0]}.x, or use keel on the CPU",
            )
        )
    if cuda_twins_ok and not all(cuda_twins_ok) and report.driver_cuda is not None:
        report.problems.append(
            (
                "a CUDA twin does not load on this CUDA torch (see the load check)",
                "reinstall keel built with CUDA for this torch's CUDA major",
            )
        )


def _huge_pages(report: Report) -> str:
    """One line: whether the engine will put CPU weights and K/V pools on transparent huge pages here; an unknown
    KEEL_HUGE_PAGES is a problem (the engine refuses to start)."""
    try:
        wanted = _settings.huge_pages_wanted()
    except _settings.HugePagesSettingError as exc:
        report.problems.append((str(exc), f"unset KEEL_HUGE_PAGES or set it to {_settings.HUGE_PAGES_CHOICES}"))
        return "KEEL_HUGE_PAGES not understood (see the problem below)"
    mode = _settings.thp_mode()
    if not wanted:
        return f"base pages (KEEL_HUGE_PAGES turns huge pages off; kernel THP mode {mode})"
    if _settings.huge_pages_available():
        return f"CPU weights and K/V pools on transparent huge pages (kernel THP mode {mode})"
    return f"base pages (no transparent huge pages to ask for here: kernel THP mode {mode})"


# keel's library answers in a fresh process (keel._native.cpu_isa_status: codes and the library's reason
# text, read with ctypes), and the vendored flash_attn's build (its cpu_isa op)
_ISA_PROBE = (
    "import json, keel\n"
    "from keel._native import cpu_isa_status\n"
    "from keel.vendored.flash_attn import cpu_isa\n"
    "s = cpu_isa_status()\n"
    "print(json.dumps({'build': s.build, 'amx': s.amx, 'amx_reason': s.amx_reason, 'flash_attn': cpu_isa()}))\n"
)


def _ask_isa() -> dict[str, Any]:
    """What keel's CPU kernels run in a process of this environment, as the library says; RuntimeError with
    the child's last line when it could not answer."""
    done = subprocess.run([sys.executable, "-c", _ISA_PROBE], capture_output=True, text=True, cwd="/")
    if done.returncode != 0 or not done.stdout.strip():
        err = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RuntimeError(err[-200:])
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _amx_text(answer: dict[str, Any]) -> str:
    return "AMX" if answer["amx"] else f"no AMX ({answer['amx_reason']})"


def _cpu_isa(report: Report) -> str:
    """The build of the CPU kernels keel's ops run, whether their bf16/FP8 prompt GEMMs run on AMX (and why not),
    and the vendored flash_attn's build: asked from the loaded libraries."""
    if not report.torch_version or report.problems:
        return "unknown (keel's libraries are not loadable)"
    try:
        answer = _ask_isa()
    except RuntimeError as exc:
        return f"unknown (asking keel failed: {exc})"
    return f"{answer['build']}; bf16/FP8 prompt GEMMs: {_amx_text(answer)}; vendored flash_attn: {answer['flash_attn']}"


def _amx_state() -> str:
    """Whether keel's AMX prompt kernels run in a process of this environment ("AMX", or "no AMX (reason)")."""
    try:
        return _amx_text(_ask_isa())
    except RuntimeError as exc:
        return f"unknown (asking keel failed: {exc})"


def _caches() -> dict[str, str]:
    keel_cache = Path(os.environ.get("KEEL_CACHE") or Path.home() / ".cache" / "keel" / "hub").expanduser()
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE") or hf_home / "hub").expanduser()
    out = {}
    for name, where in (("keel", keel_cache), ("huggingface", hub)):
        models = sorted(p.name for p in where.glob("models--*")) if where.is_dir() else []
        state = f"{len(models)} model(s)" if where.is_dir() else "does not exist yet"
        out[name] = f"{where} ({state})"
    return out


def render(report: Report) -> str:
    out = [f"keel {report.keel_version or '(not installed)'}" + (f" at {report.keel_dir}" if report.keel_dir else "")]
    if report.torch_version:
        build = f"CUDA {report.torch_cuda}" if report.torch_cuda else "CPU-only"
        fl = report.torch_floor
        out.append(f"torch {report.torch_version} ({build} build); keel needs torch>={fl[0]}.{fl[1]}")
    else:
        out.append(f"torch: {report.torch_error or 'not installed'}")
    if report.preflight:
        out.append(f"preflight: {report.preflight}")
    out.append("libraries (load check: ctypes.CDLL(RTLD_NOW) after import torch, in a fresh process):")
    width = max([len(lib.path) for lib in report.libraries] + [10])
    for lib in report.libraries:
        state = "loads" if lib.loads else ("does not load" if lib.loads is False else (lib.note or "not tried"))
        pred = f"  [preflight: {lib.predicted}]" if lib.predicted else ""
        out.append(f"  {lib.path:<{width}}  {lib.kind:<9}  {state}{pred}")
        if lib.error:
            out.append(f"      {lib.error}")
    drv = (
        f"driver supports CUDA {report.driver_cuda[0]}.{report.driver_cuda[1]}"
        if report.driver_cuda
        else report.driver_note
    )
    twin = (
        f"CUDA twins built with CUDA {report.twin_cuda[0]}.{report.twin_cuda[1]} (static runtime)"
        if report.twin_cuda
        else ""
    )
    out.append(f"CUDA: {drv}" + (f"; {twin}" if twin else ""))
    out.append(f"CPU ISA of keel's kernels: {report.cpu_isa}; CPU flags: {' '.join(report.cpu_flags) or '-'}")
    if report.huge_pages:
        out.append(f"host memory: {report.huge_pages}")
    for name, where in report.caches.items():
        out.append(f"model cache ({name}): {where}")
    for w in report.warnings:
        out.append(f"warning: {w}")
    if report.ok:
        out.append("verdict: keel will work here")
    else:
        for what, fix in report.problems:
            out.append(f"problem: {what}\n  fix: {fix}")
        out.append("verdict: keel will NOT work here")
    return "\n".join(out)


def to_json(report: Report) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(report)
    d["ok"] = report.ok
    return d


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` verb."""
    p = subparsers.add_parser(
        "doctor",
        help="check keel against this environment's torch, driver and CPU (exit 0: keel will work)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-load", action="store_true", help="skip the real load check of each library")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = gather(load=not args.no_load)
    print(json.dumps(to_json(report), indent=2) if args.json else render(report), flush=True)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keel doctor")
    sub = parser.add_subparsers(dest="verb")
    register(sub)
    return run(parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
