"""Benchmark `keel serve` over loopback against the offline `LLM.generate` on the same prompts, same run.

Records:
    docs/measurements/2026-12-01-serving.md
    docs/measurements/2026-12-01-logprob-schema-cost.md
    docs/measurements/2026-12-02-serving-load.md

    HF_HUB_OFFLINE=1 python benchmarks/serve.py                       # keel's demo model, bf16
    HF_HUB_OFFLINE=1 python benchmarks/serve.py --clients 1 8 --repeats 3
    HF_HUB_OFFLINE=1 python benchmarks/serve.py --skip-throughput --skip-prefix --logprobs 5 --json-schema
    HF_HUB_OFFLINE=1 python benchmarks/serve.py --clients 1 8 --requests-per-client 4 --new-tokens 64 \
        --temperature 1.0 --skip-prefix --baseline /tmp/main-export   # guidellm's load, before / after

Throughput: N concurrent streaming clients (default 1, 8, 32), each sending --requests-per-client prompts
of benchmarks/generate.py one after the other (random token ids, --prompt-len tokens, --new-tokens
output tokens with ignore_eos, --temperature: 0 greedy, 1.0 what guidellm's requests get, as they name
none) to /v1/completions; output tokens/s = all output tokens / wall time from the first send to the
last token. Offline: `LLM.generate` of the same N prompts in this process (the server runs in its own
process, `keel serve`, started by this script). Measurements alternate offline / server and the best of
--repeats is kept (shared CPUs are noisy); TTFT and inter-token latency come from the best server run.
CPU seconds per 1k output tokens (the server process's, from /proc; the offline process's) is the figure
that an oversubscribed machine distorts least. The server's CPU is also split by thread (Linux): `engine`
(the engine thread and its OpenMP workers, OS name keel-engine), `loop` (the main thread: the event loop,
HTTP, SSE) and `other` (tokenizer and grammar workers), in cores busy (CPU s / wall s).

--baseline SRC also starts a server from the source tree SRC (its PYTHONPATH, e.g. an export of main with
its native libraries) and alternates it with this checkout's server in the same run: the second table is
this checkout's figures over the baseline's.

Prefix caching: a chat of about --chat-tokens tokens (system + user turn), one answer, then a second user
turn; the second turn's time to first token on a server with prefix caching against one started with
--no-prefix-caching (fresh conversation per repeat, median of --repeats).

Request features (--logprobs K, --json-schema): --feature-clients concurrent clients (default 8) against
one server, alternating plain requests, requests with `logprobs: K`, and requests constrained by a JSON
schema (`response_format` json_schema, the grammar engine), --repeats times; output tokens/s and the
server's CPU seconds per 1k output tokens (best run of each), and their ratio to plain requests. Schema
requests stop when the JSON is complete (no ignore_eos), so their rate is per token actually produced.

OMP_WAIT_POLICY defaults to PASSIVE here (for this process and the server): on an oversubscribed machine,
OpenMP's spinning worker threads made the offline loop on the main thread up to 10x slower than the same
loop on another thread (the server's engine thread), which would skew the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see above)
import keel_dev.server  # noqa: E402
from generate import prompts_for  # noqa: E402  (the same prompts as benchmarks/generate.py, this folder)
from keel_dev import keel_source  # noqa: E402
from keel_dev.server import Server  # noqa: E402

WORDS = (
    "cache block token prompt batch decode prefill server client stream kernel wheel torch stable "
    "engine request latency throughput attention layer model"
).split()


@dataclass
class Timing:
    """One streamed request as the client saw it."""

    sent_s: float
    token_s: list[float] = field(default_factory=list)  # arrival of each event that carried text
    usage: dict | None = None
    text: str = ""
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.sent_s

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:], strict=False)]


async def stream(port: int, path: str, body: dict) -> Timing:
    """POST `body` with stream=true over a raw loopback connection; timestamps of the text events.

    A minimal HTTP/1.1 + SSE reader, so the client costs the shared CPUs as little as possible."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    t = Timing(time.perf_counter())
    writer.write(head + data)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"server answered {status!r}: {await reader.read(2000)!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    buf = b""
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            break
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        now = time.perf_counter()
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                continue
            msg = json.loads(payload)
            if msg.get("usage"):
                t.usage = msg["usage"]
            for c in msg.get("choices", []):
                t.finish_reason = c.get("finish_reason") or t.finish_reason
                piece = c.get("text") or (c.get("delta") or {}).get("content")
                if piece:
                    t.token_s.append(now)
                    t.text += piece
    writer.close()
    return t


def start_server(args: argparse.Namespace, *extra: str, source: str | None = None) -> tuple[Server, int]:
    """`keel serve` of --model and --dtype (its output on this console), from the source tree `source` (its
    PYTHONPATH) when given; the server and its port."""
    env = None if source is None else {**os.environ, "PYTHONPATH": keel_source(source)}
    server = keel_dev.server.start_server(
        ["--model", args.model, "--dtype", args.dtype, "--served-model-name", "m", "--log-level", "warning", *extra],
        timeout_s=600,
        output="inherit",
        env=env,
    )
    return server, server.port


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a `keel serve` process by thread group: engine (OS name keel-engine: the engine thread
    and the OpenMP workers it started), loop (the main thread), other (Linux /proc; {} elsewhere)."""
    out = {"engine": 0.0, "loop": 0.0, "other": 0.0}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        group = "loop" if task.name == str(pid) else "engine" if name == "keel-engine" else "other"
        out[group] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


# what --json-schema asks for: a record with a list, so the output has room to be long
BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
    },
    "required": ["title", "tags", "count"],
}


def server_run(
    port: int,
    prompts: list[list[int]],
    new_tokens: int,
    pid: int | None = None,
    extra: dict | None = None,
    clients: int | None = None,
    temperature: float = 0.0,
) -> dict:
    """`clients` concurrent streams (default: one per prompt), each sending its next prompt when its last
    one is done, until every prompt is sent."""
    exact = not (extra and "response_format" in extra)  # a schema ends the output when the JSON is complete
    body = {"model": "m", "max_tokens": new_tokens, "temperature": temperature, "ignore_eos": exact, **(extra or {})}

    async def client(todo: list[list[int]], timings: list[Timing]) -> None:
        while todo:
            prompt = todo.pop(0)
            timings.append(await stream(port, "/v1/completions", {**body, "prompt": prompt}))

    async def run() -> tuple[float, list[Timing]]:
        t0 = time.perf_counter()
        todo, timings = list(prompts), []
        await asyncio.gather(*(client(todo, timings) for _ in range(clients or len(prompts))))
        return time.perf_counter() - t0, timings

    cpu0 = process_cpu_s(pid) if pid else 0.0
    threads0 = thread_cpu_s(pid) if pid else {}
    wall, timings = asyncio.run(run())
    cpu = process_cpu_s(pid) - cpu0 if pid else float("nan")
    threads1 = thread_cpu_s(pid) if pid else {}
    tokens = sum(t.usage["completion_tokens"] for t in timings)
    assert tokens == len(prompts) * new_tokens or not exact, tokens
    if not exact:
        import jsonschema

        for t in timings:  # the constraint held (else the figure is void); a length-cut output is a prefix
            if t.finish_reason == "stop":
                jsonschema.validate(json.loads(t.text), BENCH_SCHEMA)
    gaps = [g for t in timings for g in t.gaps()]
    return {
        "tok_s": tokens / wall,
        "tokens": tokens,
        "ttft": [t.ttft_s for t in timings],
        "itl": gaps,
        "cpu_per_ktok": 1e3 * cpu / tokens,
        "cores": {k: (threads1[k] - threads0.get(k, 0.0)) / wall for k in threads1},
    }


def cores_text(run: dict) -> str:
    """A server run's cores busy by thread group, e.g. 'engine 1.10 loop 0.05 other 0.00'."""
    return " ".join(f"{k} {v:.2f}" for k, v in run.get("cores", {}).items()) or "n/a"


def offline_run(llm, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0) -> dict:
    from keel.engine import SamplingParams

    t0, cpu0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=temperature))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tok_s": tokens / wall, "ttft": [o.ttft_s for o in outs], "cpu_per_ktok": 1e3 * cpu / tokens}


def conversation(seed: int, tokens: int) -> list[dict]:
    rng = random.Random(seed)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens))  # about one token per word
    return [
        {"role": "system", "content": f"You are a helpful assistant. Notes {seed}: {words}"},
        {"role": "user", "content": "Summarise the notes in one sentence."},
    ]


def second_turn_ttft(port: int, seed: int, chat_tokens: int) -> tuple[float, int, int]:
    """(TTFT of turn 2, its prompt tokens, of which cached) for a fresh conversation."""

    async def run() -> tuple[float, int, int]:
        msgs = conversation(seed, chat_tokens)
        body = {"model": "m", "max_tokens": 16, "temperature": 0}
        first = await stream(port, "/v1/chat/completions", {**body, "messages": msgs})
        msgs = msgs + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And in three words?"}]
        t = await stream(port, "/v1/chat/completions", {**body, "max_tokens": 4, "messages": msgs})
        usage = t.usage or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return t.ttft_s, usage.get("prompt_tokens", 0), cached

    return asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="repo id or folder (default: keel's demo model)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--chat-tokens", type=int, default=1000)
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-prefix", action="store_true")
    p.add_argument("--logprobs", type=int, default=None, help="also time requests with logprobs: K")
    p.add_argument("--json-schema", action="store_true", help="also time requests constrained by a JSON schema")
    p.add_argument("--feature-clients", type=int, default=8)
    p.add_argument("--requests-per-client", type=int, default=1, help="prompts each client sends in turn")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; 1.0: guidellm's (it sends none)")
    p.add_argument("--baseline", default=None, help="source tree of a second server, alternated with this one")
    args = p.parse_args()
    if args.model is None:
        from keel.hf.resolve import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    import torch

    print(
        f"model {args.model}, dtype {args.dtype}, prompt {args.prompt_len} tokens, {args.new_tokens} new "
        f"tokens (ignore_eos), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}",
        flush=True,
    )
    if not args.skip_throughput:
        throughput(args)
    if args.logprobs is not None or args.json_schema:
        feature_runs(args)
    if not args.skip_prefix:
        results = {}
        for label, extra in (("prefix caching", ()), ("no prefix caching", ("--no-prefix-caching",))):
            server, port = start_server(args, *extra)
            try:
                second_turn_ttft(port, 999, 64)  # warm-up
                results[label] = [second_turn_ttft(port, seed, args.chat_tokens) for seed in range(args.repeats + 1)]
            finally:
                server.stop()
        print(f"\nsecond chat turn, conversation of ~{args.chat_tokens} tokens (median of {args.repeats + 1}):")
        print("| server | turn-2 prompt tokens | cached tokens | turn-2 TTFT ms |\n|---|---:|---:|---:|")
        med = {}
        for label, runs in results.items():
            med[label] = statistics.median(r[0] for r in runs)
            print(f"| {label} | {runs[-1][1]} | {runs[-1][2]} | {1e3 * med[label]:.0f} |")
        print(f"speed-up of turn-2 TTFT with prefix caching: {med['no prefix caching'] / med['prefix caching']:.1f}x")


def throughput(args: argparse.Namespace) -> None:
    """Offline vs server (and --baseline's server) at each --clients, alternating, best of --repeats."""
    from keel.engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, progress=False)
    vocab = llm.config.vocab_size
    llm.generate(prompts_for(1, args.prompt_len, vocab), SamplingParams(max_tokens=8, ignore_eos=True))
    servers = {"server": start_server(args)}
    rows = []
    try:
        if args.baseline:
            servers["baseline"] = start_server(args, source=args.baseline)
        for _server, port in servers.values():
            server_run(port, prompts_for(1, args.prompt_len, vocab), 8)  # warm-up
        for n in args.clients:
            prompts = prompts_for(n * args.requests_per_client, args.prompt_len, vocab)
            best: dict[str, dict] = {}
            for r in range(args.repeats):
                runs = {"offline": offline_run(llm, prompts[:n], args.new_tokens, args.temperature)}
                for label in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    server, port = servers[label]
                    runs[label] = server_run(
                        port, prompts, args.new_tokens, server.proc.pid, clients=n, temperature=args.temperature
                    )
                for label, run in runs.items():
                    if label not in best or run["tok_s"] > best[label]["tok_s"]:
                        best[label] = run
                print(
                    f"  clients {n}: "
                    + ", ".join(
                        f"{label} {run['tok_s']:.1f} tok/s ({run['cpu_per_ktok']:.2f} CPU s per 1k tokens"
                        + (f"; cores {cores_text(run)})" if "cores" in run else ")")
                        for label, run in runs.items()
                    ),
                    flush=True,
                )
            rows.append((n, best))
    finally:
        for server, _port in servers.values():
            server.stop()
    print(
        f"\n{args.requests_per_client} request(s) per client, temperature {args.temperature:g}; best of "
        f"{args.repeats} (offline: one request per client)"
    )
    print(
        "| clients | offline tok/s | server tok/s | server / offline | CPU s / 1k tok offline | server "
        "| TTFT p50 ms | TTFT p99 ms | offline TTFT p50 ms | ITL p50 ms | ITL p99 ms | server cores busy |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, best in rows:
        off, srv = best["offline"], best["server"]
        print(
            f"| {n} | {off['tok_s']:.1f} | {srv['tok_s']:.1f} | {srv['tok_s'] / off['tok_s']:.2f} "
            f"| {off['cpu_per_ktok']:.2f} | {srv['cpu_per_ktok']:.2f} "
            f"| {1e3 * pct(srv['ttft'], 0.5):.0f} | {1e3 * pct(srv['ttft'], 0.99):.0f} "
            f"| {1e3 * pct(off['ttft'], 0.5):.0f} | {1e3 * pct(srv['itl'], 0.5):.1f} "
            f"| {1e3 * pct(srv['itl'], 0.99):.1f} | {cores_text(srv)} |"
        )
    if args.baseline:
        print(f"\nthis checkout over the baseline ({args.baseline}), best run of each:")
        print(
            "| clients | tok/s | baseline | ratio | TTFT p50 ms | baseline | ITL p50 ms | baseline "
            "| CPU s / 1k tok | baseline | cores busy | baseline |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for n, best in rows:
            srv, base = best["server"], best["baseline"]
            print(
                f"| {n} | {srv['tok_s']:.1f} | {base['tok_s']:.1f} | {srv['tok_s'] / base['tok_s']:.2f} "
                f"| {1e3 * pct(srv['ttft'], 0.5):.0f} | {1e3 * pct(base['ttft'], 0.5):.0f} "
                f"| {1e3 * pct(srv['itl'], 0.5):.1f} | {1e3 * pct(base['itl'], 0.5):.1f} "
                f"| {srv['cpu_per_ktok']:.2f} | {base['cpu_per_ktok']:.2f} | {cores_text(srv)} | {cores_text(base)} |"
            )


def feature_runs(args: argparse.Namespace) -> None:
    """Plain vs logprobs vs JSON-schema requests on one server, alternating, best of --repeats each."""
    from keel.hf.config import read_config_json
    from keel.hf.resolve import resolve_model

    size = read_config_json(resolve_model(args.model, None) / "config.json")["vocab_size"]
    variants: list[tuple[str, dict]] = [("plain", {})]
    if args.logprobs is not None:
        variants.append((f"logprobs {args.logprobs}", {"logprobs": args.logprobs}))
    if args.json_schema:
        schema = {"type": "json_schema", "json_schema": {"name": "record", "schema": BENCH_SCHEMA}}
        variants.append(("json schema", {"response_format": schema}))
    n = args.feature_clients
    prompts = prompts_for(n, args.prompt_len, size)
    server, port = start_server(args)
    best: dict[str, dict] = {}
    cpu_runs: dict[str, list[float]] = {}  # CPU s per 1k tokens of every run: the median is the steadier figure
    try:
        for _label, extra in variants:  # warm-up (compiles the schema's grammar once: cached afterwards)
            server_run(port, prompts[:1], 8, None, extra)
        for r in range(args.repeats):
            for label, extra in variants if r % 2 == 0 else variants[::-1]:
                run = server_run(port, prompts, args.new_tokens, server.proc.pid, extra)
                print(
                    f"  {label}: {run['tok_s']:.1f} tok/s, {run['cpu_per_ktok']:.2f} CPU s per 1k tokens "
                    f"({run['tokens']} tokens)",
                    flush=True,
                )
                cpu_runs.setdefault(label, []).append(run["cpu_per_ktok"])
                if label not in best or run["tok_s"] > best[label]["tok_s"]:
                    best[label] = run
    finally:
        server.stop()
    plain = best["plain"]
    med = {label: statistics.median(v) for label, v in cpu_runs.items()}
    print(
        f"\nrequest features, {n} clients, {args.new_tokens} max new tokens (tok/s: best of {args.repeats}; "
        f"CPU s per 1k tokens: median of {args.repeats}):"
    )
    print(
        "| requests | output tokens | server tok/s | vs plain | CPU s / 1k tok | vs plain |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    for label, _ in variants:
        b = best[label]
        print(
            f"| {label} | {b['tokens']} | {b['tok_s']:.1f} | {b['tok_s'] / plain['tok_s']:.2f} "
            f"| {med[label]:.2f} | {med[label] / med['plain']:.2f} |"
        )


if __name__ == "__main__":
    main()
