"""keel.gguf.reader: header, metadata of every type, tensor infos, alignment and validation."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from support.gguf_synth import (
    ARR,
    BOOL,
    F32V,
    F64,
    I8,
    I16,
    I32,
    I64,
    STR,
    T_F32,
    U8,
    U16,
    U32,
    U64,
    GGUFSpec,
    write_gguf,
)

from keel.gguf.quants import GGMLType
from keel.gguf.reader import GGUFError, read_gguf


def _spec(**kw) -> GGUFSpec:
    data = np.arange(64, dtype=np.float32)
    return GGUFSpec(
        metadata=[
            ("u8", U8, 200),
            ("i8", I8, -5),
            ("u16", U16, 60000),
            ("i16", I16, -300),
            ("u32", U32, 4_000_000_000),
            ("i32", I32, -70000),
            ("f32", F32V, 1e-5),
            ("bool", BOOL, True),
            ("str", STR, "héllo"),
            ("u64", U64, 2**40),
            ("i64", I64, -(2**40)),
            ("f64", F64, 0.1),
            ("arr.i32", ARR, (I32, [1, -2, 3])),
            ("arr.str", ARR, (STR, ["a", "", "ç"])),
            ("arr.bool", ARR, (BOOL, [True, False])),
            ("arr.nested", ARR, (ARR, [(U8, [1, 2]), (U8, [])])),
        ],
        tensors=[("a", T_F32, (8, 4), data[:32].tobytes()), ("b", T_F32, (32,), data[32:].tobytes())],
        **kw,
    )


@pytest.mark.parametrize("alignment", [32, 64])
def test_metadata_and_tensors(tmp_path, alignment):
    spec = _spec(alignment=alignment)
    if alignment != 32:
        spec.metadata.append(("general.alignment", U32, alignment))
    with read_gguf(write_gguf(tmp_path / "m.gguf", spec)) as g:
        md = g.metadata
        assert (md["u8"], md["i8"], md["u16"], md["i16"], md["u32"], md["i32"]) == (
            200,
            -5,
            60000,
            -300,
            4e9,
            -70000,
        )
        assert md["f32"] == 1e-5 and md["bool"] is True and md["str"] == "héllo"
        assert (md["u64"], md["i64"], md["f64"]) == (2**40, -(2**40), 0.1)
        assert md["arr.i32"] == [1, -2, 3] and md["arr.str"] == ["a", "", "ç"]
        assert md["arr.bool"] == [True, False] and md["arr.nested"] == [[1, 2], []]
        assert g.data_offset % alignment == 0
        a = g.tensor("a")
        assert a.shape == (4, 8) and a.ggml_type == GGMLType.F32 and a.nbytes == 128
        assert np.array_equal(g.raw("b").view(np.float32), np.arange(32, 64, dtype=np.float32))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"GGML" + b[4:], "not a GGUF file"),
        (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "version 1 is not supported"),
        (lambda b: b[:4] + struct.pack("<I", 3 << 24) + b[8:], "big-endian"),
        (lambda b: b[: len(b) - 40], "truncated download"),
        (lambda b: b[:300], "truncated while reading"),
        (lambda b: b[:10], "too short"),
    ],
)
def test_corrupt_files_are_rejected(tmp_path, mutate, message):
    good = write_gguf(tmp_path / "good.gguf", _spec()).read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mutate(good))
    with pytest.raises(GGUFError, match=message):
        read_gguf(bad)


def test_bad_tensor_infos(tmp_path):
    spec = _spec()
    spec.tensors.append(("q", 3, (31, 2), b"\0" * 64))  # Q4_1 rows must be a multiple of 32
    with pytest.raises(GGUFError, match="'q'.*multiple of the Q4_1 block size 32"):
        read_gguf(write_gguf(tmp_path / "a.gguf", spec))
    spec = _spec()
    spec.tensors.append(("x", 99, (32,), b"\0" * 64))
    with pytest.raises(GGUFError, match="'x' has unknown ggml type 99"):
        read_gguf(write_gguf(tmp_path / "b.gguf", spec))
    with pytest.raises(GGUFError, match="unknown value type 42"):
        read_gguf(_write_raw_type(tmp_path))
    with pytest.raises(GGUFError, match="no such GGUF file"):
        read_gguf(tmp_path / "missing.gguf")


def _write_raw_type(tmp_path):
    """A file whose only metadata entry has value type 42."""
    key = b"bad"
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 42)
    path = tmp_path / "raw.gguf"
    path.write_bytes(body + b"\0" * 16)
    return path


def _nested(depth: int) -> tuple[int, object]:
    """An array of arrays `depth` levels deep, innermost one u32."""
    value: tuple[int, object] = (U32, [7])
    for _ in range(depth - 1):
        value = (ARR, [value])
    return value


def test_nested_arrays_within_the_limit_read(tmp_path):
    from keel.gguf.reader import MAX_ARRAY_DEPTH

    path = write_gguf(tmp_path / "ok.gguf", GGUFSpec(metadata=[("nest", ARR, _nested(MAX_ARRAY_DEPTH))]))
    with read_gguf(path) as g:
        v = g.get("nest")
    for _ in range(MAX_ARRAY_DEPTH - 1):
        (v,) = v
    assert v == [7]


@pytest.mark.parametrize("depth", [9, 5000])
def test_deeply_nested_arrays_are_a_clear_error(tmp_path, depth):
    # a crafted file: 5000 levels used to end in RecursionError; the writer itself recurses, so build bytes
    inner = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    blob = struct.pack("<IQ", ARR, 1) * (depth - 1) + inner
    key = b"nest"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", ARR)
    path = tmp_path / "deep.gguf"
    path.write_bytes(head + blob + b"\0" * 32)
    with pytest.raises(GGUFError, match=r"deep\.gguf: metadata 'nest'(\[0\])* nests arrays more than 8 deep"):
        read_gguf(path)


def test_array_of_arrays_count_beyond_file_is_refused(tmp_path):
    key = b"nest"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", ARR)
    path = tmp_path / "many.gguf"
    path.write_bytes(head + struct.pack("<IQ", ARR, 2**40) + b"\0" * 64)
    with pytest.raises(GGUFError, match=r"claims 1099511627776 arrays; the file is too short"):
        read_gguf(path)
