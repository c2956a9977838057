"""Session fixtures of the whole suite.

`pythonpath = ["tests"]` (pyproject.toml) puts tests/ on sys.path for the `support` helpers; `import keel`
finds the installed wheel (the source lives under src/). The helpers scripts share with the tests are the
installed `keel_dev` (`pip install -e dev`).
"""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with slow tests first, then by their number of tests (each file's own order kept). Under
    `--dist loadfile` a file is one unit of work, handed to the next free worker in this order
    (scripts/test.sh turns off xdist's own reordering, which puts one-test files last): the long units start
    early and the short ones fill the end, instead of one worker running a long test alone at the end."""
    count = Counter(item.path for item in items)
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in slow, -count[item.path], str(item.path)))


@pytest.fixture(autouse=True, scope="session")
def _keel_cache_isolated(tmp_path_factory: pytest.TempPathFactory):
    """keel's model cache (KEEL_CACHE) points at an empty folder: tests never see or write the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KEEL_CACHE", str(tmp_path_factory.mktemp("keel_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def smollm2_fp32(tmp_path_factory: pytest.TempPathFactory):
    """The real SmolLM2 GGUF converted once to an fp32 HF checkpoint folder (skips when it is absent)."""
    from support.smollm2 import GGUF, MISSING

    if GGUF is None:
        pytest.skip(MISSING)
    from keel.gguf.convert import write_checkpoint

    out = tmp_path_factory.mktemp("smollm2")
    write_checkpoint(GGUF, out, "float32")
    return out
