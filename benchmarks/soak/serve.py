"""Soak `keel serve`: a timed mix of good, aborted and bad requests, while its memory, fds and KV cache are sampled.

Record: docs/measurements/2026-12-01-soak.md.

    HF_HUB_OFFLINE=1 python benchmarks/soak/serve.py --duration 600 --json soak.json   # the demo model, bf16
    python benchmarks/soak/serve.py --url http://127.0.0.1:8000 --pid 1234 ...          # a server already running

The traffic (benchmarks/soak/traffic.py): chat and completions, streaming or not, n > 1, client aborts
(mid-stream hang-ups, client timeouts), malformed JSON, unknown fields, prompts over the context,
oversized bodies (declared and chunked), n beyond what the server admits, an unknown model, long
prompts (up to --long-tokens, or the whole context with 0) on a KV cache too small to hold several of
them (preemption), and every --burst-every seconds a burst of --max-num-seqs + --max-waiting
+ --burst-extra requests at once (503s expected). Every second: the server's RSS, open fds and threads
(/proc/<pid>) and /metrics (KV blocks used, running, waiting). Goals (exit 1 if one fails): every request
ends in an allowed outcome (no 500, no dropped connection, no hang), the KV cache and the running batch
are empty once idle, the fds are back to their start, RSS grows < --max-rss-growth from the end of
warm-up to the end, no traceback in the server's log, and the soak exercised what it claims
(preemption, 503s, client aborts, 4xx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from keel_dev.server import start_server
from report import print_summary, summarize  # benchmarks/soak/report.py (this script's folder is on sys.path)
from traffic import Outcome, Target, Traffic, calibrate

GAUGES = ("keel_kv_cache_blocks_used", "vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--url",
        help="drive a running server instead of starting `keel serve` (pass its --max-num-seqs, --max-waiting "
        "and --max-body-bytes too: the bursts and the bad bodies are sized from them)",
    )
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for RSS and fds")
    p.add_argument("--model", default=None, help="--model of the started server (default: keel's demo model)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the RSS baseline is taken")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending back to back")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--kv-cache-gib",
        type=float,
        default=0.022,
        help="small, so long prompts preempt each other (default: 64 blocks of 16 tokens of the demo model)",
    )
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024)
    p.add_argument(
        "--long-tokens",
        type=int,
        default=512,
        help="long prompts take 60-100%% of this many tokens, capped by the context less the answer (0: the "
        "context); the default keeps the demo model's prefill short on a CPU",
    )
    p.add_argument("--max-new", type=int, default=32, help="new tokens of an ordinary request at most")
    p.add_argument("--burst-every", type=float, default=60.0)
    p.add_argument("--burst-extra", type=int, default=8, help="burst size beyond max-num-seqs + max-waiting")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds after which a request counts as hung")
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--max-rss-growth", type=float, default=0.05)
    p.add_argument("--fd-slack", type=int, default=8, help="fds the idle server may hold beyond its start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the samples, outcomes and goals here")
    return p.parse_args(argv)


def server_args(args: argparse.Namespace) -> list[str]:
    """The `keel serve` options of this soak (the port is keel_dev.server's)."""
    cmd = ["--served-model-name", "soak", "--dtype", args.dtype, "--log-level", "warning"]
    cmd += ["--block-size", str(args.block_size), "--max-num-seqs", str(args.max_num_seqs)]
    cmd += ["--max-waiting", str(args.max_waiting), "--kv-cache-gib", repr(args.kv_cache_gib)]
    cmd += ["--max-body-bytes", str(args.max_body_bytes)]
    return cmd + (["--model", args.model] if args.model else [])


def proc_stats(pid: int | None) -> dict[str, int]:
    """RSS and its peak (kB), threads and open fds of `pid`, from /proc."""
    if pid is None:
        return {}
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key.lower()] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def fd_kinds(pid: int | None) -> dict[str, int]:
    """What the open fds of `pid` are (sockets, pipes, files), counted by kind."""
    if pid is None:
        return {}
    kinds: Counter = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[link.split(":")[0] if ":" in link else "file"] += 1
    return dict(kinds)


def metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
    """/metrics as `name` -> value (unlabelled beyond the model; histograms and labelled series dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=timeout).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if set(sample.labels) <= {"model_name", "engine"}:
                out[sample.name] = sample.value
    return out


class Soak:
    """The traffic, the sampler and the bursts of one soak run."""

    def __init__(self, args: argparse.Namespace, url: str, pid: int | None) -> None:
        self.args, self.url, self.pid = args, url, pid
        self.rng = random.Random(args.seed)
        self.outcomes: list[Outcome] = []
        self.samples: list[dict[str, Any]] = []
        self.bursts: list[dict[str, int]] = []
        self.in_flight = 0
        self.t0 = 0.0

    async def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 2), "in_flight": self.in_flight}
        row["load1"] = os.getloadavg()[0]
        row.update(proc_stats(self.pid))
        try:
            m = await asyncio.to_thread(metrics, self.url)
            row.update({k.removeprefix("keel_"): m[k] for k in (*GAUGES, "vllm:num_preemptions_total")})
        except OSError as exc:
            row["metrics_error"] = f"{type(exc).__name__}: {exc}"
        return row

    async def sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await self.sample())
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass

    async def run_one(self, traffic: Traffic, kind: str) -> Outcome:
        self.in_flight += 1
        try:
            out = await traffic.one(kind)
        finally:
            self.in_flight -= 1
        self.outcomes.append(out)
        return out

    async def worker(self, traffic: Traffic, end: float) -> None:
        while time.monotonic() < end:
            out = await self.run_one(traffic, traffic.pick())
            if out.outcome == "503":  # told to retry later: back off as a client should, not spin
                await asyncio.sleep(self.rng.uniform(0.1, 0.5))

    async def burster(self, traffic: Traffic, end: float) -> None:
        size = self.args.max_num_seqs + self.args.max_waiting + self.args.burst_extra
        at = time.monotonic() + min(self.args.warmup / 2, self.args.burst_every)
        while at < end:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            outs = await asyncio.gather(*(self.run_one(traffic, "burst") for _ in range(size)))
            self.bursts.append({"t": round(at - self.t0), "size": size, **Counter(o.outcome for o in outs)})
            at += self.args.burst_every

    async def wait_idle(self) -> dict[str, Any]:
        """Sample until the KV cache, the running batch and the waiting queue are empty (or the timeout)."""
        deadline = time.monotonic() + self.args.idle_timeout
        while True:
            row = await self.sample()
            idle = all(row.get(g.removeprefix("keel_"), 1) == 0 for g in GAUGES)
            if idle or time.monotonic() > deadline:
                row["idle"], row["idle_after_s"] = idle, round(time.monotonic() - self.t_stop, 2)
                return row
            await asyncio.sleep(0.25)

    async def run(self) -> dict[str, Any]:
        a = self.args
        models = json.loads(urllib.request.urlopen(self.url + "/v1/models", timeout=30).read())["data"][0]
        bound = a.max_num_seqs + a.max_waiting
        target = Target(self.url, models["id"], models["max_model_len"], a.max_body_bytes, bound, a.deadline, a.max_new)
        target.long_tokens = a.long_tokens or target.max_model_len
        self.t0 = time.monotonic()
        start = await self.sample()  # before this client opened any connection
        start["fd_kinds"] = fd_kinds(self.pid)
        target.open(a.concurrency + a.max_num_seqs + a.max_waiting + a.burst_extra + 4)
        await calibrate(target)
        traffic = Traffic(target, self.rng)
        before = await asyncio.to_thread(metrics, self.url)
        target.kv_tokens = int(before["keel_kv_cache_blocks_total"]) * a.block_size
        end = self.t0 + a.duration
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(self.sampler(stop))
        await asyncio.gather(self.burster(traffic, end), *(self.worker(traffic, end) for _ in range(a.concurrency)))
        self.t_stop = time.monotonic()
        await target.close()
        stop.set()
        await sampler
        idle = await self.wait_idle()
        for _ in range(40):  # closed connections leave the server's fd table shortly after
            if self.pid is None or idle.get("fds", 0) <= start.get("fds", 0):
                break
            await asyncio.sleep(0.25)
            idle.update(proc_stats(self.pid))
        idle["fd_kinds"] = fd_kinds(self.pid)
        after = await asyncio.to_thread(metrics, self.url)
        return {"target": {"model": target.model, "max_model_len": target.max_model_len}, "start": start,
                "idle": idle, "before": before, "after": after}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One soak: start (or attach to) the server, drive it, stop it; the summary (figures and goals)."""
    server = None
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid
    else:
        log_path = Path(tempfile.mkdtemp(prefix="keel-soak-")) / "serve.log"
        server = start_server(server_args(args), output=log_path)
        url, pid = server.base_url, server.proc.pid
    try:
        soak = Soak(args, url, pid)
        state = asyncio.run(soak.run())
    finally:
        code = server.stop() if server is not None else None
    log_text = server.output() if server is not None else ""
    result = summarize(soak, state, log_text)
    result["figures"]["server_exit_code"] = code
    if server is not None:
        result["goals"]["the server stopped cleanly on SIGINT"] = code == 0
    result["args"], result["samples"] = vars(args), soak.samples
    result["server_log_tail"] = log_text[-4000:]
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
