"""One decode step's projections with cold weights: keel fp8 vs keel bf16 vs torch's bf16 F.linear.

    python benchmarks/projections.py                  # SmolLM2-135M's 30 layers + lm_head, threads 1 and 2
    python benchmarks/projections.py --threads 1 --rounds 20
    python benchmarks/projections.py --checkpoint .cache/bench_llamacpp/keel-bf16   # a real model's weights
    python benchmarks/projections.py --rows 8        # a decode step of 8 sequences (x has 8 rows)
    python benchmarks/projections.py --huge-pages    # also each keel peer with its weights on huge pages

A decode step of a small model streams every weight once, so what bounds it is how fast a core pulls
weights from memory, not the kernel's speed on a weight that sits in cache (what `bench_gemm.py`
measures: it repeats one matrix). This script holds the whole model's projections as distinct tensors
(the fused qkv, o_proj, fused gate/up and down of each of --layers layers, then the lm_head; 270 MB in
bf16, 138 MB in FP8 with its scales for SmolLM2-135M), calls each once per "token" in model order, and
reports ms per token and the GB/s of weight bytes it implies. Peers in the same process, alternated
round by round, best of --rounds: `keel-fp8` (keel.ops.fp8_linear, e4m3 weights with 1x128 scales and, as
Fp8Linear passes them, their special rows found once),
`keel-bf16` (keel.ops.linear) and `torch-bf16` (torch.nn.functional.linear, oneDNN). A memory copy of
the same bf16 bytes gives the machine's streaming rate for reference, and keel_dev.bandwidth's read (torch.sum over
1 GiB at each thread count, after the peers) the limit each keel peer's GB/s is a share of. The machine is shared:
read the ratios of one run.

Random weights by default; `--checkpoint DIR` takes a Llama-family checkpoint's own (model.safetensors: q/k/v
and gate/up fused as keel fuses them, the lm_head or the tied embedding), whose FP8 bytes hold what real
weights hold (zero bytes in a few % of rows, rare subnormals), which the FP8 kernel's speed depends on.

`--huge-pages` adds `keel-fp8-huge`, `keel-bf16-huge` and `copy-huge`: the same bytes copied into one
huge-page arena (keel.engine.host_memory.rehome, as keel's model runner places a model's weights), alternated
with the peers above in the same process; without it, every tensor here is allocated by torch on its own.

Records: docs/measurements/2026-12-03-huge-pages.md, docs/measurements/2026-12-03-prefetch.md,
docs/measurements/2026-12-03-fp8-special-rows.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from keel_dev.bandwidth import read_bandwidth
from keel_dev.timing import best_times, cpu_name

import keel  # noqa: F401  (loads keel's ops)
from keel import ops
from keel.vendored import deep_gemm as dg

# SmolLM2-135M: hidden 576, intermediate 1536, 9 heads x 64 + 2 x 3 kv heads x 64, vocab 49152
SMOLLM2 = {"layer": [(960, 576), (576, 576), (3072, 576), (576, 1536)], "head": (49152, 576), "layers": 30}


def checkpoint_weights(folder: Path, layers: int) -> list[torch.Tensor]:
    """The projections of a checkpoint's first `layers` layers in model order (q/k/v and gate/up fused, as
    keel's model holds them), then the lm_head (the embedding when tied), in bf16."""
    from safetensors.torch import load_file

    sd = load_file(str(folder / "model.safetensors"))
    out = []
    for i in range(layers):
        pre = f"model.layers.{i}."
        attn, mlp = pre + "self_attn.", pre + "mlp."
        out += [
            torch.cat([sd[attn + f"{n}_proj.weight"] for n in "qkv"]),
            sd[attn + "o_proj.weight"],
            torch.cat([sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]]),
            sd[mlp + "down_proj.weight"],
        ]
    out.append(sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
    return [w.bfloat16().contiguous() for w in out]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--layers", type=int, default=SMOLLM2["layers"])
    p.add_argument("--rounds", type=int, default=10, help="alternated rounds; the best is kept")
    p.add_argument("--tokens", type=int, default=3, help="tokens timed per round")
    p.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint folder whose weights to use")
    p.add_argument("--rows", type=int, default=1, help="rows of x (sequences of a decode step)")
    p.add_argument("--huge-pages", action="store_true", help="also the keel peers and the copy on huge pages")
    args = p.parse_args()

    g = torch.Generator().manual_seed(0)
    if args.checkpoint is not None:
        bf16 = checkpoint_weights(args.checkpoint, args.layers)
    else:
        shapes = [s for _ in range(args.layers) for s in SMOLLM2["layer"]] + [SMOLLM2["head"]]
        bf16 = [torch.randn(n, k, generator=g).mul_(0.05).bfloat16() for n, k in shapes]
    shapes = [tuple(w.shape) for w in bf16]
    fp8 = [(q, s, ops.fp8_special_rows(q)) for q, s in (dg.per_token_cast_to_fp8(w.float()) for w in bf16)]
    if args.rows < 1:
        p.error(f"--rows must be >= 1, got {args.rows}")
    xs = {k: torch.randn(args.rows, k, generator=g).bfloat16() for k in {k for _, k in shapes}}
    bytes_bf16 = sum(w.numel() * 2 for w in bf16)
    bytes_fp8 = sum(q.numel() + s.numel() * 4 for q, s, _ in fp8)
    src = torch.cat([w.view(-1) for w in bf16])
    dst = torch.empty_like(src)

    def fp8_peer(weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
        def run() -> None:
            for q, s, special in weights:
                ops.fp8_linear(xs[q.shape[1]], q, s, None, special)

        return run

    def bf16_peer(weights: list[torch.Tensor], linear: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for w in weights:
                linear(xs[w.shape[1]], w, None)

        return run

    def copy_peer(a: torch.Tensor, b: torch.Tensor) -> Callable[[], None]:
        return lambda: b.copy_(a)

    peers: dict[str, tuple[Callable[[], None], int]] = {
        "keel-fp8": (fp8_peer(fp8), bytes_fp8),
        "keel-bf16": (bf16_peer(bf16, ops.linear), bytes_bf16),
        "torch-bf16": (bf16_peer(bf16, torch.nn.functional.linear), bytes_bf16),
        "copy": (copy_peer(src, dst), 2 * bytes_bf16),  # read + write
    }
    if args.huge_pages:
        from keel.engine import host_memory

        if not host_memory.available():
            p.error(f"--huge-pages: no transparent huge pages here (kernel mode {host_memory.thp_mode()!r})")
        fp8_h = [(q.clone(), s.clone(), special) for q, s, special in fp8]
        bf16_h = [w.clone() for w in bf16]
        src_h, dst_h = src.clone(), dst.clone()
        host_memory.rehome([*(t for q, s, _ in fp8_h for t in (q, s)), *bf16_h, src_h, dst_h])
        peers["keel-fp8-huge"] = (fp8_peer(fp8_h), bytes_fp8)
        peers["keel-bf16-huge"] = (bf16_peer(bf16_h, ops.linear), bytes_bf16)
        peers["copy-huge"] = (copy_peer(src_h, dst_h), 2 * bytes_bf16)
    cpu = cpu_name()
    source = f"weights of {args.checkpoint}" if args.checkpoint else "random weights"
    print(f"CPU: {cpu}; {source}; {args.layers} layers + lm_head, weights {bytes_bf16 / 1e6:.0f} MB bf16 / "
          f"{bytes_fp8 / 1e6:.0f} MB fp8, {args.rows} row(s) of x, "
          f"best of {args.rounds} alternated rounds")  # fmt: skip
    names = ["fp8/bf16", "keel-bf16/torch-bf16"] + (["huge/plain fp8", "huge/plain bf16"] if args.huge_pages else [])
    names += ["read GB/s", "keel-bf16 share", "keel-fp8 share"]
    print("| threads | " + " | ".join(f"{n} ms (GB/s)" for n in peers) + " | " + " | ".join(names) + " |")
    print("|---|" + "---|" * (len(peers) + len(names)))
    for threads in args.threads:
        torch.set_num_threads(threads)
        # prime=1: one untimed call after the previous peer ran, whose weights then left the caches
        fns = {name: fn for name, (fn, _) in peers.items()}
        best = best_times(fns, repeats=args.rounds, inner=args.tokens, warmup=0, prime=1)
        cells = [f"{best[n] * 1e3:.2f} ({nbytes / best[n] / 1e9:.1f})" for n, (_, nbytes) in peers.items()]
        ratios = [best["keel-bf16"] / best["keel-fp8"], best["torch-bf16"] / best["keel-bf16"]]
        if args.huge_pages:  # > 1: the huge-page copy of the weights is faster
            ratios += [best["keel-fp8"] / best["keel-fp8-huge"], best["keel-bf16"] / best["keel-bf16-huge"]]
        bw = read_bandwidth(threads)  # the limit at this thread count, measured in the same run
        shares = [f"{bw:.1f}", *(f"{nbytes / best[n] / 1e9 / bw:.0%}" for n, nbytes in
                                 (("keel-bf16", bytes_bf16), ("keel-fp8", bytes_fp8)))]  # fmt: skip
        print(f"| {threads} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}x" for r in ratios) + " | "
              + " | ".join(shares) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
