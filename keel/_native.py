"""Loads keel's native libraries through torch (no CPython extension API is involved).

`_C` (CPU kernels) always loads; `_C_cuda` only when this torch is a CUDA build. A
failure says why: torch older than the floor the wheel was audited for, a missing
file, or the loader's own message (an unresolved symbol names the torch it expected).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import torch

# Oldest torch whose stable ABI the libraries use; builds target it (TORCH_TARGET_VERSION).
TORCH_FLOOR = (2, 10)

_PACKAGE_DIR = Path(__file__).resolve().parent
_loaded: dict[str, Path] = {}


class NativeLibraryError(ImportError):
    """keel's native library could not be loaded; the message says why and what to do."""


def torch_version() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


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


def _load(name: str) -> Path:
    path = _PACKAGE_DIR / f"{name}.abi3.so"
    if not path.is_file():
        raise NativeLibraryError(
            f"keel: native library {path.name} is missing from {_PACKAGE_DIR}; "
            "this keel was not built (build the wheel: see README 'Building')"
        )
    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise NativeLibraryError(
            f"keel: cannot load {path} with torch {torch.__version__}: {exc}"
        ) from exc
    _loaded[name] = path
    return path


def load() -> dict[str, Path]:
    """Load `_C`, and `_C_cuda` on a CUDA build of torch; returns what was loaded."""
    if _loaded:
        return dict(_loaded)
    floor = _floor()
    if torch_version() < floor:
        raise NativeLibraryError(
            f"keel needs torch>={floor[0]}.{floor[1]} (its libraries use stable-ABI symbols "
            f"introduced there), but torch {torch.__version__} is installed: "
            f"pip install 'torch>={floor[0]}.{floor[1]}'"
        )
    _load("_C")
    if torch.version.cuda:
        _load("_C_cuda")
    return dict(_loaded)


def loaded_libraries() -> dict[str, Path]:
    """Native libraries loaded so far, by name."""
    return dict(_loaded)
