"""Read and validate a safetensors header without touching tensor data; errors name the file and the tensor.

Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object: tensor name ->
{dtype, shape, data_offsets}, plus an optional `__metadata__` of strings), then the data section.
Checked as the safetensors library itself requires: a known dtype, shape x dtype size equal to the
byte range, ranges that tile the data section exactly (no overlap, no gap, nothing after the last).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError

# safetensors dtype names -> bytes per element (sub-byte F4/F6 formats are not loadable by keel)
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
MAX_HEADER = 100_000_000  # the safetensors library's own limit
_MAX_DIM = 1 << 48


class WeightsError(CheckpointError):
    """Checkpoint weights that are missing, corrupt, truncated or do not fit the model."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One header entry; `begin`/`end` are byte offsets inside the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    path: Path
    data_start: int  # 8 + header length
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


class _Duplicate(Exception):
    pass


def read_header(path: Path) -> SafetensorsHeader:
    """Parse and validate the header of `path` (reads 8 + N bytes, never the tensor data)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            if size < 8:
                raise WeightsError(
                    f"{path}: {size} bytes is too short for a safetensors file (an 8-byte header length comes "
                    "first); the file is truncated"
                )
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_HEADER or 8 + n > size:
                raise WeightsError(
                    f"{path}: the header length field says {n} bytes, but "
                    + (f"the limit is {MAX_HEADER}" if n > MAX_HEADER else f"only {size - 8} bytes follow it")
                    + "; the file is truncated or not a safetensors file"
                )
            raw = fh.read(n)
    except OSError as exc:
        raise WeightsError(f"cannot read {path}: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise WeightsError(f"{path}: the header is not UTF-8 ({exc}); the file is corrupt") from None
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: the header ({n} bytes) is not valid JSON: {exc}; the file is corrupt") from None
    except _Duplicate as exc:
        raise WeightsError(f"{path}: tensor {exc.args[0]!r} appears twice in the header") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: the header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise WeightsError(f"{path}: __metadata__ must map strings to strings, got {metadata!r:.80}")
    tensors = {name: _entry(path, name, e) for name, e in header.items()}
    _check_tiling(path, tensors, size - 8 - n, n)
    return SafetensorsHeader(path, 8 + n, tensors, metadata)


def _entry(path: Path, name: str, e: Any) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(e, dict):
        raise WeightsError(
            f"{where}: the header entry must be an object with dtype, shape and data_offsets, got {e!r:.60}"
        )
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise WeightsError(f"{where}: dtype {dtype!r} is not a safetensors dtype ({', '.join(DTYPE_SIZES)})")
    if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d <= _MAX_DIM for d in shape):
        raise WeightsError(f"{where}: shape must be a list of non-negative integers, got {shape!r:.60}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise WeightsError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r:.60}")
    need = math.prod(shape) * DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != need:
        raise WeightsError(
            f"{where}: shape {shape} of {dtype} takes {need} bytes, but data_offsets {offsets} hold "
            f"{offsets[1] - offsets[0]}"
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_tiling(path: Path, tensors: dict[str, TensorEntry], data_size: int, header_len: int) -> None:
    """The byte ranges must cover the data section exactly, in some order."""
    pos, prev = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < pos:
            raise WeightsError(
                f"{path}: tensor {t.name!r} (data_offsets [{t.begin}, {t.end}]) overlaps tensor {prev!r}; "
                "the header is corrupt"
            )
        if t.begin > pos:
            after = f"after tensor {prev!r}" if prev else "at the start of the data"
            raise WeightsError(
                f"{path}: bytes {pos}..{t.begin} of the data belong to no tensor ({after}, before tensor "
                f"{t.name!r}): a header entry is missing or the data_offsets are corrupt"
            )
        if t.end > data_size:
            raise WeightsError(
                f"{path}: tensor {t.name!r} needs bytes {t.begin}..{t.end} of the data, but the file holds "
                f"only {data_size}; the file is truncated"
            )
        pos, prev = t.end, t.name
    if pos < data_size:
        raise WeightsError(
            f"{path}: {data_size - pos} bytes follow the last tensor {prev!r}, where the file should end: the "
            f"header length field ({header_len}) is wrong, a header entry is missing, or bytes were appended"
        )
