"""One timer for every benchmark: the alternating min-of-means.

Each callable runs once to warm up; then, `repeats` times, every callable runs `inner` calls in turn (the
peers alternate within each repeat, so a slow spell of the machine hits all of them alike). The result is
each callable's best (minimum) mean seconds per call over the repeats: on a shared machine other processes
only ever add time, so the least-disturbed repeat is the fairest estimate of a method's own cost.

On "cuda" the time of a repeat is read from CUDA events around its `inner` calls (the GPU's time, not the
host's); elsewhere from time.perf_counter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

Fn = Callable[[], object]


def best_times(
    fns: Mapping[str, Fn], *, repeats: int, inner: int = 1, device: str = "cpu", warmup: int = 1, prime: int = 0
) -> dict[str, float]:
    """Best mean seconds per call of each fn in `fns` (see the module's docstring). `prime`: untimed calls
    before each of its timed batches (what the previous peer evicted from the caches comes back first)."""
    if repeats < 1 or inner < 1:
        raise ValueError(f"best_times: repeats and inner must be >= 1, got repeats={repeats}, inner={inner}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            for _ in range(prime):
                fn()
            samples[name].append(_mean_call(fn, inner, device))
    return {name: min(v) for name, v in samples.items()}


def best_time(fn: Fn, *, repeats: int, inner: int = 1, device: str = "cpu", warmup: int = 1) -> float:
    """`best_times` of one callable."""
    return best_times({"fn": fn}, repeats=repeats, inner=inner, device=device, warmup=warmup)["fn"]


def _mean_call(fn: Fn, inner: int, device: str) -> float:
    if device == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def cpu_name() -> str:
    """The CPU's model name as `lscpu` shows it (/proc/cpuinfo's first "model name"), for a benchmark's header;
    "unknown CPU" where that file is not there (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"
