"""Native library loading: what is loaded, and the messages when loading cannot work."""

from __future__ import annotations

import pytest
import torch

import keel
from keel import _native


def test_cpu_library_loaded_and_cuda_only_on_cuda_torch():
    loaded = _native.loaded_libraries()
    assert "_C" in loaded
    assert ("_C_cuda" in loaded) == bool(torch.version.cuda)
    assert keel.ops.rms_norm is not None


def test_too_old_torch_names_the_floor(monkeypatch):
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "torch_version", lambda: (2, 9))
    with pytest.raises(_native.NativeLibraryError, match=r"keel needs torch>=2\.\d+ .* but torch .* is installed"):
        _native.load()


def test_missing_library_says_where(monkeypatch, tmp_path):
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_PACKAGE_DIR", tmp_path)
    with pytest.raises(_native.NativeLibraryError, match=r"_C\.abi3\.so is missing from .*this keel was not built"):
        _native.load()


def test_broken_library_gives_loader_reason(monkeypatch, tmp_path):
    (tmp_path / "_C.abi3.so").write_bytes(b"not an ELF file")
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_PACKAGE_DIR", tmp_path)
    with pytest.raises(_native.NativeLibraryError, match=r"cannot load .*_C\.abi3\.so with torch .*: .*"):
        _native.load()
