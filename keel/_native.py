"""Loads keel's native libraries through torch (no CPython extension API is involved).

`_C` (CPU kernels) always loads; `_C_cuda` only when this torch is a CUDA build, and its absence
(a wheel built with KEEL_CUDA=off) or a failed load is not fatal: the CPU ops keep working and
a CUDA tensor reaching a keel op gets an error naming the op and saying why there is no kernel.
A fatal failure says why: torch older than the floor the wheel was audited for, a missing
file, or the loader's own message (an unresolved symbol names the torch it expected).

`load_pair` is the generic part, shared with the vendored libraries (keel/vendored/<name>/).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from keel._oplist import KEEL_OPS

# Oldest torch whose stable ABI the libraries use; builds target it (TORCH_TARGET_VERSION).
TORCH_FLOOR = (2, 10)

# Accepted values of KEEL_CPU_ISA (csrc/ops/cpu_isa.cpp reads it; unset means auto): each caps the CPU
# kernels at a level (avx512: AVX-512 incl. BF16, no AMX); amx also requires AMX (an error at the first
# bf16 prompt GEMM when the CPU or kernel lacks it). The vendored libraries read it too: avx512 and amx
# mean their best (AVX-512) build.
CPU_ISA_NAMES = ("auto", "base", "avx2", "avx512", "amx")

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


def check_cpu_isa_env() -> None:
    """Refuse an unknown KEEL_CPU_ISA at import (the kernels would otherwise fail at first use)."""
    value = os.environ.get("KEEL_CPU_ISA")
    if value and value not in CPU_ISA_NAMES:
        raise NativeLibraryError(
            f"keel: KEEL_CPU_ISA={value!r} is not a known instruction set; expected one of "
            f"{', '.join(CPU_ISA_NAMES)} (or unset for auto)"
        )


def _floor() -> tuple[int, int]:
    """The wheel's `torch>=` floor (written by keel's audit at build time), else TORCH_FLOOR."""
    try:
        for req in metadata.requires("keel") or ():
            name, _, rest = req.partition(">=")
            if name.strip() == "torch" and rest:
                major, minor = rest.split(",")[0].strip().split(".")[:2]
                return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        pass
    return TORCH_FLOOR


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
