#!/usr/bin/env python
"""Benchmark keel's ops against torch in the same run.

Records:
    docs/measurements/2026-12-01-ops-overhead.md
    docs/measurements/2026-12-03-row-ops.md

1. Per-call host overhead (us, tiny tensors, best of repeats): each keel op vs the
   native torch equivalent (one ATen op where torch has one, else the composite).
2. Large-tensor throughput (GB/s of bytes read + written, best of repeats): fused_muladd vs a*b+c
   and torch.addcmul at 16M elements; rms_norm vs its torch composite and F.rms_norm.

3. What stability costs: keel's fused_muladd and rms_norm against an unstable TORCH_LIBRARY twin
   (benchmarks/ops_twin.cpp) built here, into a temporary folder, for this run only: the same
   CPU kernels and checks, at::Tensor instead of the stable ABI. Per-call time, tiny tensors,
   keel and twin alternated in the same run.

4. (--rows N [N ...], alone) A decoder layer's row ops at SmolLM2-135M's shapes (hidden 576, intermediate
   1536, 9 query and 3 K/V heads of 64) with N rows (tokens): rms_norm, fused_add_rms_norm, silu_and_mul and
   rotary_embedding against their torch composites, best us per call (the decode step calls them with 1-8
   rows, a 64-token prompt with 64+). Run it under another checkout (PYTHONPATH=TREE) for a before / after.

Ratios > 1 mean keel is faster (section 3: keel / twin, 1.0 = no cost).
Usage: python benchmarks/ops.py [--quick] [--twin-only] [--rows 8 71]
       python benchmarks/ops.py --device cuda   (GB/s vs a device copy: benchmarks/cuda_cases.py)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import cuda_cases as bench_cuda  # the --device cuda half (benchmarks/cuda_cases.py)
import torch
import torch.nn.functional as F
from keel_dev.timing import best_time

import keel
from keel import ops


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call(fn: Callable[[], object], device: str, inner: int, repeats: int) -> float:
    """Best mean seconds per call (keel_dev.timing: warm-up, then the best of `repeats` means of `inner` calls)."""
    return best_time(fn, repeats=repeats, inner=inner, device=device, warmup=max(3, inner // 10))


def rope_cache(max_pos: int, rot: int, device: str) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return torch.cat([f.cos(), f.sin()], -1).to(device)


def torch_rope(positions, q, k, hs, cache):
    """HF-style rotate_half rotary on [T, H*hs] q/k (returns new tensors)."""
    cos, sin = cache[positions].chunk(2, -1)
    cos, sin = torch.cat([cos, cos], -1).unsqueeze(1), torch.cat([sin, sin], -1).unsqueeze(1)

    def rot(x):
        x = x.view(x.shape[0], -1, hs)
        x1, x2 = x.chunk(2, -1)
        return (x * cos + torch.cat([-x2, x1], -1) * sin).flatten(1)

    return rot(q), rot(k)


def overhead_rows(device: str, inner: int, repeats: int) -> list[tuple[str, str, float, float]]:
    a, b = torch.randn(8, device=device), torch.randn(8, device=device)
    c = torch.full((8,), 0.5, device=device)
    x, w = torch.randn(2, 8, device=device), torch.randn(8, device=device)
    res = torch.randn(2, 8, device=device)
    pos = torch.arange(2, device=device)
    q, k = torch.randn(2, 16, device=device), torch.randn(2, 8, device=device)
    cache = rope_cache(4, 8, device)
    gu = torch.randn(2, 16, device=device)
    cases = [
        ("fused_muladd", lambda: ops.fused_muladd(a, b, 0.5), "torch.addcmul", lambda: torch.addcmul(c, a, b)),
        ("rms_norm", lambda: ops.rms_norm(x, w, 1e-6), "F.rms_norm", lambda: F.rms_norm(x, (8,), w, 1e-6)),
        (
            "fused_add_rms_norm",
            lambda: ops.fused_add_rms_norm(x, res, w, 1e-6),
            "add_ + F.rms_norm",
            lambda: F.rms_norm(res.add_(x), (8,), w, 1e-6),
        ),
        (
            "rotary_embedding",
            lambda: ops.rotary_embedding(pos, q, k, 8, cache, True),
            "rotate_half composite",
            lambda: torch_rope(pos, q, k, 8, cache),
        ),
        ("silu_and_mul", lambda: ops.silu_and_mul(gu), "F.silu(g) * u", lambda: F.silu(gu[:, :8]) * gu[:, 8:]),
    ]
    rows = []
    for name, kfn, peer, tfn in cases:
        tk = per_call(kfn, device, inner, repeats)
        tt = per_call(tfn, device, inner, repeats)
        rows.append((name, peer, tk * 1e6, tt * 1e6))
    # trivial ATen ops for scale: the Python binding, and the same op through torch.ops
    # (the OpOverload entry path keel's ops also take)
    t_add = per_call(lambda: torch.add(a, b), device, inner, repeats)
    t_ovl = per_call(lambda: torch.ops.aten.add.Tensor(a, b), device, inner, repeats)
    rows.append(("(scale) torch.ops.aten.add.Tensor", "torch.add", t_ovl * 1e6, t_add * 1e6))
    return rows


def throughput_rows(device: str, n: int, repeats: int) -> list[tuple[str, str, float, float]]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(n, device=device, dtype=dtype)
        b = torch.randn(n, device=device, dtype=dtype)
        c = torch.full((n,), 0.5, device=device, dtype=dtype)
        gb = 3 * n * a.element_size() / 1e9  # read a, b; write out
        tk = per_call(lambda a=a, b=b: ops.fused_muladd(a, b, 0.5), device, 3, repeats)
        peers = (
            ("a*b+c", lambda a=a, b=b: a * b + 0.5),
            ("torch.addcmul", lambda a=a, b=b, c=c: torch.addcmul(c, a, b)),
        )
        for peer, fn in peers:
            tt = per_call(fn, device, 3, repeats)
            rows.append((f"fused_muladd {str(dtype)[6:]} {n / 1e6:.0f}M", peer, gb / tk, gb / tt))
        del a, b, c
        rows_, hidden = 4096, 4096
        x = torch.randn(rows_, hidden, device=device, dtype=dtype)
        w = torch.randn(hidden, device=device, dtype=dtype)
        gb = 2 * x.numel() * x.element_size() / 1e9

        def composite(x=x, w=w, dtype=dtype):
            xf = x.float()
            return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)

        tk = per_call(lambda x=x, w=w: ops.rms_norm(x, w, 1e-6), device, 3, repeats)
        peers = (
            ("torch composite", composite),
            ("F.rms_norm", lambda x=x, w=w, h=hidden: F.rms_norm(x, (h,), w, 1e-6)),
        )
        for peer, fn in peers:
            tt = per_call(fn, device, 3, repeats)
            rows.append((f"rms_norm {str(dtype)[6:]} [4096, 4096]", peer, gb / tk, gb / tt))
    return rows


ROOT = Path(__file__).resolve().parents[2]


def build_twin(out_dir: Path) -> Path:
    """Compile benchmarks/ops_twin.cpp with keel's CPU kernels (both ISA builds, keel's flags)
    against the installed torch with plain g++; returns the .so (in out_dir, never in the wheel)."""
    from torch.utils import cpp_extension

    csrc = ROOT / "csrc"
    kernel_flags = [
        "-O3",
        "-fPIC",
        "-std=c++17",
        "-fopenmp-simd",
        "-fno-trapping-math",
        "-fno-math-errno",
        "-fvisibility=hidden",
        f"-I{csrc}",
    ]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
    objs = []
    jobs = []
    for isa, extra in (("base", []), ("avx2", ["-mavx2", "-mfma", "-mf16c"])):
        for k in ("fused_muladd", "rms_norm"):
            obj = out_dir / f"{k}_{isa}.o"
            jobs.append(
                [
                    "g++",
                    *kernel_flags,
                    *extra,
                    f"-DKEEL_CPU_NS=cpu_{isa}",
                    "-c",
                    str(csrc / "ops" / f"{k}_cpu.cpp"),
                    "-o",
                    str(obj),
                ]
            )
            objs.append(obj)
    objs.append(out_dir / "cpu_isa.o")
    jobs.append(["g++", *kernel_flags, "-c", str(csrc / "ops" / "cpu_isa.cpp"), "-o", str(objs[-1])])
    objs.append(out_dir / "twin.o")
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    jobs.append(
        [
            "g++",
            "-O3",
            "-fPIC",
            "-std=c++17",
            abi,
            f"-I{csrc}",
            *inc,
            "-c",
            str(ROOT / "benchmarks" / "ops_twin.cpp"),
            "-o",
            str(objs[-1]),
        ]
    )
    procs = [subprocess.Popen(j) for j in jobs]
    if any(p.wait() for p in procs):
        raise RuntimeError("building the unstable twin failed (see the compiler output above)")
    lib = cpp_extension.library_paths()[0]
    so = out_dir / "keel_twin.so"
    subprocess.run(
        [
            "g++",
            "-shared",
            "-o",
            str(so),
            *map(str, objs),
            f"-L{lib}",
            "-ltorch",
            "-ltorch_cpu",
            "-lc10",
            f"-Wl,-rpath,{lib}",
        ],
        check=True,
    )
    return so


def twin_rows(inner: int, repeats: int, rounds: int = 5) -> list[tuple[str, float, float]]:
    """(case, keel us, twin us): medians over `rounds` alternating keel/twin measurements."""
    a, b = torch.randn(8), torch.randn(8)
    x, w = torch.randn(2, 8), torch.randn(8)
    keel_fm, twin_fm = torch.ops.keel.fused_muladd.default, torch.ops.keel_twin.fused_muladd.default
    keel_rn, twin_rn = torch.ops.keel.rms_norm.default, torch.ops.keel_twin.rms_norm.default
    assert torch.equal(keel_fm(a, b, 0.5), twin_fm(a, b, 0.5)) and torch.equal(keel_rn(x, w, 1e-6), twin_rn(x, w, 1e-6))
    cases = [
        # both below autograd: keel's op has a Python autograd formula, the twin none
        ("fused_muladd (inference_mode)", lambda: keel_fm(a, b, 0.5), lambda: twin_fm(a, b, 0.5), True),
        ("rms_norm", lambda: keel_rn(x, w, 1e-6), lambda: twin_rn(x, w, 1e-6), False),
        (
            "keel.ops.fused_muladd wrapper vs twin",
            lambda: ops.fused_muladd(a, b, 0.5),
            lambda: twin_fm(a, b, 0.5),
            False,
        ),
    ]
    rows = []
    for name, kfn, tfn, inference in cases:
        tk, tt = [], []
        for _ in range(rounds):
            with torch.inference_mode(inference):
                tk.append(per_call(kfn, "cpu", inner, repeats))
                tt.append(per_call(tfn, "cpu", inner, repeats))
        rows.append((name, statistics.median(tk) * 1e6, statistics.median(tt) * 1e6))
    return rows


def print_twin(inner: int, repeats: int) -> None:
    print("\nWhat stability costs: keel (stable ABI) vs an unstable TORCH_LIBRARY twin running the same kernels")
    print("(tiny CPU tensors, median us/call, alternated; ratio = keel / twin, 1.00 = no cost)\n")
    with tempfile.TemporaryDirectory(prefix="keel-twin-") as tmp:
        torch.ops.load_library(str(build_twin(Path(tmp))))
        print("| case | keel us | twin us | keel / twin |\n|---|---:|---:|---:|")
        for name, tk, tt in twin_rows(inner, repeats):
            print(f"| {name} | {tk:.2f} | {tt:.2f} | {tk / tt:.2f}x |")


def decoder_rows(rows: int, inner: int, repeats: int) -> list[tuple[str, str, float, float]]:
    """(op, peer, keel s, peer s) for a SmolLM2-135M decoder layer's row ops at `rows` tokens, bf16."""
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 576, generator=g).to(bf)
    res = torch.randn(rows, 576, generator=g).to(bf)
    w = torch.randn(576, generator=g).to(bf)
    gu = torch.randn(rows, 2 * 1536, generator=g).to(bf)
    qkv = torch.randn(rows, 15 * 64, generator=g).to(bf)
    pos = torch.arange(rows) + 100
    cache = rope_cache(8192, 64, "cpu").to(bf)  # the model keeps its cos/sin in its dtype (as HF casts them)
    q, k = qkv[:, : 9 * 64], qkv[:, 9 * 64 : 12 * 64]  # views into the fused projection, as in the model
    cases = [
        ("rms_norm", lambda: ops.rms_norm(x, w, 1e-5), "F.rms_norm", lambda: F.rms_norm(x, (576,), w, 1e-5)),
        (
            "fused_add_rms_norm",
            lambda: ops.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-5),
            "clones + add + F.rms_norm",
            lambda: F.rms_norm(x.clone() + res.clone(), (576,), w, 1e-5),
        ),
        (
            "silu_and_mul",
            lambda: ops.silu_and_mul(gu),
            "F.silu(a) * b",
            lambda: F.silu(gu[:, :1536]) * gu[:, 1536:],
        ),
        (
            "rotary_embedding",
            lambda: ops.rotary_embedding(pos, q, k, 64, cache, True),
            "rotate_half composite",
            lambda: torch_rope(pos, q, k, 64, cache),
        ),
    ]
    return [(n, pn, per_call(f, "cpu", inner, repeats), per_call(pf, "cpu", inner, repeats)) for n, f, pn, pf in cases]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: GB/s vs a device copy")
    bench_cuda.add_arguments(ap)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    ap.add_argument("--twin-only", action="store_true", help="only section 3 (keel vs the unstable twin)")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="only section 4, at these row counts")
    args = ap.parse_args()
    if args.device == "cuda":
        bench_cuda.ops_main(args)
        return
    inner, repeats = (200, 5) if args.quick else (2000, 15)
    n = (1 << 22) if args.quick else (1 << 24)
    print(
        f"keel {keel.__version__} | torch {torch.__version__} | device {args.device} | "
        f"threads {torch.get_num_threads()} | libs {sorted(keel._native.loaded_libraries())}\n"
    )
    if args.twin_only:
        print_twin(inner, repeats)
        return
    if args.rows:
        print("Decoder row ops, SmolLM2-135M shapes, bf16 (best us/call; ratio = peer / keel, > 1: keel faster)\n")
        print("| rows | op | keel us | peer | peer us | ratio |\n|---:|---|---:|---|---:|---:|")
        for rows in args.rows:
            for name, peer, tk, tt in decoder_rows(rows, max(20, inner // 10), repeats):
                print(f"| {rows} | {name} | {1e6 * tk:.1f} | {peer} | {1e6 * tt:.1f} | {tt / tk:.2f}x |")
        return
    print("Per-call host overhead (tiny tensors, best us/call; ratio = peer / keel, > 1: keel cheaper)\n")
    print("| op | keel us | peer | peer us | ratio |\n|---|---:|---|---:|---:|")
    for name, peer, tk, tt in overhead_rows(args.device, inner, repeats):
        print(f"| {name} | {tk:.2f} | {peer} | {tt:.2f} | {tt / tk:.2f}x |")
    print("\nThroughput (GB/s moved, best; ratio = keel / peer, > 1: keel faster)\n")
    print("| case | peer | keel GB/s | peer GB/s | ratio |\n|---|---|---:|---:|---:|")
    for name, peer, gk, gt in throughput_rows(args.device, n, max(5, repeats // 2)):
        print(f"| {name} | {peer} | {gk:.1f} | {gt:.1f} | {gk / gt:.2f}x |")
    if args.device == "cpu":
        print_twin(inner, repeats)


if __name__ == "__main__":
    main()
