"""`python -c CODE` in a child that starts with torch already imported.

Many tests run a script at each KEEL_CPU_ISA level in a fresh interpreter, because the level is read when keel's
libraries load. Importing torch is most of such a child's time, so `run_python` forks each child from a parent
(one per environment, keel's own variables aside, per test process) that has imported torch and nothing else:
the child gets a fresh copy of that state, the same `os.environ`, `sys.argv` and working directory as
`python -c`, imports keel itself (so it reads its own KEEL_* settings), and its exit status, stdout and stderr
come back as a `subprocess.CompletedProcess`.

The parent runs no torch op before it forks (an OpenMP pool does not survive a fork). A child may see keel's
import fail (an unknown level, a broken library); a script that must see torch's own import differ needs a real
`subprocess.run`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_MAX_PARENTS = 4  # each holds a copy of torch's import in memory: the least recently used goes first

_PARENT = r"""
import json, os, select, signal, sys, traceback
import torch  # the import every child inherits; no torch op runs here, keel is not imported
proto_in = os.fdopen(os.dup(0), "r")
proto_out = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1):
    os.dup2(null, fd)

def child(req):
    proto_in.close()
    proto_out.close()
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.argv = ["-c", *req["args"]]
    rc = 0
    try:
        exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, int):
            rc = e.code
        else:
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(rc)

for line in proto_in:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    timed_out = False
    if req["timeout"] is not None:  # the child is killed here, where its pid cannot have been reused yet
        exited = os.pidfd_open(pid)
        if not select.select([exited], [], [], req["timeout"])[0]:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        os.close(exited)
    _, status = os.waitpid(pid, 0)
    proto_out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out}) + "\n")
    proto_out.flush()
"""


class _Parent:
    """One forking parent: a process started with `env` that has imported torch."""

    def __init__(self, env: dict[str, str]):
        self.home = tempfile.mkdtemp(prefix="keel_forked_")  # its working directory: no checkout on sys.path
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PARENT],
            env=env,
            cwd=self.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def run(self, code: str, args: list[str], env: dict[str, str], cwd: str, timeout: float | None):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        cmd = [sys.executable, "-c", code, *args]
        with tempfile.TemporaryDirectory(prefix="keel_forked_out_") as out:
            paths = {name: Path(out, name) for name in ("stdout", "stderr")}
            for path in paths.values():
                path.touch()
            req = {"code": code, "args": args, "env": env, "cwd": cwd, "timeout": timeout}
            self.proc.stdin.write(json.dumps(req | {k: str(v) for k, v in paths.items()}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the forking parent ended (exit {self.proc.wait()}): its imports failed?")
            answer = json.loads(line)
            stdout, stderr = (path.read_text(errors="replace") for path in paths.values())
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout or 0, stdout, stderr)
        return subprocess.CompletedProcess(cmd, answer["rc"], stdout, stderr)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.home, ignore_errors=True)


_parents: dict[tuple[tuple[str, str], ...], _Parent] = {}


def _identity(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of `env` the parent's imports can read: not pytest's per-test variable, not keel's own settings
    (the child reads those when it imports keel, after its environment is set)."""
    return tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST" and not k.startswith("KEEL_")))


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """What `subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True,
    text=True, timeout=timeout)` returns, from a forked child (raises `subprocess.TimeoutExpired` likewise)."""
    env = dict(os.environ if env is None else env)
    key = _identity(env)
    parent = _parents.pop(key, None)
    if parent is None or parent.proc.poll() is not None:
        if len(_parents) >= _MAX_PARENTS:
            _parents.pop(next(iter(_parents))).close()
        parent = _Parent(env)
    _parents[key] = parent  # most recently used last
    return parent.run(code, list(args), env, str(cwd or os.getcwd()), timeout)


_SCRIPT = """
import os, runpy, sys
path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(path))
runpy.run_path(path, run_name="__main__")
"""


def run_script(
    path: str | os.PathLike[str],
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """What `python PATH ARGS...` returns (the script's folder first on `sys.path`, `sys.argv[0]` its path), from
    a forked child as `run_python` runs one."""
    done = run_python(_SCRIPT, str(path), *args, env=env, cwd=cwd, timeout=timeout)
    done.args = [sys.executable, str(path), *args]
    return done


@atexit.register
def _close_all() -> None:
    while _parents:
        _parents.popitem()[1].close()
