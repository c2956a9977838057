"""Hostile inputs of keel-audit built small on disk (sparse files, repeated deflate blocks, overlapping
zip entries), and a runner that measures a keel-audit child's peak RSS (optionally under an address-space and
a CPU-time limit).

Every builder writes into a folder the test gives (tmp_path) and allocates no more than a few MB;
the inputs they describe are GBs once inflated or read whole.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import keel_audit

GIB = 1 << 30
MIB = 1 << 20
RSS_LIMIT = GIB  # the RSS bound of the older hostile inputs
AS_LIMIT = 256 * MIB  # the address-space bound of the metadata, dynamic-section and GGUF cases
CPU_LIMIT = 10  # and their CPU-time bound, in seconds
PT_DYNAMIC = 2


def elf_header(
    *,
    phoff: int = 0,
    phnum: int = 0,
    shoff: int = 0,
    shnum: int = 0,
    shentsize: int = 64,
    elf_class: int = 2,
) -> bytes:
    """A 64-bit little-endian ET_DYN x86-64 ELF header (`elf_class` 3 is an invalid class)."""
    ident = struct.pack("<4sBBBBB7s", b"\x7fELF", elf_class, 1, 1, 0, 0, bytes(7))
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, phoff, shoff, 0, 64, 56, phnum, shentsize, shnum, 0)


def fallback_bait(elf_class: int = 2) -> bytes:
    """The first bytes of an object only the pyelftools fallback reads: no section headers, one
    PT_DYNAMIC far past the end of the file (so the fallback fails: exit 2), the rest zeros.
    With `elf_class` 3 the class is invalid (the odd-class path of the fallback)."""
    phdr = struct.pack("<IIQQQQQQ", PT_DYNAMIC, 6, 1 << 40, 0, 0, 64, 64, 8)
    return elf_header(phoff=64, phnum=1, elf_class=elf_class) + phdr


def sparse_file(path: Path, head: bytes, size: int) -> Path:
    """`head`, then a hole up to `size` bytes (nothing but the head is written to disk)."""
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


@dataclass(frozen=True)
class Deflated:
    """One member's deflate stream and what it inflates to."""

    data: bytes
    size: int
    crc: int


def deflate_zeros(head: bytes, megabytes: int, pad: int = 0) -> Deflated:
    """`head` then zeros, `megabytes` MiB of them, as a raw deflate stream built from one repeated
    block: each 1 MiB of zeros is a full-flushed deflate block (about 1 KB); `pad` zero bytes in a
    stored block after each keep the compression ratio below the wheel reader's zip-bomb bound."""
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = first.compress(bytes(MIB)) + first.flush(zlib.Z_FULL_FLUSH)
    opener = zlib.compressobj(9, zlib.DEFLATED, -15)
    head_piece = opener.compress(head + bytes(MIB - len(head))) + opener.flush(zlib.Z_FULL_FLUSH)
    stored = b"\x00" + struct.pack("<HH", pad, pad ^ 0xFFFF) + bytes(pad) if pad else b""
    zeros, padding = bytes(MIB), bytes(pad)
    crc = zlib.crc32(padding, zlib.crc32(head + bytes(MIB - len(head))))
    chunks = [head_piece, stored]
    for _ in range(megabytes - 1):
        chunks += [piece, stored]
        crc = zlib.crc32(padding, zlib.crc32(zeros, crc))
    chunks.append(b"\x03\x00")  # an empty final block
    return Deflated(b"".join(chunks), megabytes * (MIB + pad), crc)


def deflate_pattern(head: bytes, unit: bytes, megabytes: int) -> Deflated:
    """`head` then `unit` repeated, `megabytes` MiB in all, as a raw deflate stream built from one
    full-flushed block per MiB (a few hundred bytes each for a short `unit`)."""
    block = (unit * (MIB // len(unit) + 1))[:MIB]
    first = head + block[len(head) :]
    piece = zlib.compressobj(9, zlib.DEFLATED, -15)
    opener = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunks = [opener.compress(first) + opener.flush(zlib.Z_FULL_FLUSH)]
    body = piece.compress(block) + piece.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(first)
    for _ in range(megabytes - 1):
        chunks.append(body)
        crc = zlib.crc32(block, crc)
    chunks.append(b"\x03\x00")
    return Deflated(b"".join(chunks), megabytes * MIB, crc)


def stored(data: bytes) -> Deflated:
    """A small member as one stored deflate block."""
    return Deflated(b"\x01" + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data, len(data), zlib.crc32(data))


def needed_flood(entries: int) -> bytes:
    """The first bytes of an object with no section headers whose PT_DYNAMIC holds `entries` DT_NEEDED
    entries (and no DT_NULL before them): what follows the header is the repeated 16-byte entry."""
    phdr = struct.pack("<IIQQQQQQ", PT_DYNAMIC, 6, 128, 0, 0, 16 * entries, 16 * entries, 8)
    return elf_header(phoff=64, phnum=1) + phdr + bytes(8)


def raw_zip(path: Path, members: list[tuple[str, Deflated]], central: list[tuple[str, int]] | None = None) -> Path:
    """A zip of deflated `members`; `central` (name, index of the member whose local header the entry
    points at) lists the central directory, by default one entry per member. Several entries naming
    one local header are overlapping entries."""
    offsets: list[int] = []
    with open(path, "wb") as fh:
        for name, member in members:
            offsets.append(fh.tell())
            raw = name.encode()
            fh.write(
                struct.pack(
                    "<4sHHHHHIIIHH",
                    b"PK\x03\x04",
                    20,
                    0,
                    8,
                    0,
                    0x21,
                    member.crc,
                    len(member.data),
                    member.size,
                    len(raw),
                    0,
                )
            )
            fh.write(raw + member.data)
        cd_at = fh.tell()
        entries = central if central is not None else [(name, i) for i, (name, _) in enumerate(members)]
        for name, index in entries:
            member, raw = members[index][1], name.encode()
            fh.write(
                struct.pack(
                    "<4sHHHHHHIIIHHHHHII",
                    b"PK\x01\x02",
                    (3 << 8) | 20,
                    20,
                    0,
                    8,
                    0,
                    0x21,
                    member.crc,
                    len(member.data),
                    member.size,
                    len(raw),
                    0,
                    0,
                    0,
                    0,
                    0o100644 << 16,
                    offsets[index],
                )
                + raw
            )
        cd_size = fh.tell() - cd_at
        fh.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), cd_size, cd_at, 0))
    return path


@dataclass(frozen=True)
class Run:
    """A keel-audit child: exit code, stderr, peak RSS (bytes), whether it was killed at the bound, CPU seconds."""

    rc: int
    stderr: str
    peak_rss: int
    killed: bool
    cpu_s: float = 0.0

    def describe(self) -> str:
        return (
            f"exit {self.rc}, peak RSS {self.peak_rss / MIB:.0f} MiB, {self.cpu_s:.1f} s of CPU"
            f"{' (killed at the bound)' if self.killed else ''}"
        )


def _rss(pid: int) -> int:
    return _status_bytes(pid, "VmRSS:")


def _status_bytes(pid: int, key: str) -> int:
    """A size line of /proc/PID/status in bytes (0 once the process is gone). VmHWM is the peak RSS of the
    process's own address space: wait4's ru_maxrss is not, since exec records the RSS the forked parent had
    (a pytest process holding models reports gigabytes for a child that used megabytes)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_bounded(
    cmd: list[str], env: dict[str, str], limit: int, timeout: float, cwd: str | None = None
) -> tuple[int, str, int, bool]:
    """Run `cmd`, killed when its RSS passes `limit` bytes or `timeout` seconds pass: (exit code, stderr, peak
    RSS from /proc (VmHWM), killed). keel's own tests (tests/support/bounded_child.py) run their children here."""
    run = run_limited(cmd, env, limit, timeout, cwd)
    return run.rc, run.stderr, run.peak_rss, run.killed


def _limits(address_space: int | None, cpu_seconds: int | None) -> None:
    """In the child, before exec: RLIMIT_AS and RLIMIT_CPU (SIGXCPU at the soft limit, SIGKILL a second later)."""
    if address_space is not None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    if cpu_seconds is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def run_limited(
    cmd: list[str],
    env: dict[str, str],
    limit: int,
    timeout: float,
    cwd: str | None = None,
    *,
    address_space: int | None = None,
    cpu_seconds: int | None = None,
) -> Run:
    """`run_bounded`, optionally under RLIMIT_AS `address_space` and RLIMIT_CPU `cpu_seconds`, with the child's
    CPU time (from wait4)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=cwd,
            preexec_fn=lambda: _limits(address_space, cpu_seconds),
        )
        killed, peak = False, 0
        deadline = time.monotonic() + timeout
        while True:
            peak = max(peak, _status_bytes(proc.pid, "VmHWM:"))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if not killed and (_rss(proc.pid) > limit or time.monotonic() > deadline):
                proc.kill()
                killed = True
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
        return Run(proc.returncode, text, peak, killed, usage.ru_utime + usage.ru_stime)


def run_audit(
    args: list[str],
    limit: int = RSS_LIMIT,
    timeout: float = 300.0,
    *,
    address_space: int | None = None,
    cpu_seconds: int | None = None,
    paths: tuple[str, ...] = (),
) -> Run:
    """`python -m keel_audit ARGS` in a child process, killed when its RSS passes `limit` (so a
    regression fails the test instead of exhausting the machine), optionally under RLIMIT_AS and RLIMIT_CPU,
    with `paths` on its sys.path; peak RSS from /proc (VmHWM)."""
    env = dict(os.environ)
    root = str(Path(keel_audit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, *paths, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "keel_audit", *args]
    return run_limited(cmd, env, limit, timeout, address_space=address_space, cpu_seconds=cpu_seconds)
