"""A decode step's projection calls, replayed at 1 and 2 threads: how much of a token's projection time the
second core takes off, per weight shape, with the engine's own weights and arguments.

    python benchmarks/decode_calls.py                        # SmolLM2-135M, bf16 and fp8, threads 1 2
    python benchmarks/decode_calls.py --quantization fp8 --rounds 6
    python benchmarks/decode_calls.py --model DIR --threads 1 2 4

The engine (batch 1, prefix caching off) loads the model, places its weights as it runs them (keel's linear or
FP8 policy, huge pages) and prefills a prompt of --prompt-tokens token ids; one decode step's projections are then
the four of every layer (qkv, o, gate/up, down, in model order, with the weights the fused layer ops take:
`keel.layers.linear.projection`) and the lm_head, each with one row of x in the activations' dtype. Each is called
through keel's own op (keel::linear or keel::fp8_linear: the code the fused step runs it with), replayed in model
order, --reps times per round, each call timed on its own (Python call included), with torch's thread count set to
each of --threads in turn, alternated for --rounds rounds. Printed per round and thread count: the median
microseconds of a call per weight shape and their sum over one step's calls (ms per token); then, per thread count,
the median over rounds and its speedup over the first count.

Replayed back to back, a call meets weights that are not in cache (a step's weights are far bigger than the
last-level cache) but none of the step's other work between calls: the figures are the projections' share of
a token, without the attention, norms and Python of the step around them. A call's fixed cost (the Python
call, the dispatcher, the op's set-up, the thread pool's hand-off) does not shrink with more threads, so a
fast kernel (FP8, half the bytes of bf16) gains less from a second core than a slow one: compare the speedup
columns of the two dtypes. The machine is shared: read the ratios of one run.

Records: docs/measurements/2026-12-03-two-threads.md, docs/measurements/2026-12-03-decode-floor.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from keel_dev.smollm2 import bf16_checkpoint
from keel_dev.timing import cpu_name

Call = tuple[Callable[..., torch.Tensor], tuple, dict]


def record_step(model: str, quantization: str, prompt_tokens: int) -> list[Call]:
    """The projection calls of one decode step of `model` (batch 1), with their arguments."""
    from keel import LLM, SamplingParams
    from keel.layers.linear import projection
    from keel.ops.layer import project

    llm = LLM(model, dtype="bfloat16", device="cpu", quantization=quantization, progress=False,
              enable_prefix_caching=False)  # fmt: skip
    vocab = llm.llm_engine.config.vocab_size
    llm.generate([[(7 * i + 11) % vocab for i in range(prompt_tokens)]], SamplingParams(max_tokens=2, ignore_eos=True))
    runner = llm.llm_engine.runner
    modules = []
    for layer in runner.model.model.layers:
        modules += [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
    calls: list[Call] = []
    for module in [*modules, runner.model.lm_head]:
        p = projection(module)
        if callable(p):
            raise SystemExit(f"decode_calls: {type(module).__name__} is not a projection keel's fused step takes")
        x = torch.randn(1, p[0].shape[1]).to(runner.dtype)
        calls.append((project, (x, p), {}))
    return calls


def weight_shape(call: Call) -> tuple[int, ...]:
    return tuple(call[1][1][0].shape)


def replay(calls: list[Call], reps: int) -> tuple[dict[tuple[int, ...], float], float]:
    """Median seconds of a call per weight shape over `reps` replays, and their sum over the step's calls."""
    shapes = [weight_shape(c) for c in calls]
    times: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for _ in range(reps):
        for (fn, args, kwargs), shape in zip(calls, shapes, strict=True):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            t1 = time.perf_counter()  # (read before the bookkeeping below, which is not the call's)
            times[shape].append(t1 - t0)
    med = {shape: statistics.median(ts) for shape, ts in times.items()}
    return med, sum(med[shape] for shape in shapes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a Hugging Face checkpoint folder (default: SmolLM2 converted)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "keel-decode-calls")
    p.add_argument("--quantization", nargs="+", default=["none", "fp8"], choices=["none", "fp8"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=20, help="replays of the step's calls per round and thread count")
    p.add_argument("--prompt-tokens", type=int, default=64)
    args = p.parse_args()
    for name in ("rounds", "reps", "prompt_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(t < 1 for t in args.threads):
        p.error(f"--threads must all be >= 1, got {args.threads}")
    model = args.model or str(bf16_checkpoint(args.workdir))
    cpu = cpu_name()
    print(f"CPU: {cpu}; torch {torch.__version__}; model {model}; {args.reps} replays per round, {args.rounds} rounds")
    for quant in args.quantization:
        try:
            calls = record_step(model, quant, args.prompt_tokens)
        except FileNotFoundError as exc:  # keel's model-not-found error (a folder that is not there)
            p.error(str(exc))
        shapes = list(dict.fromkeys(weight_shape(c) for c in calls))
        rows = sorted({x.numel() // x.shape[-1] for _, (x, _), _ in calls})  # rows of x per call
        print(f"\n== {quant}: {len(calls)} calls per step, rows of x per call {rows}; median us per call by weight "
              "shape, ms per token")  # fmt: skip
        print("| round | threads | " + " | ".join(str(list(s)) for s in shapes) + " | ms per token |")
        print("|---|---:|" + "---:|" * (len(shapes) + 1))
        per_token: dict[int, list[float]] = defaultdict(list)
        for r in range(args.rounds):
            order = args.threads if r % 2 == 0 else args.threads[::-1]
            for t in order:
                torch.set_num_threads(t)
                med, total = replay(calls, args.reps)
                per_token[t].append(total)
                cells = " | ".join(f"{med[s] * 1e6:.1f}" for s in shapes)
                print(f"| {r} | {t} | {cells} | {total * 1e3:.2f} |")
        first = statistics.median(per_token[args.threads[0]])
        for t in args.threads:
            m = statistics.median(per_token[t])
            print(f"{quant}, {t} thread(s): median {m * 1e3:.2f} ms per token, {first / m:.2f}x the {args.threads[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
