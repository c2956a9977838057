"""keel.gguf.reader: header, metadata of every type, tensor infos, alignment and validation; metadata arrays kept
compact and bounded (a sparse 300 MB file claiming 3e8 booleans is a clear error, read in a child under a bound)."""

from __future__ import annotations

import json
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
from keel.gguf.reader import MAX_ARRAY, MAX_ARRAY_TOTAL, GGUFError, StringArray, read_gguf


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
        assert md["arr.i32"].dtype == np.int32 and md["arr.i32"].tolist() == [1, -2, 3]
        assert isinstance(md["arr.str"], StringArray) and md["arr.str"] == ["a", "", "ç"]
        assert md["arr.bool"].tolist() == [True, False] and [a.tolist() for a in md["arr.nested"]] == [[1, 2], []]
        assert g.get_list("arr.i32", int) == [1, -2, 3] and g.get_list("arr.str", str) == ["a", "", "ç"]
        assert g.get_list("arr.bool", bool) == [True, False]
        with pytest.raises(GGUFError, match="'arr.i32' must be an array of strings, got an array of 3"):
            g.get_list("arr.i32", str)
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
    assert v.tolist() == [7]


@pytest.mark.parametrize("depth", [9, 5000])
def test_deeply_nested_arrays_are_a_clear_error(tmp_path, depth):
    # a crafted file 5000 levels deep must not recurse that deep; the writer itself recurses, so build bytes
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


def _one_array(path, etype: int, count: int, body: bytes = b"", size: int = 0):
    """A file whose one metadata entry `key` is an array of `count` elements of `etype`: `body`, then zeros up to
    `size` bytes (a sparse file: nothing past `body` is written)."""
    key = b"key"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", ARR)
    head += struct.pack("<IQ", etype, count) + body
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(max(size, len(head) + 32))
    return path


def test_string_arrays_are_compact_and_read_like_lists(tmp_path):
    words = ["a", "", "ç", "token", "é"]
    body = b"".join(struct.pack("<Q", len(w.encode())) + w.encode() for w in words)
    with read_gguf(_one_array(tmp_path / "s.gguf", STR, len(words), body)) as g:
        arr = g.get("key")
    assert isinstance(arr, StringArray) and len(arr) == 5 and list(arr) == words and arr == words
    assert (
        (arr[0], arr[-1], arr[1:3]) == ("a", "é", ["", "ç"])
        and arr != words[:4]
        and repr(arr) == "StringArray(5 strings)"
    )
    with pytest.raises(IndexError):
        arr[5]


@pytest.mark.parametrize(
    ("pieces", "bad"),
    [([b"ok", b"\xff"], 1), ([b"\xc3", b"\xa9"], 1), ([b"x", b"\xc3"], 1)],
    ids=["byte", "split", "cut"],
)
def test_string_array_elements_must_be_utf8_each(tmp_path, pieces, bad):
    """Each string on its own: two halves of one character in consecutive strings are two invalid strings."""
    body = b"".join(struct.pack("<Q", len(p)) + p for p in pieces)
    with pytest.raises(GGUFError, match=rf"metadata 'key'\[{bad}\] is not valid UTF-8"):
        read_gguf(_one_array(tmp_path / "u.gguf", STR, len(pieces), body))


def test_metadata_arrays_are_bounded_in_count(tmp_path):
    with pytest.raises(GGUFError, match=rf"'key' claims {MAX_ARRAY + 1} elements; expected at most {MAX_ARRAY}"):
        read_gguf(_one_array(tmp_path / "one.gguf", BOOL, MAX_ARRAY + 1, size=MAX_ARRAY + 64))
    key = b"k"
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<I", ARR) + struct.pack("<IQ", U8, MAX_ARRAY)
    n = MAX_ARRAY_TOTAL // MAX_ARRAY + 1  # each array within the bound, all of them past the total
    path = tmp_path / "all.gguf"
    with open(path, "wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n))
        for i in range(n):
            fh.write(entry.replace(b"k", str(i % 10).encode()) + bytes(MAX_ARRAY))
    with pytest.raises(GGUFError, match=f"and {MAX_ARRAY_TOTAL} in all metadata arrays"):
        read_gguf(path)


_READ_IN_A_CHILD = """
import json, sys, time
from keel.gguf.reader import GGUFError, read_gguf


def status(key):
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith(key))


open("/proc/self/clear_refs", "w").write("5")  # VmHWM restarts from the RSS after the imports
base, t0 = status("VmRSS:"), time.process_time()
try:
    read_gguf(sys.argv[1]).close()
    error = None
except GGUFError as exc:
    error = str(exc)
print(json.dumps({"error": error, "cpu_s": time.process_time() - t0, "peak_rss": status("VmHWM:") - base}))
"""


def test_a_sparse_file_claiming_3e8_booleans_is_a_clear_error_under_the_bound(tmp_path):
    """300 MB on paper, a few KB on disk: refused before the array is read (no list of 3e8 bools)."""
    import subprocess
    import sys

    path = _one_array(tmp_path / "bools.gguf", BOOL, 300_000_000, size=300_000_100)
    assert path.stat().st_blocks * 512 < 1 << 20
    done = subprocess.run(
        [sys.executable, "-c", _READ_IN_A_CHILD, str(path)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["error"] and "'key' claims 300000000 elements" in got["error"]
    assert got["peak_rss"] < 256 << 20 and got["cpu_s"] < 10, got  # (peak RSS above what the imports left)
