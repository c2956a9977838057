"""What hostile clients do to everyone else on `keel serve`: each attack's effect on a well-behaved client,
against a baseline measured on the same server just before.

Starts `keel serve` itself (serve.Server: loopback, no API key, so that each connection is a client of its own
to the engine's per-client shares; --trust-request-chat-template) and, per scenario, measures the victim's
figure alone, then again while the attack runs:

- grammars: the 30-pattern `allOf` schema and the same behind `$ref`s (status, seconds, peak RSS of the
  server process and of its process tree); eight slow compiles, then a small grammar (its status, seconds);
- tokenizer floods: three clients looping 1 MB prompts on /tokenize and /v1/completions (/health latency
  p50 / p99 / max; a concurrent stream's first token and largest gap between tokens);
- bad_words at the bound (n=16, 128 words of 128 digits) and past it (1,000 words of 1,000 digits), long
  prompts, `n` with prompt logprobs, clients holding every slot, queued long prefills (the stream's gaps, or
  a short request's latency);
- request chat templates that run until killed (/tokenize latency).

    python benchmarks/probe/untrusted.py --model PATH [--quick] [--json OUT] [-- keel serve args]
    python benchmarks/probe/untrusted.py --model PATH --offline

`--offline` starts no server: it times llguidance's phases on the n-pattern schema (which phase grows,
and that its parser limits do not bound it) and how long `tokenizers` holds the GIL per call.

`--quick` shortens every window (what tests/entrypoints/test_probe.py runs on a tiny checkpoint). Prints a
table: scenario, measure, baseline, during, goal, met.

Records: docs/measurements/2026-12-07-hostile-probe.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serve import HOST, KEY, MODEL, Server, patterns_schema, request, schema_cmpl

MB_DIGITS = "7" * 1_000_000


@dataclass
class Row:
    scenario: str
    measure: str
    baseline: float | str
    during: float | str
    goal: str
    met: bool | None  # None: no goal (a figure recorded for the record)


def tree_rss_mib(pid: int) -> tuple[float, float]:
    """(RSS of `pid`, RSS of it and every descendant) in MiB, from /proc."""

    def rss(p: int) -> float:
        try:
            with open(f"/proc/{p}/status") as f:
                return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return 0.0

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        total += rss(p)
        stack += children.get(p, [])
    return rss(pid), total


@contextmanager
def peak_rss(srv: Server) -> Iterator[dict[str, float]]:
    """Sample the server's RSS (alone and with its workers) every 0.1 s; the peaks land in the dict."""
    peaks = {"server": 0.0, "tree": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            own, tree = tree_rss_mib(srv.proc.pid)  # type: ignore[union-attr]
            peaks["server"], peaks["tree"] = max(peaks["server"], own), max(peaks["tree"], tree)
            stop.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield peaks
    finally:
        stop.set()
        t.join(5)


@contextmanager
def attack(srv: Server, clients: int, send: Callable[[Server], Any]) -> Iterator[list[int]]:
    """`clients` threads calling `send` in a loop until the block ends; yields the statuses they got."""
    stop, statuses = threading.Event(), []

    def loop() -> None:
        while not stop.is_set():
            try:
                statuses.append(send(srv)[0])
            except OSError:
                statuses.append(-1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the attack is under way before anything is measured
    try:
        yield statuses
    finally:
        stop.set()
        for t in threads:
            t.join(120)


def health_latencies(srv: Server, seconds: float) -> list[float]:
    """/health every 50 ms for `seconds`, measured from a process of its own (the attack's client threads
    share this one's GIL)."""
    return list(victim(srv, "health", seconds))


def _health(port: int, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn = http.client.HTTPConnection(HOST, port, timeout=60)
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        out.append(time.perf_counter() - t0)
        conn.close()
        time.sleep(0.05)
    return out


def victim(srv: Server, kind: str, arg: float) -> Any:
    """Run a victim measurement (`--victim KIND`) in a child process and return what it printed (JSON)."""
    cmd = [sys.executable, __file__, "--victim", kind, "--port", str(srv.port), "--arg", str(arg), "--model", "-"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"victim {kind} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def stream(srv: Server, max_tokens: int = 24) -> tuple[float, float]:
    """One streamed completion, from a process of its own: (seconds to its first token, largest gap)."""
    ttft, gap = victim(srv, "stream", max_tokens)
    return float(ttft), float(gap)


def _stream(port: int, max_tokens: int) -> tuple[float, float]:
    body = json.dumps(
        {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    )
    conn = http.client.HTTPConnection(HOST, port, timeout=300)
    t0 = time.perf_counter()
    conn.request(
        "POST", "/v1/completions", body, {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    )
    resp = conn.getresponse()
    times: list[float] = []
    for line in resp:
        if line.startswith(b"data: {") and b'"error"' not in line:
            times.append(time.perf_counter())
    conn.close()
    if resp.status != 200 or not times:
        return float("nan"), float("nan")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return times[0] - t0, max(gaps, default=0.0)


def timed(srv: Server, path: str, body: Any) -> tuple[int, float]:
    t0 = time.perf_counter()
    status = request(srv, "POST", path, body, timeout=300)[0]
    return status, time.perf_counter() - t0


def cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **extra}


def grammar_rows(srv: Server, quick: bool) -> list[Row]:
    rows: list[Row] = []
    base_own, base_tree = tree_rss_mib(srv.proc.pid)  # type: ignore[union-attr]
    for name, schema in (
        ("allOf of 30 patterns", patterns_schema(30)),
        ("30 patterns behind $ref", patterns_schema(30, True)),
    ):
        with peak_rss(srv) as peaks:
            status, took = timed(srv, "/v1/completions", schema_cmpl(schema))
        rows.append(Row(name, "status, seconds", "", f"{status}, {took:.1f}", "4xx", 400 <= status < 500))
        rows.append(
            Row(
                name,
                "server RSS MiB (peak)",
                round(base_own),
                round(peaks["server"]),
                "< before + 256",
                peaks["server"] < base_own + 256,
            )
        )
        rows.append(Row(name, "process tree RSS MiB (peak)", round(base_tree), round(peaks["tree"]), "", None))
    slow = schema_cmpl(patterns_schema(18, True))
    threads = [threading.Thread(target=timed, args=(srv, "/v1/completions", slow)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    small = cmpl(max_tokens=3, guided_choice=["yes", "no"])
    status, took = timed(srv, "/v1/completions", small)
    rows.append(
        Row("small grammar after eight slow ones", "status, seconds", "", f"{status}, {took:.1f}", "200", status == 200)
    )
    return rows


def flood_rows(srv: Server, quick: bool) -> list[Row]:
    window = 3.0 if quick else 20.0
    base = health_latencies(srv, window / 2)
    base_ttft, base_gap = stream(srv)

    def flood(s: Server, n: list[int] = [0]) -> tuple[int, Any]:  # noqa: B006 - a counter shared by the clients
        n[0] += 1
        path, body = ("/tokenize", {"prompt": MB_DIGITS}) if n[0] % 2 else ("/v1/completions", cmpl(prompt=MB_DIGITS))
        return request(s, "POST", path, body, timeout=300)

    with attack(srv, 3, flood) as statuses:
        during = health_latencies(srv, window)
        ttft, gap = stream(srv)
    name = "3 clients: 1 MB prompts on /tokenize and /v1/completions"
    return [
        Row(
            name,
            "/health p50 ms",
            round(1000 * statistics.median(base)),
            round(1000 * statistics.median(during)),
            "",
            None,
        ),
        Row(name, "/health p99 ms", round(1000 * p99(base)), round(1000 * p99(during)), "< 100", p99(during) < 0.1),
        Row(name, "/health max ms", round(1000 * max(base)), round(1000 * max(during)), "", None),
        Row(name, "stream first token s", round(base_ttft, 2), round(ttft, 2), "", None),
        Row(name, "stream largest gap s", round(base_gap, 2), round(gap, 2), "< 2", gap < 2.0),
        Row(
            name, "attack answers 4xx / all", "", f"{sum(400 <= s < 500 for s in statuses)} / {len(statuses)}", "", None
        ),
    ]


def stream_rows(srv: Server, quick: bool) -> list[Row]:
    """The victim stream's gap during each attack (a fresh baseline before each)."""
    attacks: list[tuple[str, int, Callable[[Server], Any]]] = [
        (
            "bad_words at the bound: n=16, 128 words of 128 digits",
            3,
            lambda s: request(
                s,
                "POST",
                "/v1/completions",
                cmpl(n=16, max_tokens=8, bad_words=[str(10**127 + i) for i in range(128)]),
                timeout=300,
            ),
        ),
        (
            "control: the same n=16 requests without bad_words",
            3,
            lambda s: request(s, "POST", "/v1/completions", cmpl(n=16, max_tokens=8), timeout=300),
        ),
        (
            "bad_words past it: n=16, 1,000 words of 1,000 digits",
            3,
            lambda s: request(s, "POST", "/v1/completions", cmpl(n=16, bad_words=["7" * 1000] * 1000), timeout=300),
        ),
        (
            "n=16 with prompt_logprobs=20 on a 1,000-token prompt",
            1,
            lambda s: request(
                s,
                "POST",
                "/v1/completions",
                cmpl(n=16, prompt="7" * 1000, prompt_logprobs=20, max_tokens=1),
                timeout=120,  # then the client gives up: its requests are aborted
            ),
        ),
        (
            "3 clients: 8,000-token prompts",
            3,
            lambda s: request(s, "POST", "/v1/completions", cmpl(prompt="7" * 8000, max_tokens=1), timeout=120),
        ),
    ]
    rows: list[Row] = []
    for name, clients, send in attacks[:3] if quick else attacks:
        _, base_gap = stream(srv)
        with attack(srv, clients, send) as statuses:
            _, gap = stream(srv)
        rows.append(Row(name, "stream largest gap s", round(base_gap, 2), round(gap, 2), "< 2", gap < 2.0))
        rows.append(Row(name, "attack answers (status: count)", "", _counts(statuses), "", None))
    return rows


def _counts(statuses: list[int]) -> str:
    return ", ".join(f"{s}: {statuses.count(s)}" for s in sorted(set(statuses)))


def slot_rows(srv: Server, quick: bool) -> list[Row]:
    """One client holding every slot, and queued long prefills: a short request's latency."""
    short = cmpl(max_tokens=1)
    _, base = timed(srv, "/v1/completions", short)
    hog = cmpl(n=16, max_tokens=64 if quick else 4096, ignore_eos=True)
    with attack(srv, 4, lambda s: request(s, "POST", "/v1/completions", hog, timeout=45)):
        status, during = timed(srv, "/v1/completions", short)
    rows = [
        Row(
            "4 clients: n=16, max_tokens 4096, ignore_eos",
            "max_tokens=1 request s",
            round(base, 2),
            round(during, 2),
            "",
            None,
        )
    ]
    if not quick:
        long = cmpl(prompt="7" * 5500, max_tokens=1)  # 5,500 tokens: digits are one token each in SmolLM2
        with attack(srv, 6, lambda s: request(s, "POST", "/v1/completions", long, timeout=90)):
            ttft, _ = stream(srv, max_tokens=8)
        rows.append(Row("six 5,500-token prompts queued", "8-token stream first token s", "", round(ttft, 2), "", None))
    return rows


def template_rows(srv: Server, quick: bool) -> list[Row]:
    loops = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    slow = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "chat_template": loops, "max_tokens": 1}
    probe = {"model": MODEL, "prompt": "hello there"}
    base = [timed(srv, "/tokenize", probe)[1] for _ in range(5)]
    with attack(srv, 2, lambda s: request(s, "POST", "/v1/chat/completions", slow, timeout=300)):
        during = [timed(srv, "/tokenize", probe)[1] for _ in range(10 if quick else 30)]
    name = "2 clients: request templates that run until killed"
    return [Row(name, "/tokenize max s", round(max(base), 3), round(max(during), 3), "", None)]


PHASES_CODE = """
import json, string, sys, time
import llguidance
from llguidance import LLMatcher
path, n = sys.argv[1], int(sys.argv[2])
tok = llguidance.LLTokenizer(open(path).read(), n_vocab=int(sys.argv[3]), eos_token=None)
schema = {"type": "string", "allOf": [{"pattern": f".*{c}.*"} for c in string.ascii_letters[:n]]}
small = llguidance.LLParserLimits(max_lexer_states=1000, initial_lexer_fuel=10000, step_lexer_fuel=10000)
def status(key):
    return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith(key))
open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here on
base, out = status("VmRSS:"), {}
def timed(name, fn):
    t = time.perf_counter()
    result = fn()
    out[name] = time.perf_counter() - t
    return result
g = timed("schema -> grammar s", lambda: LLMatcher.grammar_from_json_schema(json.dumps(schema)))
timed("validate_grammar s", lambda: LLMatcher.validate_grammar(g, tok))
m = timed("LLMatcher() s", lambda: LLMatcher(tok, g, log_level=0))
timed("first mask s", m.compute_bitmask)
timed("LLMatcher() under small limits s", lambda: LLMatcher(tok, g, log_level=0, limits=small))
out["peak RSS growth MiB"] = (status("VmHWM:") - base) / 1024
print(json.dumps(out))
"""


def phase_rows(model: str) -> list[Row]:
    """Where llguidance spends on an n-pattern allOf schema (each n in a fresh process, without limits)."""
    from keel.hf.config import read_config_json
    from keel.hf.resolve import resolve_model

    folder = resolve_model(model, None)
    vocab = read_config_json(folder / "config.json")["vocab_size"]
    rows: list[Row] = []
    for n in (12, 14, 16, 17):
        cmd = [sys.executable, "-c", PHASES_CODE, str(folder / "tokenizer.json"), str(n), str(vocab)]
        got = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout)
        rows += [
            Row(f"allOf of {n} patterns, no sandbox", k, "", round(v, 4 if v < 1 else 2), "", None)
            for k, v in got.items()
        ]
    return rows


def gil_rows(model: str) -> list[Row]:
    """How long `tokenizers` holds the GIL: the largest gap of a 1 ms ticker thread during each call on 1 MB of
    digits (a call that holds the GIL throughout stops the ticker for its whole length)."""
    from tokenizers import Tokenizer

    from keel.hf.resolve import resolve_model

    tok = Tokenizer.from_file(str(resolve_model(model, None) / "tokenizer.json"))
    ids = tok.encode(MB_DIGITS).ids
    calls: dict[str, Callable[[], Any]] = {
        "encode": lambda: tok.encode(MB_DIGITS),
        "encode_batch": lambda: tok.encode_batch([MB_DIGITS]),
        "decode": lambda: tok.decode(ids),
        "decode_batch": lambda: tok.decode_batch([ids]),
    }
    rows: list[Row] = []
    for name, fn in calls.items():
        gaps: list[float] = [0.0]
        stop = threading.Event()
        t = threading.Thread(target=_tick, args=(stop, gaps))
        t.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        stop.set()
        t.join()
        rows.append(
            Row(
                f"tokenizers {name} of 1 MB of digits",
                "call s / largest ticker gap s",
                "",
                f"{took:.2f} / {max(gaps):.2f}",
                "",
                None,
            )
        )
    return rows


def _tick(stop: threading.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


SCENARIOS: dict[str, Callable[[Server, bool], list[Row]]] = {
    "grammars": grammar_rows,
    "floods": flood_rows,
    "streams": stream_rows,
    "slots": slot_rows,
    "templates": template_rows,
}


def table(rows: list[Row]) -> str:
    out = ["| scenario | measure | baseline | during | goal | met |", "|---|---|---:|---:|---|---|"]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        out.append(f"| {r.scenario} | {r.measure} | {r.baseline} | {r.during} | {r.goal} | {met} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder or GGUF for keel serve --model")
    ap.add_argument("--quick", action="store_true", help="short windows, fewer attacks (the test suite's run)")
    ap.add_argument("--only", action="append", default=[], help="run only scenarios whose name contains this")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument(
        "--offline", action="store_true", help="no server: where llguidance spends on allOf schemas, tokenizers' GIL"
    )
    ap.add_argument("--victim", choices=("health", "stream"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--arg", type=float, help=argparse.SUPPRESS)
    ap.add_argument("serve_args", nargs="*", help="extra keel serve arguments (after --)")
    args = ap.parse_args(argv)
    if args.victim == "health":
        print(json.dumps(_health(args.port, args.arg)))
        return 0
    if args.victim == "stream":
        print(json.dumps(_stream(args.port, int(args.arg))))
        return 0
    if args.offline:
        rows = phase_rows(args.model) + gil_rows(args.model)
        print(
            "\n".join(
                ["| case | measure | value |", "|---|---|---:|"]
                + [f"| {r.scenario} | {r.measure} | {r.during} |" for r in rows]
            )
        )
        return 0
    # keel serve's own admission defaults (the hostile probe's small ones would refuse the victims)
    # no API key: each connection is then a client of its own to the engine's shares, as the victims must be
    srv = Server(args.model, ["--max-num-seqs", "64", "--max-waiting", "256", *args.serve_args], keyed=False)
    srv.start()
    rows: list[Row] = []
    try:
        for name, run in SCENARIOS.items():
            if args.only and not any(o in name for o in args.only):
                continue
            rows += run(srv, args.quick)
            print(f"{name}: done; server alive: {srv.alive()}", file=sys.stderr)
            if not srv.alive():
                break
    finally:
        alive = srv.alive()
        code = srv.stop()
    print(table(rows))
    print(f"\nserver alive at the end: {alive}; SIGTERM exit status: {code}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "alive": alive, "exit": code}, indent=1)
        )
    return 0 if alive and code == 0 and all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
