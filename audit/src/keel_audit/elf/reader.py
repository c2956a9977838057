"""`read_elf`: one ELF shared object from bytes, a path or a RandomAccess, by the cheapest reader.

Streamed wheel members are first read from PT_DYNAMIC alone (segments.py), so a member is inflated
only as far as that needs; then the bulk section-header reader (sections.py); objects without
.dynamic/.dynsym sections, or with an odd class/encoding, go through pyelftools (fallback.py).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from ..errors import ElfFormatError
from .fallback import read_with_pyelftools
from .sections import read_sections
from .segments import read_dynamic
from .types import ELF_MAGIC, ElfInfo, RandomAccess


def read_elf(source: bytes | bytearray | memoryview | str | os.PathLike[str] | RandomAccess) -> ElfInfo:
    """Read an ELF shared object from bytes, a path or a RandomAccess; ElfFormatError when it is not one."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return read_source(BytesSource(bytes(source) if not isinstance(source, bytes) else source))
    if not isinstance(source, (str, os.PathLike)):
        return read_source(source)
    with open(source, "rb") as fh:
        return read_source(FileSource(fh, Path(source).stat().st_size))


class BytesSource:
    """Random access to an in-memory object."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)

    def read(self, offset: int, size: int, /) -> bytes:
        return self.data[offset : offset + size]


class FileSource:
    """Random access to an open binary file."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.size = fh, size

    def read(self, offset: int, size: int, /) -> bytes:
        self.fh.seek(offset)
        return self.fh.read(size)


def read_source(src: RandomAccess) -> ElfInfo:
    """The readers in order of cost: dynamic segment (streamed sources), section headers, pyelftools."""
    head = src.read(0, 64)
    if head[:4] != ELF_MAGIC:
        raise ElfFormatError(f"not an ELF file: expected magic 7f454c46, got {head[:4].hex() or 'empty file'}")
    if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2) or (head[4] == 2 and len(head) < 64):
        return _fallback(src)  # odd class/encoding or a stub header
    streamed = getattr(src, "streamed", False)
    if streamed:
        info = read_dynamic(src, head)
        if info is not None:
            return info
    try:
        info = read_sections(src, head)
    except (struct.error, ValueError, IndexError, KeyError, OverflowError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    if info is None:
        return _fallback(src)
    if streamed:  # the section-header path reads to the end, so zipfile checks the CRC
        src.read(src.size - 1, 1)
    return info


def _fallback(src: RandomAccess) -> ElfInfo:
    """pyelftools, reading `src` in pieces; a streamed member is then read to its end (CRC check)."""
    info = read_with_pyelftools(src)
    if getattr(src, "streamed", False) and src.size:
        src.read(src.size - 1, 1)
    return info
