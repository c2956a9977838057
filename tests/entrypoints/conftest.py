"""Fixtures of the server tests: a tiny offline checkpoint and one server per module over the real engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from support.serve import Served, StepControl, build_tiny_model, keel_native_ops, start_server  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("serve_model"))


@pytest.fixture(scope="session")
def tool_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a chat template that renders tools the Hermes way (context 1024)."""
    from keel_dev.checkpoints import with_tools_template

    return with_tools_template(tiny_model, tmp_path_factory.mktemp("tool_model") / "tiny-tools")


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[Served]:
    """One server for a test module (the tiny model, fp32, 4-token blocks)."""
    s = start_server(tiny_model)
    yield s
    s.stop()


@pytest.fixture
def steps(served: Served) -> Iterator[StepControl]:
    """Pause or slow the served engine's steps for one test."""
    control = StepControl(served.engine.engine)
    yield control
    control.restore()
