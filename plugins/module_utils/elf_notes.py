# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which build a shared library is: its size and the GNU build ID the linker wrote into it.

Two files with the same version in their names can be different binaries (the pip wheel's
libnccl 2.28.9 and DGX OS's are), so a library is known by its build: the ELF note
``NT_GNU_BUILD_ID`` (the ``.note.gnu.build-id`` section, also reachable through the ``PT_NOTE``
program headers the loader reads), else a sha256 of the whole file.

Standard library only, no other module of this collection, and Python 3.7 syntax: ray_cluster
and operate run this file's text inside serving images
(``lookup('dgx_spark.cluster.module_utils_source', 'elf_notes')``), under whatever Python they
have.
"""

from __future__ import annotations

import hashlib
import os
import struct

NT_GNU_BUILD_ID = 3
_PT_NOTE = 4
_SHT_NOTE = 7
# A build ID note is 16 to 36 bytes; a note area larger than this is not worth reading.
_MAX_NOTES = 1 << 20
_MAX_HEADERS = 4096
# Per ELF class: the header after e_ident, one program header, one section header, and the
# fields of each that are used here (by position).
_LAYOUT = {
    1: {"header": "HHIIIIIHHHHHH", "phdr": "IIIIIIII", "shdr": "IIIIIIIIII",
        "p_type": 0, "p_offset": 1, "p_filesz": 4, "p_align": 7},
    2: {"header": "HHIQQQIHHHHHH", "phdr": "IIQQQQQQ", "shdr": "IIQQQQIIQQ",
        "p_type": 0, "p_offset": 2, "p_filesz": 5, "p_align": 7},
}  # fmt: skip


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def parse_notes(data: bytes, endian: str = "<", align: int = 4) -> list[tuple[bytes, int, bytes]]:
    """Every note in a note area: ``(name, type, descriptor)``, the name without its NUL.

    ``align`` is the area's alignment: 4 for most notes, 8 where the area is 8-aligned (as
    ``.note.gnu.property`` on 64-bit files). A truncated note ends the list."""
    notes = []
    offset = 0
    align = 8 if align == 8 else 4
    while offset + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from(endian + "III", data, offset)
        name_at = offset + 12
        desc_at = offset + _align(12 + namesz, align)
        end = desc_at + descsz
        if end > len(data):
            break
        notes.append((data[name_at : name_at + namesz].rstrip(b"\0"), kind, data[desc_at:end]))
        offset += _align(end - offset, align)
    return notes


def _read_at(handle, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _note_areas(handle) -> tuple[str, list[tuple[int, int, int]]]:
    """The byte order and the ``(offset, size, align)`` of every note area of an ELF file:
    the PT_NOTE segments, then the SHT_NOTE sections. Not an ELF file: ValueError."""
    ident = _read_at(handle, 0, 16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    elf_class, data = ident[4], ident[5]
    if elf_class not in _LAYOUT or data not in (1, 2):
        raise ValueError(f"unknown ELF class {elf_class} or byte order {data}")
    endian = "<" if data == 1 else ">"
    layout = _LAYOUT[elf_class]
    fields = struct.calcsize(endian + layout["header"])
    raw = _read_at(handle, 16, fields).ljust(fields, b"\0")
    header = struct.unpack(endian + layout["header"], raw)
    phoff, shoff = header[4], header[5]
    phentsize, phnum, shentsize, shnum = header[8], header[9], header[10], header[11]
    areas = []
    phdr = struct.calcsize(endian + layout["phdr"])
    if phoff and phentsize >= phdr:
        for index in range(min(phnum, _MAX_HEADERS)):
            raw = _read_at(handle, phoff + index * phentsize, phdr)
            if len(raw) < phdr:
                break
            entry = struct.unpack(endian + layout["phdr"], raw)
            if entry[layout["p_type"]] == _PT_NOTE:
                areas.append(
                    (entry[layout["p_offset"]], entry[layout["p_filesz"]], entry[layout["p_align"]])
                )
    shdr = struct.calcsize(endian + layout["shdr"])
    if shoff and shentsize >= shdr:
        for index in range(min(shnum, _MAX_HEADERS)):
            raw = _read_at(handle, shoff + index * shentsize, shdr)
            if len(raw) < shdr:
                break
            # sh_type, sh_offset, sh_size, sh_addralign: positions 1, 4, 5, 8 in both classes.
            entry = struct.unpack(endian + layout["shdr"], raw)
            if entry[1] == _SHT_NOTE:
                areas.append((entry[4], entry[5], entry[8]))
    return endian, areas


def build_id(path: str) -> str | None:
    """The GNU build ID of an ELF file as lowercase hex; None where it carries none.
    A file that is not ELF raises ValueError; one that cannot be read, OSError."""
    with open(path, "rb") as handle:
        endian, areas = _note_areas(handle)
        for offset, size, align in areas:
            if not 0 < size <= _MAX_NOTES:
                continue
            for name, kind, desc in parse_notes(_read_at(handle, offset, size), endian, align):
                if name == b"GNU" and kind == NT_GNU_BUILD_ID and desc:
                    return desc.hex()
    return None


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def library_build(path: str) -> dict:
    """What build a library file is: ``{path, real_path, size, build_id, sha256, error}``.

    ``sha256`` only where there is no build ID (hashing a 200 MB library takes about a
    second); ``error`` says why there is no build ID (not an ELF file) or nothing could be read
    (the file is missing or unreadable); None when the build ID was read."""
    out = {"path": path, "real_path": None, "size": None, "build_id": None, "sha256": None,
           "error": None}  # fmt: skip
    try:
        out["real_path"] = os.path.realpath(path)
        out["size"] = os.stat(path).st_size
        try:
            out["build_id"] = build_id(path)
        except ValueError as exc:
            out["error"] = str(exc)
        if out["build_id"] is None:
            out["sha256"] = sha256_of(path)
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    return out


def short_build(build: dict | None) -> str:
    """The build in eight hex digits: ``c0db9360`` (the build ID's first eight),
    ``sha256:1a2b3c4d`` where only the file's hash is known, '' where neither is."""
    build = build or {}
    if build.get("build_id"):
        return str(build["build_id"])[:8]
    if build.get("sha256"):
        return "sha256:" + str(build["sha256"])[:8]
    return ""


def build_text(build: dict | None) -> str:
    """``190.0 MB, build c0db9360``: the size (10^6 bytes) and the short build, or why the
    build is unknown."""
    build = build or {}
    parts = []
    if isinstance(build.get("size"), int):
        parts.append(f"{build['size'] / 1e6:.1f} MB")
    short = short_build(build)
    parts.append(
        f"build {short}" if short else f"build unknown ({build.get('error') or 'not read'})"
    )
    return ", ".join(parts)
