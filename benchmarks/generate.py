"""Benchmark keel vs transformers `generate`: prefill and decode tokens/s at several batch sizes, peak memory.

Records:
    docs/measurements/2026-12-01-generate-vs-transformers.md
    docs/measurements/2026-12-01-logprob-schema-cost.md
    docs/measurements/2026-12-01-fp8.md
    docs/measurements/2026-12-02-determinism-cost.md
    docs/measurements/2026-12-02-amx-prompt-kernels.md

    python benchmarks/generate.py --dtype bf16    # the default model (keel.hf.resolve.DEFAULT_MODEL)
    python benchmarks/generate.py --random-smollm2 /tmp/smollm2-random   # same shapes, random weights
    python benchmarks/generate.py --tiny ...   # smoke run: 8-token prompts, 4 new tokens, batch 1 and 2, once

    python benchmarks/generate.py --random-smollm2 /tmp/smollm2-random --engines keel --batch-sizes 8 \
        --prompt-len 1024 --new-tokens 64        # decode at batch 8 with ~1k tokens of context
    python benchmarks/generate.py --random-smollm2 /tmp/smollm2-random --second-turn 1024
        # time to first token of a conversation's second turn, keel with vs without prefix caching
    python benchmarks/generate.py --model /tmp/smollm2 --sampling --batch-sizes 8 --new-tokens 64
        # decode cost of logprobs=5 / penalties / a JSON schema against plain requests, same run, alternating
        # (the JSON variant needs a real tokenizer: a converted SmolLM2 folder, not --random-smollm2)
    git archive main | tar -x -C /tmp/keel_main && (cd /tmp/keel_main && python setup.py build_ext --inplace)
    python benchmarks/generate.py ... --engines keel --threads 1 --cpu-time --keel-path /tmp/keel_main
        # another keel checkout, in CPU seconds of one thread (robust on an oversubscribed machine)

keel is the installed one (run it with the interpreter of an environment that has the wheel installed);
the checkout is never put on sys.path, so an unbuilt source tree cannot shadow the wheel.

Each engine runs in its own subprocess so that peak memory (max RSS, or CUDA max allocated) is its own; each
measurement runs --repeats times and the best is kept (shared CPUs are noisy). Decode tokens/s counts the
tokens after the first (the first comes out of prefill). Every keel run gets prompts it has not seen, so
its prefix cache never serves the throughput rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from keel_dev import keel_source
from keel_dev.checkpoints import write_random_llama


def make_random_smollm2(folder: Path) -> None:
    """SmolLM2-135M's shapes (tied embeddings, 8192 positions) with random weights, plus a word-level
    tokenizer (keel_dev.checkpoints.write_random_llama)."""
    if not (folder / "config.json").is_file():
        write_random_llama(folder, seed=0, tied=True, max_position_embeddings=8192)


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prompts_for(batch: int, prompt_len: int, vocab: int, run: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch * 1000 + run)
    return torch.randint(1, vocab, (batch, prompt_len), generator=g).tolist()


def run_second_turn(args: argparse.Namespace) -> dict:
    """Time to first token of turn 2 (turn 1's prompt + reply + a new question) with and without prefix caching."""
    from keel.engine import LLM, SamplingParams

    rows = {}
    for caching in (True, False):
        llm = LLM(args.model, dtype=args.dtype, device=args.device, progress=False, enable_prefix_caching=caching)
        vocab = llm.config.vocab_size
        best = float("inf")
        for run in range(args.repeats + 1):  # run 0 warms up
            turn1 = prompts_for(1, args.second_turn, vocab, 100 + run)[0]
            reply = llm.generate([turn1], SamplingParams(max_tokens=32, ignore_eos=True))[0]
            turn2 = turn1 + reply.token_ids + prompts_for(1, 16, vocab, 200 + run)[0]
            out = llm.generate([turn2], SamplingParams(max_tokens=1, ignore_eos=True))[0]
            if run:
                best = min(best, out.ttft_s)
        rows["on" if caching else "off"] = {"ttft_s": best, "cached_tokens": out.num_cached_tokens}
        del llm
    return rows


SAMPLING_SCHEMA = {  # at least 12 strings: longer than --new-tokens 24, so every variant runs to max_tokens
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 12}},
    "required": ["items"],
}


def sampling_variants() -> dict:
    """The per-request options --sampling compares (every variant samples at temperature 1, seeded)."""
    from keel.engine.sampling_params import StructuredOutputsParams

    return {
        "plain": {},
        "logprobs=5": {"logprobs": 5},
        "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
        "json_schema": {"structured_outputs": StructuredOutputsParams(json=SAMPLING_SCHEMA)},
    }


def run_sampling(args: argparse.Namespace) -> None:
    """Decode tokens/s per variant: the tokens after each request's first over the wall time after the
    prefill step (the batch's largest time to first token), and process CPU tokens/s of the whole call.
    Rounds alternate the variants' order; each ratio to plain is taken within a round, and the median over
    rounds is reported."""
    import statistics

    from keel.engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, device=args.device, progress=False)
    vocab = min(llm.config.vocab_size, llm.tokenizer.vocab_size)
    variants = sampling_variants()
    names = list(variants)
    b = args.batch_sizes[0]

    def params(name: str, seed: int) -> list:
        return [
            SamplingParams(
                max_tokens=args.new_tokens, temperature=1.0, seed=seed + i, ignore_eos=True, **variants[name]
            )
            for i in range(b)
        ]

    for name in names:  # warm-up (and the grammar's first compile)
        llm.generate(prompts_for(b, args.prompt_len, vocab, 1), params(name, 0))
    decode: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    tokens: dict[str, list[int]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            prompts = prompts_for(b, args.prompt_len, vocab, 10 + r)  # the same prompts for every variant
            t0, c0 = time.perf_counter(), time.process_time()
            outs = llm.generate(prompts, params(name, 100 * r))
            t1, c1 = time.perf_counter(), time.process_time()
            n = sum(len(o.token_ids) for o in outs)
            decode[name].append((n - b) / (t1 - t0 - max(o.ttft_s for o in outs)))
            cpu[name].append(n / (c1 - c0))
            tokens[name].append(n)
    print(
        f"model {args.model}, dtype {args.dtype}, batch {b}, prompt {args.prompt_len} tokens, up to "
        f"{args.new_tokens} new tokens, {args.repeats} alternating rounds, torch threads {torch.get_num_threads()}"
    )
    print("| variant | tokens/call | decode tok/s (wall) | vs plain | whole call tok/s (CPU) | vs plain |")
    print("|---|---|---|---|---|---|")
    for name in names:
        rd = statistics.median(d / p for d, p in zip(decode[name], decode["plain"], strict=True))
        rc = statistics.median(c / p for c, p in zip(cpu[name], cpu["plain"], strict=True))
        print(
            f"| {name} | {statistics.median(tokens[name]):.0f} | {statistics.median(decode[name]):.1f} | {rd:.3f} | "
            f"{statistics.median(cpu[name]):.1f} | {rc:.3f} |"
        )


def run_keel(args: argparse.Namespace) -> dict:
    if args.cpu_time:  # the engine's phase timers then count this process's CPU seconds
        time.perf_counter = time.process_time
    from keel.engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, device=args.device, progress=False, quantization=args.quantization)
    vocab = llm.config.vocab_size
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate(prompts_for(1, args.prompt_len, vocab, 1), SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    rows = {}
    for b in args.batch_sizes:
        llm.generate(prompts_for(b, args.prompt_len, vocab, 2), SamplingParams(max_tokens=4, ignore_eos=True))
        if args.profile and b == args.batch_sizes[0]:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                llm.generate(prompts_for(b, args.prompt_len, vocab, 3), SamplingParams(max_tokens=32, ignore_eos=True))
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
        best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
        for run in range(args.repeats):
            llm.generate(prompts_for(b, args.prompt_len, vocab, 10 + run), params)
            s = llm.stats
            best["prefill_tok_s"] = max(best["prefill_tok_s"], s.prefill_tokens / s.prefill_s)
            best["decode_tok_s"] = max(best["decode_tok_s"], s.decode_tokens / s.decode_s)
        rows[b] = best
    return {"rows": rows, "peak_mb": peak_memory_mb(args.device), "dtype": str(llm.dtype)}


def run_hf(args: argparse.Namespace) -> dict:
    import transformers as tf

    from keel.engine.dtypes import resolve_dtype
    from keel.hf.resolve import resolve_model

    folder = resolve_model(args.model)
    dtype = resolve_dtype(args.dtype, torch.device(args.device))
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(args.device).eval()
    vocab = model.config.vocab_size
    gen_kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    rows = {}
    with torch.inference_mode():
        model.generate(
            torch.tensor(prompts_for(1, args.prompt_len, vocab)), max_new_tokens=8, min_new_tokens=8, **gen_kw
        )  # warm-up
        for b in args.batch_sizes:
            ids = torch.tensor(prompts_for(b, args.prompt_len, vocab), device=args.device)
            first_s, full_s = float("inf"), float("inf")  # best of: generate 1 token (prefill) / all tokens
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model.generate(ids, max_new_tokens=1, **gen_kw)
                first_s = min(first_s, time.perf_counter() - t0)
                t0 = time.perf_counter()
                out = model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **gen_kw)
                full_s = min(full_s, time.perf_counter() - t0)
            new = out.shape[1] - ids.shape[1]
            rows[b] = {"prefill_tok_s": ids.numel() / first_s, "decode_tok_s": b * (new - 1) / (full_s - first_s)}
    return {"rows": rows, "peak_mb": peak_memory_mb(args.device), "dtype": str(dtype)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="repo id or folder (default: SmolLM2-135M-Instruct)")
    p.add_argument(
        "--random-smollm2",
        type=Path,
        default=None,
        help="build (once) and use a random-init checkpoint with SmolLM2-135M's config in this folder",
    )
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quantization", default="none", choices=["none", "fp8"], help="keel weights: fp8 = FP8 GEMM")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is reported")
    p.add_argument("--engines", nargs="+", default=["keel", "transformers"], choices=["keel", "transformers"])
    p.add_argument("--profile", action="store_true", help="print a torch.profiler table of keel's first batch size")
    p.add_argument("--tiny", action="store_true", help="smoke run: tiny prompt, 4 new tokens, batch 1 and 2, once")
    p.add_argument(
        "--second-turn",
        type=int,
        default=0,
        metavar="TOKENS",
        help="instead: time to first token of a second turn after a TOKENS-long first one, prefix caching on vs off",
    )
    p.add_argument(
        "--sampling",
        action="store_true",
        help="instead: keel's decode tok/s with logprobs=5 / penalties / a JSON schema against plain requests",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads in the workers (0: torch's default)")
    p.add_argument("--cpu-time", action="store_true", help="keel: time phases in process CPU seconds, not wall")
    p.add_argument("--keel-path", type=Path, default=None, help="keel: import keel from this checkout instead")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tiny:
        args.prompt_len, args.new_tokens, args.repeats, args.batch_sizes = 8, 4, 1, [1, 2]
    if args.random_smollm2 is not None:
        make_random_smollm2(args.random_smollm2)
        args.model = str(args.random_smollm2)
    if args.model is None:
        from keel.hf.resolve import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._worker:
        print(json.dumps(run_keel(args) if args._worker == "keel" else run_hf(args)))
        return
    if args.sampling:
        run_sampling(args)
        return
    if args.second_turn:
        rows = run_second_turn(args)
        print(f"model {args.model}, dtype {args.dtype}, first turn {args.second_turn} tokens + 32 generated + 16 new")
        print("| prefix caching | turn-2 TTFT s | tokens from cache |\n|---|---|---|")
        for name, row in rows.items():
            print(f"| {name} | {row['ttft_s']:.3f} | {row['cached_tokens']} |")
        print(f"turn-2 TTFT: caching off / on = {rows['off']['ttft_s'] / rows['on']['ttft_s']:.2f}x")
        return
    results = {}
    for engine in args.engines:
        cmd = (
            [
                sys.executable,
                __file__,
                "--_worker",
                engine,
                "--model",
                args.model,
                "--dtype",
                args.dtype,
                "--device",
                args.device,
                "--quantization",
                args.quantization,
                "--prompt-len",
                str(args.prompt_len),
                "--new-tokens",
                str(args.new_tokens),
                "--repeats",
                str(args.repeats),
                "--batch-sizes",
                *map(str, args.batch_sizes),
                "--threads",
                str(args.threads),
            ]
            + (["--profile"] if args.profile else [])
            + (["--cpu-time"] if args.cpu_time else [])
        )
        env = dict(os.environ)
        if args.keel_path:  # the worker imports keel from that checkout (first on its PYTHONPATH)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (keel_source(args.keel_path), env.get("PYTHONPATH")) if p)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
        results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"model {args.model}, dtype {args.dtype}, device {args.device}, prompt {args.prompt_len} tokens, "
        f"{args.new_tokens} new tokens, torch threads {torch.get_num_threads()}"
    )
    print("| engine | batch | prefill tok/s | decode tok/s | peak MB |\n|---|---|---|---|---|")
    for engine, res in results.items():
        for b, row in res["rows"].items():
            cells = [
                engine,
                b,
                f"{row['prefill_tok_s']:.0f}",
                f"{row['decode_tok_s']:.1f}",
                f"{res['peak_mb']:.0f}",
            ]
            print("| " + " | ".join(map(str, cells)) + " |")
    if len(results) == 2:
        for b in results["keel"]["rows"]:
            k, h = results["keel"]["rows"][b], results["transformers"]["rows"][b]
            print(
                f"batch {b}: keel/transformers decode {k['decode_tok_s'] / h['decode_tok_s']:.2f}x, "
                f"prefill {k['prefill_tok_s'] / h['prefill_tok_s']:.2f}x"
            )


if __name__ == "__main__":
    main()
