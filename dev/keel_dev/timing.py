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


def cpu_times(stat: str | None = None) -> tuple[int, int] | None:
    """(steal, total) clock ticks of the machine's CPUs since boot, from the "cpu" line of /proc/stat (or of
    `stat`, that file's text): steal is the time the hypervisor ran someone else while a vCPU wanted to run.
    None where the file or the line is not there (not Linux)."""
    if stat is None:
        try:
            with open("/proc/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            return None
    line = next((ln for ln in stat.splitlines() if ln.startswith("cpu ")), None)
    if line is None:
        return None
    # user nice system idle iowait irq softirq steal (guest and guest_nice are already inside user and nice)
    ticks = [int(v) for v in line.split()[1:9]]
    ticks += [0] * (8 - len(ticks))
    return ticks[7], sum(ticks)


def steal_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen by the hypervisor between two `cpu_times()` readings, in percent: on a
    shared VM, the figure that tells a slow benchmark cell from a slow method. None when either reading is
    missing or no time passed."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def cpu_name() -> str:
    """The CPU's model name as `lscpu` shows it (/proc/cpuinfo's first "model name"), for a benchmark's header;
    "unknown CPU" where that file is not there (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"
