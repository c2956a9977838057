"""keel's native ops as a pytest fixture, and the marker of the tests that need them."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def keel_native_ops():
    """keel's native ops, loaded. The suite always runs against the installed wheel, so a missing or
    broken keel/_C.abi3.so FAILS every test that needs the ops (with the loader's message), never skips."""
    try:
        from keel import ops
    except Exception as exc:  # noqa: BLE001 - whatever the loader raised is the failure to report
        pytest.fail(f"keel's native ops did not load: {type(exc).__name__}: {exc}", pytrace=False)
    if not hasattr(ops, "rms_norm"):
        pytest.fail(f"keel.ops ({ops.__file__}) has no rms_norm: not keel's op package", pytrace=False)
    return ops


# for tests that need keel's native ops; the conftests that use it import keel_native_ops too
needs_ops = pytest.mark.usefixtures("keel_native_ops")
