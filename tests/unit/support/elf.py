"""Tiny ELF files written by hand for the tests: a header, the note areas asked for (as PT_NOTE
program headers or SHT_NOTE section headers), and padding that stands for a library's code.

Only what a reader of notes looks at is filled in; nothing here can be loaded or run."""

from __future__ import annotations

import struct
from pathlib import Path

NT_GNU_BUILD_ID = 3
NT_GNU_PROPERTY_TYPE_0 = 5


def note(name: bytes, kind: int, desc: bytes, endian: str = "<", align: int = 4) -> bytes:
    """One note: the header, the name with its NUL padded so the descriptor starts aligned,
    the descriptor padded to the alignment (offsets counted from the note's start)."""
    name = name + b"\0"
    head = struct.pack(endian + "III", len(name), len(desc), kind) + name
    head += b"\0" * (-len(head) % align)
    body = head + desc
    return body + b"\0" * (-len(body) % align)


def build_id_note(build: bytes, endian: str = "<", align: int = 4) -> bytes:
    return note(b"GNU", NT_GNU_BUILD_ID, build, endian, align)


def write_elf(
    path: Path,
    areas: list[tuple[bytes, int]],
    *,
    elf_class: int = 2,
    endian: str = "<",
    as_sections: bool = False,
    padding: int = 0,
) -> Path:
    """An ELF file whose note areas are ``areas`` (``(bytes, alignment)`` each), reachable
    through program headers or, with ``as_sections``, section headers only."""
    wide = elf_class == 2
    header_size = 64 if wide else 52
    entry_size = (64 if wide else 40) if as_sections else (56 if wide else 32)
    table_at = header_size
    data_at = table_at + entry_size * len(areas)
    blobs, entries = b"", []
    for data, align in areas:
        start = data_at + len(blobs)
        start += -start % 8
        blobs += b"\0" * (start - data_at - len(blobs)) + data
        entries.append((start, len(data), align))
    if as_sections:
        fmt = "IIQQQQIIQQ" if wide else "IIIIIIIIII"
        table = b"".join(struct.pack(endian + fmt, 0, 7, 0, 0, o, s, 0, 0, a, 0)
                         for o, s, a in entries)  # fmt: skip
        phoff, shoff, phnum, shnum = 0, table_at, 0, len(areas)
    else:
        if wide:
            table = b"".join(struct.pack(endian + "IIQQQQQQ", 4, 4, o, 0, 0, s, s, a)
                             for o, s, a in entries)  # fmt: skip
        else:
            table = b"".join(struct.pack(endian + "IIIIIIII", 4, o, 0, 0, s, s, 4, a)
                             for o, s, a in entries)  # fmt: skip
        phoff, shoff, phnum, shnum = table_at, 0, len(areas), 0
    ident = b"\x7fELF" + bytes([elf_class, 1 if endian == "<" else 2, 1]) + b"\0" * 9
    fmt = "HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"
    phent = (56 if wide else 32) if not as_sections else 0
    shent = (64 if wide else 40) if as_sections else 0
    header = ident + struct.pack(
        endian + fmt, 3, 183, 1, 0, phoff, shoff, 0, header_size, phent, phnum, shent, shnum, 0
    )
    path.write_bytes(header + table + blobs + b"\xcc" * padding)
    return path
