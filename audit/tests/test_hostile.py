"""keel-audit stays under 1 GB of RSS and exits 2 on every hostile input.

Each case runs keel-audit in a child process (hostile_inputs.run_audit: killed if it passes the
bound, peak RSS from wait4) on an input built small in tmp_path: overlapping zip entries, many
members only the pyelftools fallback reads, a member of GBs, a sparse 10 GiB `.so`, a sparse ELF
with 65,535 section headers of 65,535 bytes each, and bad `--policy` files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hostile_inputs import (
    GIB,
    MIB,
    RSS_LIMIT,
    deflate_zeros,
    elf_header,
    fallback_bait,
    raw_zip,
    run_audit,
    sparse_file,
)

from keel_audit import policy as policy_module


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
    """One 1.5 GiB member (ratio ~115, under the zip-bomb bound) that only the fallback reads."""
    member = deflate_zeros(fallback_bait(elf_class), 1536, pad=8192)
    wheel = raw_zip(tmp_path / "big-1.0-cp310-abi3-linux_x86_64.whl", [("pkg/big.so", member)])
    _check([str(wheel)], "pkg/big.so")


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
