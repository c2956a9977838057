"""Fixtures of the audit's tests (helpers: audit_support.py, beside this file)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_support import build_libraries


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture library, compiled once per session (skips when no C compiler is present)."""
    if not shutil.which("gcc") or not shutil.which("g++"):
        pytest.skip("gcc/g++ not available to build ELF fixtures")
    return build_libraries(tmp_path_factory.mktemp("elf"))
