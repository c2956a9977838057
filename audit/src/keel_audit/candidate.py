"""A candidate torch for `keel-audit preflight`: its libraries, read lazily, without installing it.

A candidate is a torch `.whl` (members read straight from the zip, inflated only when a library is
needed), an installed torch (a site-packages folder, or `installed` for the current environment's,
found without importing torch), or a version (`2.15.0`) that `pip download --no-deps` fetches into
a cache folder first (the only case that needs the network). Extra wheels or folders (`--also`,
e.g. the `nvidia-*` wheels with the CUDA runtime) add their libraries; an installed torch brings
the `nvidia/*/lib` libraries of its site-packages along.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .elf import ElfFormatError, ElfInfo, read_elf
from .errors import AuditInputError
from .wheelzip import MemberReader, check_members, read_file_text, read_member, read_text

_LIB_NAME = re.compile(r"^lib[^/]*\.so(\.\d+)*$")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*([a-z0-9.+]*)$")
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "keel-audit" / "torch"


@dataclass
class Provider:
    """One shared library of the candidate (or of the host): read once, on first use, thread-safe."""

    name: str  # file name: what a DT_NEEDED entry names
    path: str  # where it is (member path inside a wheel, or a file path)
    origin: str  # "torch", "cuda" (an nvidia-* library), "extra" or "host"
    size: int
    loader: Callable[[], bytes | Path | MemberReader]
    _info: ElfInfo | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> ElfInfo:
        """The parsed library; AuditInputError (exit 2) when it cannot be read as an ELF object."""
        with self._lock:
            if self._info is None:
                try:
                    self._info = read_elf(self.loader())
                except (ElfFormatError, AuditInputError, OSError) as exc:
                    raise AuditInputError(f"candidate library {self.path}: cannot be read ({exc})") from None
            return self._info

    @property
    def loaded(self) -> bool:
        return self._info is not None


@dataclass
class TorchCandidate:
    """The torch build preflight resolves against."""

    label: str
    version: str | None  # torch.__version__ ("2.12.1+cu130")
    cuda: str | None  # torch.version.cuda ("13.0"), None for a CPU build
    python_tag: str | None  # "cp311"
    providers: dict[str, Provider]  # by file name
    cuda_libraries_given: bool  # any nvidia-* CUDA runtime library among the providers

    def get(self, name: str) -> Provider | None:
        return self.providers.get(name)

    def prefetch(self, names: Iterable[str]) -> None:
        """Read these libraries in parallel (inflating and positional reads release the GIL), largest first."""
        todo = sorted(
            {p.name: p for n in names if (p := self.providers.get(n)) is not None and not p.loaded}.values(),
            key=lambda p: -p.size,
        )
        if len(todo) <= 1 or (os.cpu_count() or 1) == 1:
            for p in todo:
                p.info()
            return
        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1, 8)) as pool:
            for future in [pool.submit(p.info) for p in todo]:
                future.result()


def _parse_version_py(text: str) -> tuple[str | None, str | None]:
    """(__version__, cuda) from torch/version.py, read as text (torch is never imported)."""
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return (version.group(1) if version else None, cuda.group(1) if cuda else None)


def _python_tag(wheel_text: str | None, filename: str | None = None) -> str | None:
    """The CPython tag (cp311) from a WHEEL file's Tag lines or a wheel file name."""
    tags: list[str] = re.findall(r"^Tag:\s*(\S+)", wheel_text or "", re.M)
    if not tags and filename:
        parts = filename.removesuffix(".whl").split("-")
        tags = ["-".join(parts[-3:])] if len(parts) >= 5 else []
    for tag in tags:
        interp = str(tag).split("-")[0]
        if re.fullmatch(r"cp3\d+", interp):
            return interp
    return None


def _origin(member: str, default: str) -> str:
    return "cuda" if member.startswith("nvidia/") or "/nvidia/" in member else default


@dataclass
class _Wheel:
    """A wheel opened for reading: its zip, a descriptor for positional reads, its checked members."""

    path: Path
    zf: zipfile.ZipFile
    fd: int
    members: dict[str, zipfile.ZipInfo]

    def text(self, name: str) -> str | None:
        """A metadata member's text through the bounded reader; None when the wheel has no such member."""
        info = self.members.get(name)
        return read_text(self.zf, info, str(self.path), self.fd) if info else None


def _open_wheel(path: Path, stack: ExitStack) -> _Wheel:
    try:
        zf = stack.enter_context(zipfile.ZipFile(path))
        fd = os.open(path, os.O_RDONLY)
    except (zipfile.BadZipFile, OSError) as exc:
        raise AuditInputError(f"{path}: not a readable wheel ({exc}); expected a zip archive") from None
    stack.callback(os.close, fd)
    return _Wheel(path, zf, fd, {info.filename: info for info in check_members(zf, str(path))})


def _wheel_providers(wheel: _Wheel, origin: str) -> dict[str, Provider]:
    zf, fd = wheel.zf, wheel.fd
    out: dict[str, Provider] = {}
    for info in wheel.members.values():
        base = info.filename.rsplit("/", 1)[-1]
        if _LIB_NAME.match(base) and (info.filename.startswith("torch/lib/") or "/lib/" in info.filename):
            out.setdefault(
                base,
                Provider(
                    base,
                    info.filename,
                    _origin(info.filename, origin),
                    info.file_size,
                    partial(read_member, zf, info, fd),
                ),
            )
    return out


def _dir_providers(root: Path, origin: str) -> dict[str, Provider]:
    out: dict[str, Provider] = {}
    if not root.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(root):
        for base in sorted(files):
            full = Path(dirpath) / base
            if _LIB_NAME.match(base) and not full.is_symlink() and full.is_file():
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                out.setdefault(
                    base, Provider(base, rel, _origin(rel, origin), full.stat().st_size, partial(Path, full))
                )
    return out


def _site_of_current() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise AuditInputError(
            "--torch installed: no torch in this environment (" + sys.executable + "); expected an installed torch"
        )
    return Path(next(iter(spec.submodule_search_locations))).parent


def _open_site(site: Path, label: str) -> TorchCandidate:
    torch_dir = site / "torch" if (site / "torch").is_dir() else site
    if not (torch_dir / "lib").is_dir():
        raise AuditInputError(f"{label}: no torch/lib folder; expected a site-packages folder with torch installed")
    version, cuda = _parse_version_py(read_file_text(torch_dir / "version.py", label) or "")
    tag = None
    for dist in sorted(torch_dir.parent.glob("torch-*.dist-info")):
        tag = _python_tag(read_file_text(dist / "WHEEL", label)) or tag
    providers = _dir_providers(torch_dir / "lib", "torch")
    for name, p in _dir_providers(torch_dir.parent / "nvidia", "cuda").items():
        p.path = "nvidia/" + p.path
        providers.setdefault(name, p)
    return TorchCandidate(label, version, cuda, tag, providers, any(p.origin == "cuda" for p in providers.values()))


def download(version: str, cache: Path) -> Path:
    """`pip download torch==VERSION --no-deps` into `cache` (once); the wheel's path."""
    found = sorted(cache.glob(f"torch-{version}-*.whl")) + sorted(cache.glob(f"torch-{version}+*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    cmd += [f"torch=={version}", "-d", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(f"torch-{version}*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise AuditInputError(f"--torch {version}: `pip download torch=={version}` failed ({tail[0]})")
    return found[0]


def open_candidate(spec: str, stack: ExitStack, also: Iterable[str] = (), cache: Path | None = None) -> TorchCandidate:
    """The candidate named by `spec` (a .whl, a site-packages folder, `installed`, or a version)."""
    path = Path(spec)
    if spec == "installed":
        cand = _open_site(_site_of_current(), f"installed torch ({sys.executable})")
        cand.python_tag = cand.python_tag or f"cp{sys.version_info[0]}{sys.version_info[1]}"
    elif path.is_file():
        if not zipfile.is_zipfile(path):
            raise AuditInputError(f"--torch {spec}: not a zip archive; expected a torch .whl")
        wheel = _open_wheel(path, stack)
        vtext = wheel.text("torch/version.py")
        if vtext is None:
            raise AuditInputError(f"--torch {spec}: no torch/version.py in the wheel; expected a torch wheel")
        version, cuda = _parse_version_py(vtext)
        meta = next((n for n in wheel.members if n.endswith(".dist-info/WHEEL") and n.count("/") == 1), None)
        tag = _python_tag(wheel.text(meta) if meta else None, path.name)
        cand = TorchCandidate(str(path), version, cuda, tag, _wheel_providers(wheel, "torch"), False)
    elif path.is_dir():
        cand = _open_site(path, str(path))
    elif _VERSION_RE.match(spec) and os.sep not in spec:
        return open_candidate(str(download(spec, cache or DEFAULT_CACHE)), stack, also, cache)
    else:
        raise AuditInputError(
            f"--torch {spec}: expected a torch .whl, a site-packages folder, `installed` or a version like 2.15.0"
        )
    for extra in also:
        epath = Path(extra)
        if epath.is_file() and zipfile.is_zipfile(epath):
            more = _wheel_providers(_open_wheel(epath, stack), "extra")
        elif epath.is_dir():
            more = _dir_providers(epath, "extra")
        else:
            raise AuditInputError(f"--also {extra}: expected a wheel or a folder of shared libraries")
        for name, p in more.items():
            cand.providers.setdefault(name, p)
    cand.cuda_libraries_given = any(p.origin == "cuda" for p in cand.providers.values())
    return cand


def host_library(name: str, dirs: Iterable[str]) -> Path | None:
    """A library of this machine by file name: LD_LIBRARY_PATH, `ldconfig -p`, then the usual folders."""
    for d in dirs:
        p = Path(d) / name
        if p.is_file():
            return p
    return None


_HOST_CACHE: dict[str, str] | None = None


def host_dirs() -> list[str]:
    """Folders the dynamic loader of this machine searches (LD_LIBRARY_PATH first)."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    global _HOST_CACHE
    if _HOST_CACHE is None:
        _HOST_CACHE = {}
        for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
            try:
                out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in out.splitlines():
                if "=>" in line:
                    _HOST_CACHE.setdefault(line.split("=>")[1].strip().rsplit("/", 1)[0], "")
            break
    dirs += list(_HOST_CACHE)
    dirs += ["/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"]
    return list(dict.fromkeys(dirs))
