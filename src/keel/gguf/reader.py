"""A small, validating GGUF reader: header, metadata, tensor infos and memory-mapped tensor data.

Metadata arrays are bounded by count (each, and all of them together) and by what the file holds, and kept
compact: numbers as numpy arrays, strings as a `StringArray` (one bytes buffer and its offsets); no Python
list of a whole array is built while reading. A crafted 300 MB sparse file claiming 3e8 booleans is an
error before any of it is read."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from ..hf.errors import CheckpointError
from .quants import GGMLType, tensor_nbytes

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4
_MAX_STRING = 64 << 20  # no sane key, token, template or embedded tokenizer.json is 64 MiB long
MAX_ARRAY_DEPTH = 8  # arrays of arrays: llama.cpp writes none; bounded so a crafted file cannot recurse
MAX_ARRAY = 1 << 21  # elements of one metadata array (the largest vocabularies and merge lists: ~300,000)
MAX_ARRAY_TOTAL = 1 << 22  # elements of all metadata arrays together
_CONTINUATION = np.zeros(256, dtype=bool)
_CONTINUATION[0x80:0xC0] = True  # UTF-8 bytes that cannot start a character


class GGUFError(CheckpointError):
    """A GGUF file is malformed, truncated or uses something keel cannot read."""


_MISSING: Any = object()


class ValueType(IntEnum):
    """Type tags of GGUF metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# scalar value types -> struct format (little-endian) and the numpy dtype used for arrays of them
_SCALARS: dict[ValueType, tuple[str, str]] = {
    ValueType.UINT8: ("<B", "<u1"),
    ValueType.INT8: ("<b", "<i1"),
    ValueType.UINT16: ("<H", "<u2"),
    ValueType.INT16: ("<h", "<i2"),
    ValueType.UINT32: ("<I", "<u4"),
    ValueType.INT32: ("<i", "<i4"),
    ValueType.FLOAT32: ("<f", "<f4"),
    ValueType.BOOL: ("<?", "<u1"),
    ValueType.UINT64: ("<Q", "<u8"),
    ValueType.INT64: ("<q", "<i8"),
    ValueType.FLOAT64: ("<d", "<f8"),
}


class StringArray(SequenceABC[str]):
    """A metadata array of strings kept compact: the UTF-8 bytes of all of them in one buffer and int64 offsets
    (n + 1); an item is decoded when it is read. Compares equal to a list of the same strings."""

    __slots__ = ("_blob", "_offsets")

    def __init__(self, blob: bytes | bytearray, offsets: np.ndarray) -> None:
        self._blob, self._offsets = blob, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"StringArray index {i} out of range for {len(self)} strings")
        i %= len(self)
        return self._blob[int(self._offsets[i]) : int(self._offsets[i + 1])].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        text, offsets = self._blob, self._offsets.tolist()
        return (text[a:b].decode("utf-8") for a, b in zip(offsets, offsets[1:], strict=False))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry: ``dims`` in GGUF order (fastest first); ``offset`` is absolute in the file."""

    name: str
    dims: tuple[int, ...]
    ggml_type: GGMLType
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The torch/numpy shape: GGUF dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) if self.dims else 1


@dataclass(slots=True)
class GGUFFile:
    """A parsed GGUF file; tensor bytes stay in the memory map until asked for."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int
    _buf: mmap.mmap | bytes = field(repr=False)

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name`` as a read-only uint8 view."""
        info = self.tensor(name)
        return np.frombuffer(self._buf, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        """A metadata value that must be present."""
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
        return self.metadata[key]

    def _typed(self, key: str, default: Any, ok: Any, expected: str) -> Any:
        if key not in self.metadata:
            if default is _MISSING:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing; expected {expected}")
            return default
        value = self.metadata[key]
        if not ok(value):
            is_array = isinstance(value, list | np.ndarray | StringArray)
            shown = f"an array of {len(value)}" if is_array else repr(value)
            raise GGUFError(f"{self.path}: metadata {key!r} must be {expected}, got {shown[:80]}")
        return value

    def get_int(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> Any:
        """An integer-typed value in [lo, hi] (a GGUF bool is not an integer)."""
        return self._typed(key, default, lambda v: type(v) is int and lo <= v <= hi, f"an integer in [{lo}, {hi}]")

    def get_float(self, key: str, lo: float, hi: float, default: Any = _MISSING) -> Any:
        """A finite number in (lo, hi]."""

        def ok(v: Any) -> bool:
            return type(v) in (int, float) and lo < v <= hi

        return float(self._typed(key, default, ok, f"a finite number in ({lo:g}, {hi:g}]"))

    def get_str(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, str), "a string")

    def get_bool(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, bool), "a bool")

    def get_list(self, key: str, elem: type, default: Any = _MISSING) -> Any:
        """An array whose every element has Python type `elem` (str, int, float or bool), as a list."""
        name = {str: "strings", int: "integers", float: "numbers", bool: "bools"}.get(elem, elem.__name__)
        kinds = {int: "iu", float: "f", bool: "b"}.get(elem, "")

        def ok(v: Any) -> bool:
            if isinstance(v, StringArray):
                return elem is str
            if isinstance(v, np.ndarray):
                return v.dtype.kind in kinds
            return isinstance(v, list) and all(type(x) is elem for x in v)

        value = self._typed(key, default, ok, f"an array of {name}")
        return value.tolist() if isinstance(value, np.ndarray) else list(value) if value is not None else None

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            try:
                self._buf.close()
            except BufferError:
                pass  # numpy views still alive; the map goes when they do

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path
        self.elements = 0  # metadata array elements read so far (MAX_ARRAY_TOTAL)

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated while reading {what}: need {n} bytes at offset {self.pos}, "
                f"file has {self.size}"
            )
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        if n > _MAX_STRING:
            raise GGUFError(f"{self.path}: {what} claims a length of {n} bytes; the file is corrupt")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8 ({exc})") from None

    def value(self, vtype: int, what: str) -> Any:
        vtype = _value_type(vtype, what, self.path)
        if vtype == ValueType.STRING:
            return self.string(what)
        if vtype == ValueType.ARRAY:
            return self.array(what)
        value = self.scalar(_SCALARS[vtype][0], what)
        return float(str(np.float32(value))) if vtype == ValueType.FLOAT32 else value

    def array(self, what: str, depth: int = 1) -> list[Any] | np.ndarray | StringArray:
        """A metadata array: numbers as a read-only numpy array, strings as a StringArray, arrays as a list."""
        if depth > MAX_ARRAY_DEPTH:
            raise GGUFError(
                f"{self.path}: {what} nests arrays more than {MAX_ARRAY_DEPTH} deep; "
                "no GGUF model needs that (a damaged or crafted file)"
            )
        etype = _value_type(self.u32(f"element type of {what}"), f"elements of {what}", self.path)
        count = self.u64(f"element count of {what}")
        if etype == ValueType.STRING:
            if count > (self.size - self.pos) // 8:  # every string needs at least its 8-byte length
                raise GGUFError(f"{self.path}: {what} claims {count} strings; the file is too short")
            self._count(count, what)
            return self.strings(count, what)
        if etype == ValueType.ARRAY:
            if count > (self.size - self.pos) // 12:  # every inner array needs its 12-byte header
                raise GGUFError(f"{self.path}: {what} claims {count} arrays; the file is too short")
            self._count(count, what)
            return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]
        dtype = np.dtype(_SCALARS[etype][1])
        start = self.take(count * dtype.itemsize, what)
        self._count(count, what)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()
        if etype == ValueType.BOOL:
            values = values.astype(bool)
        values.flags.writeable = False
        return values

    def _count(self, count: int, what: str) -> None:
        """Refuse an array longer than MAX_ARRAY, or one that takes all arrays past MAX_ARRAY_TOTAL."""
        self.elements += count
        if count > MAX_ARRAY or self.elements > MAX_ARRAY_TOTAL:
            raise GGUFError(
                f"{self.path}: {what} claims {count} elements; expected at most {MAX_ARRAY} in one array and "
                f"{MAX_ARRAY_TOTAL} in all metadata arrays (a damaged or crafted file)"
            )

    def strings(self, count: int, what: str) -> StringArray:
        """`count` strings into one buffer; each must be UTF-8 on its own (checked on the whole buffer, and no
        string may start inside a character)."""
        offsets = np.zeros(count + 1, dtype=np.int64)
        blob = bytearray()
        for i in range(count):
            n = self.u64(f"length of {what}[{i}]")
            if n > _MAX_STRING:
                raise GGUFError(f"{self.path}: {what}[{i}] claims a length of {n} bytes; the file is corrupt")
            start = self.take(n, f"{what}[{i}]")
            blob += self.buf[start : start + n]
            offsets[i + 1] = len(blob)
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = int(np.searchsorted(offsets, exc.start, side="right")) - 1
            raise GGUFError(f"{self.path}: {what}[{bad}] is not valid UTF-8 ({exc.reason})") from None
        starts = offsets[:-1][offsets[1:] > offsets[:-1]]
        split = starts[_CONTINUATION[np.frombuffer(blob, dtype=np.uint8)[starts]]] if len(starts) else starts
        if len(split):
            bad = int(np.searchsorted(offsets, split[0], side="right")) - 1
            raise GGUFError(f"{self.path}: {what}[{bad}] is not valid UTF-8 (it starts inside a character)")
        return StringArray(blob, offsets)


def _value_type(vtype: int, what: str, path: Path) -> ValueType:
    try:
        return ValueType(vtype)
    except ValueError:
        raise GGUFError(f"{path}: {what} has unknown value type {vtype} (expected 0..12)") from None


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse and validate ``path``: every tensor must lie inside the file with its expected size."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise GGUFError(f"{path}: {size} bytes is too short for a GGUF header (24 bytes)")
        buf: mmap.mmap | bytes = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buf, path)
    except BaseException:
        if isinstance(buf, mmap.mmap):
            buf.close()
        raise


def _parse(buf: mmap.mmap | bytes, path: Path) -> GGUFFile:
    cur = _Cursor(buf, path)
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (big-endian files are not supported)" if version & 0xFFFF == 0 else ""
        raise GGUFError(f"{path}: GGUF version {version} is not supported, expected one of {SUPPORTED_VERSIONS}{hint}")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_tensors > _count_limit(cur) or n_kv > _count_limit(cur):
        raise GGUFError(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata entries; the file is corrupt")

    metadata: dict[str, Any] = {}
    prev = ""
    for i in range(n_kv):
        # a bad length or count in an earlier entry shows up here: say which entry came before
        key = cur.string(f"metadata key #{i}" + (f" (after metadata {prev!r})" if prev else ""))
        metadata[key] = cur.value(cur.u32(f"type of {key!r}"), f"metadata {key!r}")
        prev = key

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment must be a positive power of two, got {alignment!r}")

    infos: list[tuple[str, tuple[int, ...], GGMLType, int]] = []
    for i in range(n_tensors):
        after = f"after tensor {infos[-1][0]!r}" if infos else f"after metadata {prev!r}, the last of {n_kv}"
        name = cur.string(f"name of tensor #{i} ({after})")
        n_dims = cur.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions, expected 1..{_MAX_DIMS}")
        dims = tuple(cur.u64(f"dims of {name!r}") for _ in range(n_dims))
        raw_type = cur.u32(f"type of {name!r}")
        try:
            ggml_type = GGMLType(raw_type)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name!r} has unknown ggml type {raw_type}") from None
        infos.append((name, dims, ggml_type, cur.u64(f"offset of {name!r}")))

    data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, dims, ggml_type, rel in infos:
        if name in tensors:
            raise GGUFError(f"{path}: tensor {name!r} appears twice")
        if rel % alignment:
            raise GGUFError(
                f"{path}: tensor {name!r} offset {rel} is not a multiple of the alignment {alignment} "
                "(general.alignment, default 32)"
            )
        try:
            nbytes = tensor_nbytes(ggml_type, dims)
        except ValueError as exc:
            raise GGUFError(f"{path}: tensor {name!r}: {exc}") from None
        start = data_offset + rel
        if start + nbytes > len(buf):
            raise GGUFError(
                f"{path}: tensor {name!r} needs bytes {start}..{start + nbytes} but the file has only "
                f"{len(buf)} bytes (truncated download?)"
            )
        tensors[name] = TensorInfo(name, dims, ggml_type, start, nbytes)
    _check_packing(path, tensors, data_offset, alignment, len(buf))
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, buf)


def _check_packing(path: Path, tensors: dict[str, TensorInfo], data_offset: int, alignment: int, size: int) -> None:
    """Tensor data is packed in tensor-info order, each padded to the alignment (llama.cpp's gguf reader
    requires exactly this), so a wrong type, dims or offset in any tensor info shows up here."""
    pos, prev = data_offset, ""
    for t in tensors.values():
        if t.offset != pos:
            before = f"tensor {prev!r} ends (padded) at {pos}" if prev else f"the data section starts at {pos}"
            raise GGUFError(
                f"{path}: tensor {t.name!r} has its data at byte {t.offset}, but {before}; GGUF packs tensors in "
                "order, so its offset, or the type or dims of a tensor before it, is corrupt"
            )
        pos, prev = t.offset + -(-t.nbytes // alignment) * alignment, t.name
    if prev and size > pos:  # writers end the file at the last tensor's (padded) end: more means a wrong size
        last = tensors[prev]
        raise GGUFError(
            f"{path}: {size - last.offset - last.nbytes} bytes follow the last tensor {prev!r} "
            f"({last.ggml_type.name}, dims {last.dims}); its type or dims are corrupt, or bytes were appended"
        )


def _count_limit(cur: _Cursor) -> int:
    """An upper bound for any count in the header: each entry takes at least 8 bytes."""
    return cur.size // 8
