"""keel-audit stays under 1 GB of RSS and exits 2 on every hostile input; the metadata, dynamic-section and
zip-ratio cases exit 2 under 256 MiB of address space and 10 s of CPU.

Each case runs keel-audit in a child process (hostile_inputs.run_audit: killed if it passes the
bound, peak RSS from /proc) on an input built small in tmp_path: overlapping zip entries, many
members only the pyelftools fallback reads, a large member, a sparse 10 GiB `.so`, a sparse ELF
with 65,535 section headers of 65,535 bytes each, bad `--policy` files, metadata members and installed
metadata files past the metadata limit (METADATA, WHEEL, RECORD, torch/version.py), a GiB member that
compresses too well, and a `.so` whose PT_DYNAMIC holds 4 million DT_NEEDED entries.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hostile_inputs import (
    AS_LIMIT,
    CPU_LIMIT,
    GIB,
    MIB,
    RSS_LIMIT,
    deflate_pattern,
    deflate_zeros,
    elf_header,
    fallback_bait,
    needed_flood,
    raw_zip,
    run_audit,
    sparse_file,
    stored,
)

from keel_audit import policy as policy_module
from keel_audit.wheelzip import MAX_METADATA


def _check(run_args: list[str], *needles: str) -> str:
    run = run_audit(run_args)
    assert run.peak_rss < RSS_LIMIT and not run.killed, f"{run_args}: {run.describe()}; expected < 1 GiB"
    assert run.rc == 2, f"{run_args}: {run.describe()}; expected exit 2\n{run.stderr[-2000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    for needle in needles:
        assert needle in run.stderr, f"{needle!r} not in\n{run.stderr[-2000:]}"
    return run.stderr


@pytest.mark.parametrize("entries", [32, 500])
def test_overlapping_entries_refused(tmp_path: Path, entries: int) -> None:
    """Many central-directory entries naming one 64 MiB member (67 KB on disk for 32 entries)."""
    member = deflate_zeros(fallback_bait(), 64)
    names = [f"pkg/lib{i}.so" for i in range(entries)]
    wheel = raw_zip(tmp_path / "overlap-1.0-cp310-abi3-linux_x86_64.whl", [(names[0], member)], [(n, 0) for n in names])
    assert wheel.stat().st_size < 200_000
    _check([str(wheel)], str(wheel), "overlap", "pkg/lib0.so", "pkg/lib1.so")


def test_members_not_kept_after_their_verdict(tmp_path: Path) -> None:
    """32 distinct 64 MiB members that fail in the fallback: none stays in memory after its verdict."""
    member = deflate_zeros(fallback_bait(), 64)
    members = [(f"pkg/lib{i}.so", member) for i in range(32)]
    wheel = raw_zip(tmp_path / "many-1.0-cp310-abi3-linux_x86_64.whl", members)
    assert wheel.stat().st_size < 4 * MIB
    _check([str(wheel)], "pkg/lib0.so", "pkg/lib31.so")


@pytest.mark.parametrize("elf_class", [2, 3], ids=["no-sections", "odd-class"])
def test_fallback_reads_a_large_member_in_pieces(tmp_path: Path, elf_class: int) -> None:
    """One 240 MiB member (ratio ~115, under the zip-bomb bound of its size) that only the fallback reads."""
    member = deflate_zeros(fallback_bait(elf_class), 240, pad=8192)
    wheel = raw_zip(tmp_path / "big-1.0-cp310-abi3-linux_x86_64.whl", [("pkg/big.so", member)])
    _bounded([str(wheel)], "pkg/big.so")


@pytest.mark.parametrize("elf_class", [2, 3], ids=["no-sections", "odd-class"])
def test_fallback_reads_a_sparse_file_in_pieces(tmp_path: Path, elf_class: int) -> None:
    """A sparse 10 GiB `.so` that only the fallback reads."""
    so = sparse_file(tmp_path / "sparse.so", fallback_bait(elf_class), 10 * GIB)
    _check([str(so)], "sparse.so")


def test_huge_section_header_table_refused(tmp_path: Path) -> None:
    """65,535 section headers of 65,535 bytes each: a 4.3 GB table in a sparse file."""
    size = 64 + 65535 * 65535
    so = sparse_file(tmp_path / "shdrs.so", elf_header(shoff=64, shnum=65535, shentsize=65535), size)
    _check([str(so)], "shdrs.so", "e_shentsize")


def _bounded(run_args: list[str], *needles: str, paths: tuple[str, ...] = ()) -> None:
    """Exit 2, no traceback, under RLIMIT_AS AS_LIMIT and RLIMIT_CPU CPU_LIMIT; stderr names every needle."""
    run = run_audit(run_args, timeout=120, address_space=AS_LIMIT, cpu_seconds=CPU_LIMIT, paths=paths)
    bound = f"{AS_LIMIT >> 20} MiB of address space and {CPU_LIMIT} s of CPU"
    assert run.rc == 2 and not run.killed, f"{run_args}: {run.describe()}; expected exit 2 under {bound}\n{run.stderr}"
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    for needle in needles:
        assert needle in run.stderr, f"{needle!r} not in\n{run.stderr[-2000:]}"


@pytest.mark.parametrize("member", ["METADATA", "WHEEL"])
def test_metadata_member_past_the_limit_exits_2(tmp_path: Path, member: str) -> None:
    """A 48 MiB metadata member (48 KB in the wheel, under any ratio bound: too small for one) is not read."""
    big = deflate_zeros(b"Metadata-Version: 2.1\n" if member == "METADATA" else b"Tag: py3-none-any\n", 48)
    small = stored(b"Tag: py3-none-any\n" if member == "METADATA" else b"Metadata-Version: 2.1\n")
    other = "WHEEL" if member == "METADATA" else "METADATA"
    wheel = raw_zip(
        tmp_path / "meta-1.0-py3-none-any.whl",
        [(f"meta-1.0.dist-info/{member}", big), (f"meta-1.0.dist-info/{other}", small)],
    )
    _bounded([str(wheel)], f"meta-1.0.dist-info/{member}", f"at most {MAX_METADATA}")


def test_gib_member_compressing_too_well_exits_2(tmp_path: Path) -> None:
    """A 7 MB wheel whose METADATA inflates to 1 GiB (ratio ~146, under the bound for 64 MiB members)."""
    member = deflate_zeros(b"Metadata-Version: 2.1\n", 1024, pad=6144)
    wheel = raw_zip(tmp_path / "bomb-1.0-py3-none-any.whl", [("bomb-1.0.dist-info/METADATA", member)])
    assert wheel.stat().st_size < 8 * MIB
    _bounded([str(wheel)], "bomb-1.0.dist-info/METADATA", "expands 146x")


def test_preflight_torch_wheel_with_a_large_version_py_exits_2(tmp_path: Path) -> None:
    version = deflate_zeros(b"__version__ = '2.99.0'\n", 48)
    torch = raw_zip(tmp_path / "torch-2.99.0-cp311-cp311-linux_x86_64.whl", [("torch/version.py", version)])
    (tmp_path / "target").mkdir()
    _bounded(["preflight", str(tmp_path / "target"), "--torch", str(torch)], "torch/version.py", "metadata file")


def test_preflight_installed_torch_with_a_sparse_version_py_exits_2(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    sparse_file(site / "torch" / "version.py", b"__version__ = '2.99.0'\n", GIB)
    (tmp_path / "target").mkdir()
    _bounded(["preflight", str(tmp_path / "target"), "--torch", str(site)], "version.py", "1073741824 bytes")


@pytest.mark.parametrize("member", ["METADATA", "RECORD"])
def test_installed_distribution_with_a_sparse_metadata_file_exits_2(tmp_path: Path, member: str) -> None:
    dist_info = tmp_path / "fakedist-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "WHEEL").write_text("Tag: py3-none-any\n")
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\n")
    (dist_info / "RECORD").write_text("fakedist/__init__.py,,\n")
    sparse_file(dist_info / member, b"fakedist/__init__.py,,\n", GIB)
    _bounded(["fakedist"], f"fakedist-1.0.dist-info/{member}", "1073741824 bytes", paths=(str(tmp_path),))


def test_dynamic_segment_of_millions_of_needed_entries_exits_2(tmp_path: Path) -> None:
    """A 64 MiB `.so` without section headers whose PT_DYNAMIC holds 4 million DT_NEEDED entries (no DT_NULL):
    the pyelftools fallback would parse every one."""
    entries = (64 * MIB - 128) // 16
    member = deflate_pattern(needed_flood(entries), struct.pack("<qQ", 1, 0), 64)
    wheel = raw_zip(tmp_path / "flood-1.0-cp311-cp311-linux_x86_64.whl", [("flood/libflood.so", member)])
    assert wheel.stat().st_size < 256 * 1024
    _bounded([str(wheel)], "flood/libflood.so", "DT_NULL")


def _policy_cases(tmp: Path) -> dict[str, Path]:
    default = str(policy_module.POLICY_FILE)
    cases = {
        "nested": "[" * 100_000 + "]" * 100_000,
        "nested-object": '{"schema": 2, "extends": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
        "extends-number": json.dumps({"schema": 2, "extends": 5}),
        "extends-device": json.dumps({"schema": 2, "extends": "/dev/zero"}),
        "severities-list": json.dumps({"schema": 2, "extends": default, "severities": [1]}),
        "machines-list": json.dumps({"schema": 2, "extends": default, "machines": ["x"]}),
        "not-utf8": b"\xff\xfe{".decode("latin-1"),
        "top-level-list": "[]",
    }
    out = {}
    for name, text in cases.items():
        path = tmp / f"{name}.json"
        path.write_bytes(text.encode("latin-1") if name == "not-utf8" else text.encode())
        out[name] = path
    out["huge"] = sparse_file(tmp / "huge.json", b'{"schema": 2, "x": "', 2 * GIB)
    os.mkfifo(tmp / "fifo.json")
    out["fifo"] = tmp / "fifo.json"
    (tmp / "fifo-extended.json").write_text(json.dumps({"schema": 2, "extends": "fifo.json"}))
    out["extends-fifo"] = tmp / "fifo-extended.json"
    return out


@pytest.mark.parametrize(
    "case",
    [
        "nested",
        "nested-object",
        "extends-number",
        "extends-device",
        "severities-list",
        "machines-list",
        "not-utf8",
        "top-level-list",
        "huge",
        "fifo",
        "extends-fifo",
    ],
)
def test_bad_policy_exits_2(tmp_path: Path, libs: dict[str, Path], case: str) -> None:
    policy = _policy_cases(tmp_path)[case]
    _check(["--policy", str(policy), str(libs["stable"])], "policy", policy.name)


def test_bulk_readers_bound_the_dynamic_entries() -> None:
    """The section and segment readers decode .dynamic in bulk: past MAX_DYNAMIC_TAGS entries with no DT_NULL
    the object is malformed; a DT_NULL within them ends the walk as before."""
    from keel_audit.elf.symbols import dynamic_tags
    from keel_audit.elf.types import MAX_DYNAMIC_TAGS
    from keel_audit.errors import ElfFormatError

    strtab = b"\0libc.so.6\0"
    needed = struct.pack("<qQ", 1, 1)
    flood = needed * (MAX_DYNAMIC_TAGS + 1)
    with pytest.raises(ElfFormatError, match=f"no DT_NULL among the first {MAX_DYNAMIC_TAGS + 1} dynamic entries"):
        dynamic_tags(flood, strtab, "<", True)
    ended = needed * 3 + struct.pack("<qQ", 0, 0) + flood
    assert dynamic_tags(ended, strtab, "<", True) == (None, ("libc.so.6",) * 3, (), ())
