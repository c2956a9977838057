"""Host memory for the weights and the KV cache on transparent huge pages (Linux).

A CPU decode step streams every weight once and reads each sequence's cache blocks. On 4 KiB pages the weights
of SmolLM2-135M span some 66,000 pages a token, so the streaming loads keep missing the TLB; weights allocated
tensor by tensor do not get huge pages even where the kernel offers them (`madvise` mode needs the advice,
and a tensor under 2 MiB cannot hold an aligned huge page). So the model runner moves the model's parameters
and buffers into one private anonymous mapping advised MADV_HUGEPAGE, and lays the KV pools back to back in
such mappings of up to 32 MiB (anonymous memory is zero-filled and touched lazily, as `torch.zeros` is not).
The figures: docs/measurements/2026-12-03-huge-pages.md.

Only the placement changes: the same values, the same tensor objects (their `.data` is re-pointed), strides
and offsets; aliasing between tensors of one storage is kept. Where huge pages cannot be had (not Linux, a
Python without MADV_HUGEPAGE, the kernel's mode `never`, a device other than the CPU) or `KEEL_HUGE_PAGES=0`,
nothing moves and the pools are plain `torch.zeros`.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable

import torch

from keel._settings import HugePagesSettingError, thp_mode
from keel._settings import huge_pages_available as available  # the mode, MADV_HUGEPAGE, the switch
from keel._settings import huge_pages_wanted as wanted  # KEEL_HUGE_PAGES (an unknown value raises)

__all__ = ["HUGE_PAGE", "HugePagesSettingError", "arena", "available", "rehome", "thp_mode", "wanted", "zeros"]

HUGE_PAGE = 2 << 20  # the x86-64 / arm64 (4 KiB base) transparent huge page
PAGE = 4096  # each tensor of an arena starts on a base page
_CPU = torch.device("cpu")


def _round_up(n: int, unit: int) -> int:
    return (n + unit - 1) // unit * unit


def arena(nbytes: int) -> torch.Tensor:
    """`nbytes` zero bytes (uint8, CPU) starting on a huge-page boundary, from a private anonymous mapping advised
    MADV_HUGEPAGE; the mapping lives as long as any view of the result. Call only where `available()`."""
    if nbytes < 0:
        raise ValueError(f"keel.engine.host_memory.arena: nbytes must be >= 0, got {nbytes}")
    size = _round_up(nbytes, HUGE_PAGE) + HUGE_PAGE  # room to align the start
    # MAP_PRIVATE: Python's default for an anonymous map is shared memory, which THP `enabled` does not govern
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds the mapping until its last view is gone
    skip = -whole.data_ptr() % HUGE_PAGE
    return whole[skip : skip + nbytes]


def _movable(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized and t.numel() > 0


def rehome(tensors: Iterable[torch.Tensor]) -> int:
    """Move the storages of `tensors` (CPU, strided, non-empty; others, a GPU model's included, are left) into
    one huge-page arena, each storage on its own base-page boundary, and re-point every given tensor at its
    storage's new home (same dtype, offset, size and stride). Returns the bytes moved (0 where `available()` is
    false). One storage's old memory is freed as soon as it is copied, when nothing else holds it, so the peak
    is about one storage over the total."""
    if not available():
        return 0
    groups: dict[int, list[torch.Tensor]] = {}
    storages: dict[int, torch.UntypedStorage] = {}
    seen: set[int] = set()
    for t in tensors:
        if id(t) in seen or not _movable(t):
            continue
        seen.add(id(t))
        s = t.untyped_storage()
        groups.setdefault(s.data_ptr(), []).append(t)
        storages.setdefault(s.data_ptr(), s)
    if not groups:
        return 0
    sizes = {key: _round_up(s.nbytes(), PAGE) for key, s in storages.items()}
    home = arena(sum(sizes.values()))
    offset = 0
    with torch.no_grad():
        for key, views in groups.items():
            old = storages.pop(key)
            base = home[offset : offset + old.nbytes()]
            base.copy_(torch.empty(0, dtype=torch.uint8).set_(old, 0, (old.nbytes(),), (1,)))
            new, byte0 = base.untyped_storage(), base.storage_offset()  # the arena's storage; bytes into it
            for t in views:  # byte0 is a multiple of PAGE, so of every element size
                t.data = torch.empty(0, dtype=t.dtype).set_(
                    new, byte0 // t.element_size() + t.storage_offset(), t.size(), t.stride()
                )
            del old, base
            offset += sizes[key]
    _trim_heap()
    return offset


def _trim_heap() -> None:
    """Hand the freed old storages back to the system: glibc's malloc keeps freed blocks under its dynamic mmap
    threshold in the heap, so the process would otherwise hold both copies of the weights in its resident set
    (docs/measurements/2026-12-03-huge-pages.md); malloc_trim(0) releases the free pages. A no-op where the C
    library has no malloc_trim."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        trim(0)


GROUP_BYTES = 32 << 20  # zeros(): tensors share an arena up to this size


def zeros(count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device = _CPU) -> list[torch.Tensor]:
    """`count` zero tensors of `shape` and `dtype` on `device`: on the CPU where `available()`, on huge pages, back
    to back (each on a base-page boundary) in arenas of up to GROUP_BYTES, or one arena each when one is bigger;
    anywhere else plain `torch.zeros`. Small tensors then share huge pages instead of taking one each, and an
    arena is unmapped when its last tensor goes, so replacing the tensors one by one (a pool growing layer by
    layer) holds at most one arena's worth of old memory beside the new."""
    if device.type != "cpu" or not available() or count == 0:
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    nbytes = dtype.itemsize * int(torch.Size(shape).numel())
    step = _round_up(nbytes, PAGE)
    per = max(1, GROUP_BYTES // max(step, 1))
    out: list[torch.Tensor] = []
    for first in range(0, count, per):
        n = min(per, count - first)
        home = arena(step * n)
        out += [home[i * step : i * step + nbytes].view(dtype).view(shape) for i in range(n)]
    return out
