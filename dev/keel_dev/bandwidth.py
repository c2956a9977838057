"""The limit a decode benchmark is held to: how fast the machine's cores read memory, measured where the benchmark
runs, at the thread count it runs with.

A batch-1 decode step reads every weight once, so tokens/s x bytes per token can approach, never pass, what the
cores can read. `read_bandwidth` is a STREAM-style read: `torch.sum` over a float32 buffer far larger than the
last-level cache (1 GiB by default), at `threads` of torch's threads, best of `repeats` passes (the host is shared;
a pass only ever loses time to others). `fraction` puts an engine's figures against it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) that `torch.sum` reads from a fresh `gib` GiB float32 buffer at `threads` threads."""
    import torch

    if threads < 1 or repeats < 1 or gib <= 0:
        raise ValueError(f"read_bandwidth: threads, repeats >= 1 and gib > 0 expected, got {threads}, {repeats}, {gib}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)  # touched: its pages are mapped
        buf.sum()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - t0)
        return buf.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True, slots=True)
class Share:
    """A decode cell against the limit: bytes per token, the GB/s that implies, and its share of the bandwidth."""

    bytes_per_token: int
    gb_s: float
    fraction: float

    def render(self) -> str:
        return f"{self.bytes_per_token / 1e6:.0f} MB/token, {self.gb_s:.1f} GB/s, {self.fraction:.0%} of read bandwidth"


def fraction(tok_s: float, bytes_per_token: int, bandwidth_gb_s: float) -> Share:
    """tok_s tokens/s, each reading bytes_per_token bytes, against bandwidth_gb_s."""
    gb_s = tok_s * bytes_per_token / 1e9
    return Share(bytes_per_token, gb_s, gb_s / bandwidth_gb_s if bandwidth_gb_s > 0 else float("nan"))
