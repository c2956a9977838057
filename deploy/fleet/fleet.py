"""A small serving fleet on one machine: `keel serve` replicas (processes) behind HAProxy with active health
checks, continuous client traffic, and a rolling restart of the replicas onto another environment (another
torch under the same keel files) while the traffic runs. Used by deploy/fleet/rolling_upgrade.py (a script
beside it: it imports this module as `fleet`) and the suite's small roll (tests/entrypoints/test_rolling_upgrade.py)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status of a GET (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@dataclass
class Replica:
    """One `keel serve` process on a fixed loopback port, run by the interpreter `python`."""

    python: str
    model: str
    port: int
    args: list[str] = field(default_factory=list)
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [self.python, "-m", "keel.cli", "serve", "--model", self.model, "--port", str(self.port), *self.args]
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd="/")

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Wait until `/v1/models` answers 200 (readiness); returns the seconds it took."""
        t0 = time.monotonic()
        while http_status(self.url + "/v1/models") != 200:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica on port {self.port} exited with {self.proc.returncode} (log: {self.log})")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"replica on port {self.port} not ready after {timeout} s (log: {self.log})")
            time.sleep(0.1)
        return time.monotonic() - t0

    def drain(self, timeout: float = 120.0) -> int:
        """SIGTERM (keel serve drains: 503 to new work, running requests finish) and wait; the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def torch(self) -> str:
        """The torch release the replica runs, from its `/metrics` (keel_build_info)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "keel_build_info":
                return str(family.samples[0].labels["torch_version"])
        raise RuntimeError(f"replica on port {self.port}: /metrics has no keel_build_info")


class HAProxy:
    """HAProxy in front of fixed backend ports: active checks of readiness (`/v1/models`) every
    200 ms, a replica taken out after two failed checks (one check that is slow on a busy machine, up to 2 s,
    does not take the last ready replica out), and a request that met a 503 / a refused connection / an empty
    response retried on another replica (`retry-on`, `option redispatch`)."""

    def __init__(self, ports: list[int], workdir: Path, port: int | None = None, check_ms: int = 200) -> None:
        binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (Debian: apt-get install haproxy)")
        self.binary, self.port, self.stats_port = binary, port or _free_port(), _free_port()
        self.ports = list(ports)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "haproxy.cfg"
        servers = "\n".join(
            f"    server r{i} 127.0.0.1:{p} check inter {check_ms} fall 2 rise 2" for i, p in enumerate(ports)
        )
        self.config.write_text(
            f"""global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503
    option http-buffer-request
frontend keel
    bind 127.0.0.1:{self.port}
    default_backend replicas
frontend stats
    bind 127.0.0.1:{self.stats_port}
    stats enable
    stats uri /stats
backend replicas
    balance leastconn
    option httpchk GET /v1/models
    http-check expect status 200
    timeout check 2s
{servers}
"""
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        subprocess.run([self.binary, "-c", "-q", "-f", str(self.config)], check=True)
        self.proc = subprocess.Popen([self.binary, "-db", "-f", str(self.config)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while http_status(self.url + "/v1/models") == 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("haproxy did not start")
            time.sleep(0.05)

    def status(self) -> dict[int, str]:
        """backend port -> HAProxy's view of that server ("UP", "DOWN", "UP 1/2", ...), from its stats CSV."""
        rows = urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).read().decode()
        header, *lines = rows.splitlines()
        cols = header.lstrip("# ").split(",")
        out = {}
        for line in lines:
            row = dict(zip(cols, line.split(","), strict=False))
            if row.get("pxname") == "replicas" and row.get("svname", "").startswith("r"):
                out[self.ports[int(row["svname"][1:])]] = row.get("status", "")
        return out

    def wait_in_rotation(self, port: int, timeout: float = 60.0) -> float:
        """Wait until the balancer's checks have put the replica on `port` back (status UP)."""
        t0 = time.monotonic()
        while self.status().get(port) != "UP":
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"haproxy did not put :{port} back within {timeout} s: {self.status()}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Result:
    start: float
    end: float
    ok: bool
    ttft: float | None = None
    status: int = 0
    error: str = ""
    text: str = ""


class Traffic:
    """`clients` threads sending streaming completions through `url` with the official openai client, back to
    back until `stop()`; each request is one `Result` (ok: the stream ended normally with a finished choice)."""

    def __init__(self, url: str, model: str, clients: int = 4, max_tokens: int = 16, api_key: str = "") -> None:
        self.url, self.model, self.clients, self.max_tokens, self.api_key = url, model, clients, max_tokens, api_key
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(300)

    def _client(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            self.results.append(self.one(f"Request {i}-{n}: say something about the number {n}."))
            n += 1

    def one(self, prompt: str, *, temperature: float = 0.7, stream: bool = True) -> Result:
        """One completion through the official openai client (no retries: a failure counts as one)."""
        import openai

        client = openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, timeout=300)
        kw: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens}
        t0 = time.monotonic()
        res = Result(start=t0, end=t0, ok=False)
        try:
            if not stream:
                r = client.completions.create(**kw, temperature=temperature)
                res.status, res.text = 200, r.choices[0].text
                res.ok = r.choices[0].finish_reason in ("stop", "length")
            else:
                finished = False
                for chunk in client.completions.create(**kw, temperature=temperature, stream=True):
                    if res.ttft is None:
                        res.ttft = time.monotonic() - t0
                    for choice in chunk.choices:
                        res.text += choice.text or ""
                        finished = finished or choice.finish_reason in ("stop", "length")
                res.status, res.ok = 200, finished  # the client raises on an error event or a cut stream
        except openai.APIStatusError as e:
            res.status, res.error = e.status_code, str(e)[:200]
        except (openai.APIError, OSError) as e:
            res.error = repr(e)[:200]
        res.end = time.monotonic()
        return res


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of `values` (nan when empty)."""
    if not values:
        return float("nan"), float("nan")
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), q[98]


def phase_rows(results: list[Result], marks: tuple[float, float]) -> list[dict[str, Any]]:
    """Per phase (before / during / after the roll, by request start time): counts and TTFT / latency."""
    rows = []
    for name, lo, hi in (("before", 0.0, marks[0]), ("during", marks[0], marks[1]), ("after", marks[1], 1e18)):
        rs = [r for r in results if lo <= r.start < hi]
        ok = [r for r in rs if r.ok]
        ttft = percentiles([r.ttft for r in ok if r.ttft is not None])
        lat = percentiles([r.end - r.start for r in ok])
        rows.append(
            {
                "phase": name,
                "sent": len(rs),
                "completed": len(ok),
                "failed": len(rs) - len(ok),
                "ttft_p50_ms": ttft[0] * 1e3,
                "ttft_p99_ms": ttft[1] * 1e3,
                "latency_p50_ms": lat[0] * 1e3,
                "latency_p99_ms": lat[1] * 1e3,
            }
        )
    return rows


def roll(replicas: list[Replica], python_b: str, lb: HAProxy, log: Any = print) -> list[dict[str, Any]]:
    """Upgrade the replicas one at a time: drain (SIGTERM: the balancer's next check takes it out, requests
    it refuses with 503 are retried elsewhere, running ones finish), wait for the exit, restart on
    `python_b`, wait until it is ready and the balancer has put it back, then the next. One row per replica."""
    events = []
    for r in replicas:
        t0 = time.monotonic()
        status = r.drain()
        drained = time.monotonic() - t0
        r.python = python_b
        r.start()
        ready = r.wait_ready()
        back = lb.wait_in_rotation(r.port)
        events.append(
            {"port": r.port, "exit": status, "drain_s": drained, "ready_s": ready, "back_s": back, "torch": r.torch()}
        )
        log(f"  replica :{r.port}: drained in {drained:.1f} s (exit {status}), ready on B in {ready:.1f} s")
    return events


def keel_files_digest(python: str) -> dict[str, str]:
    """sha256 of every file of the installed keel distribution in the environment of `python`."""
    code = (
        "import hashlib, json, importlib.metadata as m\n"
        "d = m.distribution('keel')\n"
        "print(json.dumps({str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest() for f in d.files\n"
        "                  if f.parts[0] == 'keel' and f.locate().is_file()}))\n"
    )
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, cwd="/")
    return dict(json.loads(out.stdout))


def torch_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], check=True, capture_output=True, text=True, cwd="/"
    )
    return out.stdout.strip()


def make_env_b(a: Path, b: Path, torch_b: str, log: Any = print) -> None:
    """B = a copy of environment A in which only torch is replaced (reused when it already has torch_b)."""
    if not (b / "bin" / "python").exists():
        log(f"== copying {a} -> {b}")
        shutil.copytree(a, b, symlinks=True)
    if torch_version(str(b / "bin" / "python")).split("+")[0] != torch_b:
        log(f"== installing torch=={torch_b} into {b} (keel untouched)")
        subprocess.run([str(b / "bin" / "python"), "-m", "pip", "install", "-q", f"torch=={torch_b}"], check=True)
