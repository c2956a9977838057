"""`keel serve` as a subprocess: start it on a free port, wait until /health answers 200, stop it.

The server runs with `python -m keel.cli serve` of the given interpreter, from a folder outside any
checkout (the installed keel is what runs, never a source tree), with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from keel_dev.net import free_port

Output = Path | Literal["pipe", "inherit"]


@dataclass
class Server:
    """A running `keel serve` process."""

    proc: subprocess.Popen
    port: int
    log: Path | None = None  # where its output goes, when `output` was a file

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self, timeout: float = 5.0) -> int | None:
        """The status of GET /health (None when nothing answers)."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def output(self) -> str:
        """What the server printed (its log file, or its pipe once it has exited); '' when inherited."""
        if self.log is not None:
            return self.log.read_text(errors="replace")
        stream: IO[str] | None = self.proc.stdout
        if stream is not None and self.proc.poll() is not None:
            return stream.read()
        return ""

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Send `sig` (SIGINT: a clean shutdown), wait up to `timeout` s, then kill; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def start_server(
    args: list[str],
    *,
    python: str = sys.executable,
    timeout_s: float = 300.0,
    output: Output = "pipe",
    env: dict[str, str] | None = None,
) -> Server:
    """`python -m keel.cli serve --port P *args` on a free port P; returns once /health answers 200.

    `output`: a file to write the server's output to, "pipe" (kept, shown when it fails to start), or
    "inherit" (this process's stdout and stderr). Raises RuntimeError, with the server's output, when it
    exits or does not answer within `timeout_s`.
    """
    port = free_port()
    cmd = [python, "-m", "keel.cli", "serve", "--port", str(port), *args]
    env = {**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"}
    log: Path | None = None
    if output == "inherit":
        stdout: int | IO[str] | None = None
    elif output == "pipe":
        stdout = subprocess.PIPE
    else:
        log = Path(output)
        stdout = log.open("w")
    proc = subprocess.Popen(cmd, cwd=tempfile.gettempdir(), env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        stdout.close()  # type: ignore[union-attr]  # the child holds its own copy
    server = Server(proc, port, log)
    deadline = time.monotonic() + timeout_s
    while server.health(timeout=2) != 200:
        if proc.poll() is not None:
            raise RuntimeError(f"keel serve exited with {proc.returncode}:\n{server.output()[-3000:]}")
        if time.monotonic() > deadline:
            server.kill()
            late = f"keel serve did not answer {server.base_url}/health within {timeout_s:.0f} s"
            raise RuntimeError(f"{late}:\n{server.output()[-3000:]}")
        time.sleep(0.2)
    return server
