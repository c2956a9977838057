"""Loads keel's native libraries through torch (no CPython extension API is involved).

`_C` (CPU kernels) always loads; `_C_cuda` only when this torch is a CUDA build, and its absence
(a wheel built with KEEL_CUDA=off) or a failed load is not fatal: the CPU ops keep working and
a CUDA tensor reaching a keel op gets an error naming the op and saying why there is no kernel.
A fatal failure says why: torch older than the floor the wheel was audited for, a missing
file, or the loader's own message (an unresolved symbol names the torch it expected).

`load_pair` is the generic part, shared with the vendored libraries (keel/vendored/<name>/).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from keel._oplist import KEEL_OPS
from keel._settings import CPU_ISA_LEVELS, CpuIsaError, cpu_isa_level, torch_floor

_PACKAGE_DIR = Path(__file__).resolve().parent
_loaded: dict[str, Path] = {}
_status: dict[str, LoadStatus] = {}
# torch.library registrations of the "no CUDA kernel" stubs; kept alive for the process
_stub_libraries: list[Any] = []
cuda_stubs: dict[str, Callable[..., Any]] = {}  # qualname -> the raising CUDA kernel registered for it


class NativeLibraryError(ImportError):
    """keel's native library could not be loaded; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class LoadStatus:
    """What `load_pair` did for one library pair: the CPU library, and the CUDA one or why not."""

    namespace: str
    cpu: Path
    cuda: Path | None
    cuda_reason: str | None  # why `cuda` is None on a CUDA torch; None when loaded or not wanted

    @property
    def cuda_ok(self) -> bool:
        """True when CUDA tensors reach real kernels (or this torch has no CUDA)."""
        return self.cuda_reason is None


def torch_version() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_cpu_isa_env() -> str:
    """The KEEL_CPU_ISA level (keel._settings.cpu_isa_level); an unknown value is refused at import, before a
    library loads (the kernels would otherwise fail at first use)."""
    try:
        return cpu_isa_level()
    except CpuIsaError as exc:
        raise NativeLibraryError(str(exc)) from exc


def _floor() -> tuple[int, int]:
    """The wheel's `torch>=` floor, else TORCH_FLOOR (keel._settings.torch_floor)."""
    return torch_floor()


def _load_file(
    path: Path,
    who: str = "keel",
    error: type[ImportError] = NativeLibraryError,
    missing: str = "this keel was not built",
) -> None:
    """torch.ops.load_library(path), raising `error` (message prefixed `who`) that says what is wrong."""
    if not path.is_file():
        raise error(
            f"{who}: native library {path.name} is missing from {path.parent}; "
            f"{missing} (build the wheel: see README 'Building')"
        )
    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise error(f"{who}: cannot load {path} with torch {torch.__version__}: {exc}") from exc


def missing_cuda_kernel(qualname: str, library: Path, reason: str) -> Callable[..., Any]:
    """A CUDA kernel for `qualname` that raises: the CUDA library `library` is not loaded, and why."""
    message = (
        f"{qualname}: got a CUDA tensor, but the CUDA kernels of this op are not available: {library.name} "
        f"{reason}. The CPU kernels work; install a keel wheel built with CUDA (KEEL_CUDA=on) to run on the GPU"
    )

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    kernel.__doc__ = message
    return kernel


def _register_cuda_stubs(namespace: str, ops: Iterable[str], library: Path, reason: str) -> None:
    lib = torch.library.Library(namespace, "IMPL")
    for op in ops:
        kernel = missing_cuda_kernel(f"{namespace}::{op}", library, reason)
        lib.impl(op, kernel, "CUDA")
        cuda_stubs[f"{namespace}::{op}"] = kernel
    _stub_libraries.append(lib)


def load_pair(
    directory: Path,
    namespace: str,
    ops: Iterable[str],
    *,
    who: str = "keel",
    error: type[ImportError] = NativeLibraryError,
    missing: str = "this keel was not built",
) -> LoadStatus:
    """Load `<directory>/_C.abi3.so`, and `_C_cuda.abi3.so` on a CUDA build of torch (keel's own pair
    and every vendored library's).

    The CPU library must load (`error`, prefixed `who`, otherwise). The CUDA one may be missing or fail
    to load: then every op of `ops` in `namespace` gets a CUDA kernel that raises with the reason.
    """
    cpu = directory / "_C.abi3.so"
    _load_file(cpu, who, error, missing)
    cuda_path = directory / "_C_cuda.abi3.so"
    cuda: Path | None = None
    reason: str | None = None
    if torch.version.cuda:
        if not cuda_path.is_file():
            reason = f"is missing from {directory} (this wheel was built without CUDA kernels)"
        else:
            try:
                torch.ops.load_library(str(cuda_path))
                cuda = cuda_path
            except OSError as exc:
                reason = f"could not be loaded with torch {torch.__version__}: {exc}"
        if reason is not None:
            _register_cuda_stubs(namespace, ops, cuda_path, reason)
    return LoadStatus(namespace, cpu, cuda, reason)


def load() -> dict[str, Path]:
    """Load `_C`, and `_C_cuda` on a CUDA build of torch; returns what was loaded."""
    if _loaded:
        return dict(_loaded)
    check_cpu_isa_env()
    floor = _floor()
    if torch_version() < floor:
        raise NativeLibraryError(
            f"keel needs torch>={floor[0]}.{floor[1]} (its libraries use stable-ABI symbols "
            f"introduced there), but torch {torch.__version__} is installed: "
            f"pip install 'torch>={floor[0]}.{floor[1]}'"
        )

    status = load_pair(_PACKAGE_DIR, "keel", KEEL_OPS)
    _status["keel"] = status
    _loaded["_C"] = status.cpu
    if status.cuda is not None:
        _loaded["_C_cuda"] = status.cuda
    return dict(_loaded)


def loaded_libraries() -> dict[str, Path]:
    """Native libraries loaded so far, by name."""
    return dict(_loaded)


def load_status(namespace: str = "keel") -> LoadStatus | None:
    """The LoadStatus of `namespace`'s libraries (None before they are loaded)."""
    return _status.get(namespace)


# keel_cpu_isa_status's level codes (csrc/stable/cpu_isa_level.h CpuIsaLevel)
_LEVEL_CODES = {0: "base", 1: "avx2", 2: "avx512", 3: "amx", 4: "auto"}


@dataclass(frozen=True, slots=True)
class CpuIsaStatus:
    """What keel's CPU kernels run in this process, as keel's library answers it (keel_cpu_isa_status)."""

    level: str  # the KEEL_CPU_ISA level the library read (one of keel._settings.CPU_ISA_LEVELS)
    avx2: bool  # the AVX2+FMA+F16C build of the kernels (False: the baseline x86-64 build)
    avx512: bool  # its AVX-512 F/BW/VL/DQ paths (keel::fp8_linear's e4m3 GEMV)
    avx512bf16: bool  # its AVX-512 BF16 paths (keel::linear's bf16 GEMV)
    amx: bool  # the AMX bf16 prompt GEMMs of keel::linear and keel::fp8_linear
    amx_reason: str  # why not AMX, in the library's words ("" when amx)

    @property
    def build(self) -> str:
        """base, avx2 or avx512 (both AVX-512 parts), or avx2 plus the one AVX-512 part this CPU has."""
        if not self.avx2:
            return "base"
        if self.avx512 and self.avx512bf16:
            return "avx512"
        if self.avx512 or self.avx512bf16:
            return "avx2 + AVX-512 " + ("F/BW/VL/DQ" if self.avx512 else "BF16")
        return "avx2"


def cpu_isa_status() -> CpuIsaStatus:
    """Ask keel's CPU library (loaded by `load()`) what its kernels run: a C function of the library read with
    ctypes, codes and the library's reason text, no message to parse. Asks Linux for the AMX tile permission
    where AMX is allowed, as the first prompt GEMM would."""
    path = load()["_C"]
    lib = ctypes.CDLL(str(path))  # the library torch loaded: the same handle, the same process state
    lib.keel_cpu_isa_status.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.keel_cpu_isa_status.restype = ctypes.c_int
    lib.keel_amx_reason_text.argtypes = [ctypes.c_int]
    lib.keel_amx_reason_text.restype = ctypes.c_char_p
    out = (ctypes.c_int * 4)()
    if lib.keel_cpu_isa_status(out) != 0:  # the library read an unknown level (at its first use)
        check_cpu_isa_env()  # names the value when it is still in the environment
        raise NativeLibraryError(
            f"keel: {path.name} read an unknown KEEL_CPU_ISA level (the environment changed after import?); "
            f"expected one of {', '.join(CPU_ISA_LEVELS)}"
        )
    level, features, reason, errno = out
    text = "" if reason == 0 else (lib.keel_amx_reason_text(reason) or b"reason code %d" % reason).decode()
    if reason == 1:  # capped: say by which level
        text += f"={_LEVEL_CODES[level]}"
    if errno:
        text += f": {os.strerror(errno)}"
    return CpuIsaStatus(
        _LEVEL_CODES[level], bool(features & 1), bool(features & 2), bool(features & 4), bool(features & 8), text
    )
