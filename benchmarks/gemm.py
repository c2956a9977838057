"""Decode-shape GEMM speed on CPU: keel's vendored fp8_gemm_nt vs keel's bf16 `keel.ops.linear` vs torch bf16 matmul.

Records:
    docs/measurements/2026-12-01-fp8.md
    docs/measurements/2026-12-02-amx-prompt-kernels.md
    docs/measurements/2026-12-03-prefetch.md
    docs/measurements/2026-12-03-tile-epilogue.md

    python benchmarks/gemm.py                 # SmolLM2-135M's layers and an 8B model's, M = 1, 8, 32
    python benchmarks/gemm.py --shapes 8b --m 1
    python benchmarks/gemm.py --device cuda   # the GPU half: benchmarks/cuda_cases.py
    python benchmarks/gemm.py --prompt --shapes smollm2 --m 8 64 512 --threads 1
        # prompt GEMMs: keel.ops.linear (bf16) and keel.ops.fp8_linear (bf16 x, e4m3 weight, 1x128 scales) at
        # each KEEL_CPU_ISA level (--isa, default amx avx512: one child process per level and round, the levels
        # alternated) vs torch's bf16 matmul (oneDNN) in the same child

All peers run in the same process, alternating round by round; each cell is the best over rounds of the
mean time of a few back-to-back calls. `fp8` is fp8_gemm_nt alone (weights and activations cast beforehand)
with the engine's 1x128 weight scales (recipe (1, 1, 128)); `fp8+cast` adds the per-token activation cast that
the engine's Fp8Linear pays on every call; `fp8 128x128` is the same GEMM with 128x128 weight blocks. Ratios > 1 mean
fp8 is faster. The weight is [N, K] (N outputs), as in nn.Linear.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import cuda_cases as bench_cuda  # the --device cuda half (benchmarks/cuda_cases.py)
import torch
from keel_dev.timing import best_times

import keel
from keel.vendored import deep_gemm as dg

SHAPES = {
    # SmolLM2-135M: fused qkv, o_proj, fused gate_up, down_proj, lm_head (N, K)
    "smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    # a Llama-3-8B-sized model: q/o_proj, gate/up_proj, down_proj
    "8b": [(4096, 4096), (14336, 4096), (4096, 14336)],
}


def bench_shape(n: int, k: int, m: int, rounds: int) -> dict[str, float]:
    """Best mean seconds per call of each peer for x [m, k] @ w[n, k].T (peers alternate in every round)."""
    w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
    x = torch.randn(m, k, dtype=torch.bfloat16)
    blocks = dg.per_block_cast_to_fp8(w)  # 128x128 weight blocks, recipe (1, 128, 128) (DeepSeek-V3's)
    rows = dg.per_token_cast_to_fp8(w)  # 1x128 groups per weight row, recipe (1, 1, 128) (the engine's default)
    qx = dg.per_token_cast_to_fp8(x)
    d = torch.empty(m, n, dtype=torch.bfloat16)

    def fp8() -> None:
        dg.fp8_gemm_nt(qx, rows, d, recipe=(1, 1, 128))

    def fp8_cast() -> None:
        dg.fp8_gemm_nt(dg.per_token_cast_to_fp8(x), rows, d, recipe=(1, 1, 128))

    def fp8_blocks() -> None:
        dg.fp8_gemm_nt(qx, blocks, d, recipe=(1, 128, 128))

    peers: dict[str, Callable[[], object]] = {
        "fp8": fp8,
        "fp8+cast": fp8_cast,
        "fp8 128x128": fp8_blocks,
        "keel bf16": lambda: keel.ops.linear(x, w),
        "torch bf16": lambda: x @ w.T,
    }
    calls = max(3, min(200, int(2e8 // (n * k))))  # ~0.1-0.2 s of work per sample
    return best_times(peers, repeats=rounds, inner=calls, warmup=2)  # warm-up: page in, pool threads


def _prompt_peers(
    x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, s: torch.Tensor
) -> dict[str, Callable[[], object]]:
    return {
        "keel bf16": lambda: keel.ops.linear(x, w),
        "keel fp8": lambda: keel.ops.fp8_linear(x, q, s, None),
        "torch bf16": lambda: x @ w.T,
    }


def prompt_child(shapes: list[str], ms: list[int], calls_budget: float) -> None:
    """One round in this process (its KEEL_CPU_ISA): best mean seconds per call of each peer, as JSON."""
    import json

    torch.manual_seed(0)
    out = {}
    for model in shapes:
        for n, k in SHAPES[model]:
            w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
            q, s = dg.per_token_cast_to_fp8(w.float())
            for m in ms:
                x = torch.randn(m, k, dtype=torch.bfloat16)
                peers = _prompt_peers(x, w, q, s)
                calls = max(3, min(200, int(calls_budget // (n * k * max(m, 8)))))
                for name, t in best_times(peers, repeats=3, inner=calls, warmup=2).items():
                    out[f"{model}|{n}|{k}|{m}|{name}"] = t
    print(json.dumps(out))


def prompt_main(args: argparse.Namespace) -> None:
    import json
    import os
    import subprocess
    import sys

    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for isa in args.isa:
            cmd = [sys.executable, __file__, "--_prompt-child", "--shapes", *args.shapes, "--m", *map(str, args.m)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            env = {**os.environ, "KEEL_CPU_ISA": isa}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"KEEL_CPU_ISA={isa} child failed:\n{done.stderr[-3000:]}")
            for key, t in json.loads(done.stdout.strip().splitlines()[-1]).items():
                samples.setdefault((isa, key), []).append(t)
    best = {k: statistics.median(v) for k, v in samples.items()}
    print(f"torch {torch.__version__}, threads {args.threads or 'default'}, rounds {args.rounds}, levels {args.isa}")
    cols = [f"{isa} {peer}" for isa in args.isa for peer in ("keel bf16", "keel fp8")]
    print("| model | N x K | M | " + " | ".join(f"{c} us" for c in cols) + " | torch bf16 us | " +
          " | ".join(f"torch/{isa} bf16 | torch/{isa} fp8" for isa in args.isa) + " |")  # fmt: skip
    print("|---" * (3 + len(cols) + 1 + 2 * len(args.isa)) + "|")
    for model in args.shapes:
        for n, k in SHAPES[model]:
            for m in args.m:
                key = f"{model}|{n}|{k}|{m}|"
                t = {c: best[(c.split(" ", 1)[0], key + c.split(" ", 1)[1])] for c in cols}
                torch_t = statistics.median(best[(isa, key + "torch bf16")] for isa in args.isa)
                ratios = [
                    f"{torch_t / t[f'{isa} keel bf16']:.2f} | {torch_t / t[f'{isa} keel fp8']:.2f}" for isa in args.isa
                ]
                print(f"| {model} | {n} x {k} | {m} | " + " | ".join(f"{t[c] * 1e6:.0f}" for c in cols) +
                      f" | {torch_t * 1e6:.0f} | " + " | ".join(ratios) + " |", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["smollm2", "8b"], choices=sorted(SHAPES))
    p.add_argument("--m", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: TFLOP/s vs torch._scaled_mm")
    p.add_argument("--prompt", action="store_true", help="prompt GEMMs per KEEL_CPU_ISA level (see the docstring)")
    p.add_argument("--isa", nargs="+", default=["amx", "avx512"], help="--prompt: KEEL_CPU_ISA levels to compare")
    p.add_argument("--_prompt-child", action="store_true", help=argparse.SUPPRESS)
    bench_cuda.add_arguments(p)
    args = p.parse_args()
    if args._prompt_child:
        if args.threads:
            torch.set_num_threads(args.threads)
        prompt_child(args.shapes, args.m, 3e8)
        return
    if args.prompt:
        prompt_main(args)
        return
    if args.device == "cuda":
        bench_cuda.gemm_main(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}")
    print(
        "| model | N x K | M | fp8 us | fp8+cast us | fp8 128x128 us | keel bf16 us | torch bf16 us | keel/fp8 | "
        "torch/fp8 | fp8 GB/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.shapes:
        for n, k in SHAPES[model]:
            for m in args.m:
                t = bench_shape(n, k, m, args.rounds)
                gbs = n * k / t["fp8"] / 1e9  # fp8 weight bytes streamed per second
                print(
                    f"| {model} | {n} x {k} | {m} | {t['fp8'] * 1e6:.0f} | {t['fp8+cast'] * 1e6:.0f} | "
                    f"{t['fp8 128x128'] * 1e6:.0f} | "
                    f"{t['keel bf16'] * 1e6:.0f} | {t['torch bf16'] * 1e6:.0f} | {t['keel bf16'] / t['fp8']:.2f} | "
                    f"{t['torch bf16'] / t['fp8']:.2f} | {gbs:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
