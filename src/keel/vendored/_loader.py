"""Loading one vendored library: `_C.abi3.so`, plus `_C_cuda.abi3.so` on a CUDA build of torch.

The CPU library holds the schemas (the library's op namespace) and CPU kernels and must load.
A CUDA twin that is missing or cannot load leaves the CPU ops working; the reason is kept, and a
CUDA tensor reaching one of the library's ops raises an error that names the op and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from keel import _native
from keel._settings import CpuIsaError, cpu_isa_level

_DIR = Path(__file__).resolve().parent
_loaded: dict[str, VendoredLibrary] = {}


class VendoredLibraryError(ImportError):
    """A vendored library could not be loaded; the message names the library and the cause."""


@dataclass(frozen=True, slots=True)
class VendoredLibrary:
    """What loading a vendored library found: its files, its op namespace, and the CUDA twin's state."""

    name: str
    namespace: str
    ops: tuple[str, ...]  # op names of `namespace` (schemas in adapters/<name>/bindings.cpp)
    cpu: Path
    cuda: Path | None  # loaded CUDA twin, or None
    cuda_error: str | None  # why the CUDA twin is not loaded (None when loaded or not wanted)


def load_vendored(name: str, namespace: str, ops: list[str], directory: Path | None = None) -> VendoredLibrary:
    """Load `keel/vendored/<name>/_C.abi3.so` (+ CUDA twin on CUDA torch) once; `ops` are the
    op names of `namespace` that get a clear CUDA error when the twin cannot load."""
    if name in _loaded:
        return _loaded[name]
    try:
        cpu_isa_level()  # the level the adapter passes into the fork (csrc/stable/cpu_isa_level.h reads the same)
    except CpuIsaError as exc:
        raise VendoredLibraryError(f"keel.vendored.{name}: {exc}") from exc
    floor = _native._floor()
    if _native.torch_version() < floor:
        raise VendoredLibraryError(
            f"keel.vendored.{name} needs torch>={floor[0]}.{floor[1]}, but torch {torch.__version__} is installed"
        )
    status = _native.load_pair(
        directory or _DIR / name,
        namespace,
        ops,
        who=f"keel.vendored.{name}",
        error=VendoredLibraryError,
        missing="this keel was built without it",
    )
    cuda_error = None if status.cuda_reason is None else f"_C_cuda.abi3.so {status.cuda_reason}"
    lib = VendoredLibrary(name, namespace, tuple(ops), status.cpu, status.cuda, cuda_error)
    _loaded[name] = lib
    return lib


def loaded_vendored() -> dict[str, VendoredLibrary]:
    """Vendored libraries loaded so far, by name."""
    return dict(_loaded)
