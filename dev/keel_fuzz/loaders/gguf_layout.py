"""A byte-level model of a GGUF file for the loader fuzzer: parse, edit, write back.

Independent of keel's reader (src/keel/gguf/reader.py) so that a bug there cannot hide in the harness.
Metadata values keep their encoded bytes, so an edit touches only the entry it is about.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}
_FMT |= {U64: "<Q", I64: "<q", F64: "<d"}


def encode_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: int, value: Any) -> bytes:
    """The bytes of a metadata value (without its type tag); arrays are `(element_type, items)`."""
    if vtype == STR:
        return encode_str(value)
    if vtype == ARR:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, v) for v in items)
    return struct.pack(_FMT[vtype], value)


@dataclass
class KV:
    """One metadata entry; `tail` (type tag + value bytes) is written verbatim."""

    key: str | bytes
    vtype: int
    tail: bytes
    etype: int | None = None  # element type of an array
    count: int | None = None  # element count of an array
    key_length: int | None = None  # written instead of len(key) when set (a lying length field)

    @staticmethod
    def make(key: str, vtype: int, value: Any) -> KV:
        kv = KV(key, vtype, struct.pack("<I", vtype) + encode_value(vtype, value))
        if vtype == ARR:
            kv.etype, kv.count = value[0], len(value[1])
        return kv


@dataclass
class TensorInfo:
    name: str | bytes
    dims: list[int]
    ttype: int
    offset: int  # relative to the data section
    n_dims: int | None = None  # written instead of len(dims) when set


@dataclass
class Layout:
    """A parsed GGUF file: header, metadata, tensor infos and the data section (kept as bytes)."""

    magic: bytes
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes
    alignment: int = 32
    n_tensors: int | None = None  # count overrides, for header mutations
    n_kv: int | None = None
    sections: dict[str, int] = field(default_factory=dict)  # byte offsets of the original file's sections

    def kv(self, key: str) -> KV:
        return next(kv for kv in self.kvs if kv.key == key)

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name)

    def to_bytes(self) -> bytes:
        n_t = len(self.tensors) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        out = bytearray(self.magic + struct.pack("<IQQ", self.version, n_t, n_kv))
        for kv in self.kvs:
            key = encode_str(kv.key)
            if kv.key_length is not None:
                key = struct.pack("<Q", kv.key_length) + key[8:]
            out += key + kv.tail
        for t in self.tensors:
            n_dims = len(t.dims) if t.n_dims is None else t.n_dims
            out += encode_str(t.name) + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.ttype, t.offset)
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out) + self.data


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return s

    def skip_value(self, vtype: int) -> tuple[int | None, int | None]:
        if vtype == STR:
            self.string()
        elif vtype == ARR:
            etype, count = self.take("<I"), self.take("<Q")
            for _ in range(count):
                self.skip_value(etype)
            return etype, count
        else:
            self.pos += struct.calcsize(_FMT[vtype])
        return None, None


def parse(buf: bytes) -> Layout:
    """Parse a valid GGUF v2/v3 file."""
    r = _Reader(buf)
    magic = buf[:4]
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    sections = {"metadata": r.pos}
    kvs = []
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        start = r.pos
        vtype = r.take("<I")
        etype, count = r.skip_value(vtype)
        kvs.append(KV(key, vtype, bytes(buf[start : r.pos]), etype, count))
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", buf, start + 4)[0]
    sections["tensor_infos"] = r.pos
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append(TensorInfo(name, dims, r.take("<I"), r.take("<Q")))
    data_start = -(-r.pos // alignment) * alignment
    sections["data"] = data_start
    return Layout(magic, version, kvs, tensors, bytes(buf[data_start:]), alignment, sections=sections)
