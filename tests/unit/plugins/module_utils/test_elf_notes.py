"""Tests for plugins/module_utils/elf_notes.py: the build ID read from an ELF file's notes, on
files written here by hand (both classes, both byte orders, segments or sections only) and on
this machine's own /bin/true checked against readelf where readelf exists."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import elf_notes
from support.elf import NT_GNU_PROPERTY_TYPE_0, build_id_note, note, write_elf

# The build IDs public reports give for the two libnccl 2.28.9 builds (vLLM issues 41725 and
# 42354), padded to the 20 bytes a GNU build ID has; the tail is made up.
PIP_BUILD = bytes.fromhex("a7f420a1") + bytes(range(16))
DGX_OS_BUILD = bytes.fromhex("c0db9360") + bytes(range(16, 32))


@pytest.mark.parametrize("elf_class", [1, 2])
@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("as_sections", [False, True])
def test_the_build_id_is_read_in_either_class_byte_order_and_table(
    tmp_path, elf_class, endian, as_sections
):
    path = write_elf(
        tmp_path / "libnccl.so.2.28.9",
        [(build_id_note(DGX_OS_BUILD, endian), 4)],
        elf_class=elf_class,
        endian=endian,
        as_sections=as_sections,
    )
    assert elf_notes.build_id(str(path)) == DGX_OS_BUILD.hex()


def test_the_build_id_is_found_after_other_notes_in_an_8_aligned_area(tmp_path):
    # A 64-bit library's first PT_NOTE often holds .note.gnu.property (8-aligned); the build ID
    # may sit in the same segment after it, or in a 4-aligned one.
    prop = note(b"GNU", NT_GNU_PROPERTY_TYPE_0, b"\x02\0\0\xc0\4\0\0\0\3\0\0\0\0\0\0\0", align=8)
    path = write_elf(
        tmp_path / "lib.so",
        [(prop + build_id_note(PIP_BUILD, align=8), 8), (note(b"stapsdt", 3, b"x" * 9), 4)],
    )
    assert elf_notes.build_id(str(path)) == PIP_BUILD.hex()


def test_notes_of_another_owner_or_type_are_not_a_build_id(tmp_path):
    path = write_elf(
        tmp_path / "lib.so",
        [(note(b"Go", 3, b"go-build-id") + note(b"GNU", 1, b"\0" * 16), 4)],
    )
    assert elf_notes.build_id(str(path)) is None


def test_parse_notes_stops_at_a_truncated_note():
    whole = build_id_note(PIP_BUILD)
    assert elf_notes.parse_notes(whole) == [(b"GNU", 3, PIP_BUILD)]
    assert elf_notes.parse_notes(whole + whole[:20]) == [(b"GNU", 3, PIP_BUILD)]
    assert elf_notes.parse_notes(whole[:-4]) == []


def test_a_file_that_is_not_elf_is_refused(tmp_path):
    text = tmp_path / "libnccl.so.2"
    text.write_text("INPUT(libnccl.so.2.28.9)\n")  # a linker script, as some -dev packages ship
    with pytest.raises(ValueError, match="not an ELF file"):
        elf_notes.build_id(str(text))


def test_library_build_gives_size_and_build_id_and_follows_the_link(tmp_path):
    real = write_elf(
        tmp_path / "libnccl.so.2.28.9", [(build_id_note(DGX_OS_BUILD), 4)], padding=4096
    )
    link = tmp_path / "libnccl.so.2"
    link.symlink_to(real.name)
    build = elf_notes.library_build(str(link))
    assert build == {
        "path": str(link),
        "real_path": str(real),
        "size": real.stat().st_size,
        "build_id": DGX_OS_BUILD.hex(),
        "sha256": None,
        "error": None,
    }
    assert elf_notes.short_build(build) == "c0db9360"
    assert elf_notes.build_text(build) == "0.0 MB, build c0db9360"


def test_without_a_build_id_the_file_hash_stands_in(tmp_path):
    path = write_elf(tmp_path / "libnccl.so.2", [], padding=2_500_000)
    build = elf_notes.library_build(str(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (build["build_id"], build["sha256"], build["error"]) == (None, digest, None)
    assert elf_notes.short_build(build) == f"sha256:{digest[:8]}"
    assert elf_notes.build_text(build) == f"2.5 MB, build sha256:{digest[:8]}"


def test_a_missing_file_is_named_not_raised(tmp_path):
    build = elf_notes.library_build(str(tmp_path / "absent.so"))
    assert build["size"] is None and build["build_id"] is None and build["sha256"] is None
    assert build["error"].startswith("FileNotFoundError")
    assert elf_notes.build_text(build).startswith("build unknown (FileNotFoundError")
    assert elf_notes.short_build(None) == "" and elf_notes.short_build({}) == ""


def test_this_machines_true_matches_readelf():
    """A real linker's output: /bin/true's build ID as readelf prints it (skipped where this
    machine has no readelf or its true carries no build ID)."""
    true = shutil.which("true") or "/bin/true"
    readelf = shutil.which("readelf")
    if not readelf or not Path(true).is_file():
        pytest.skip("no readelf or no true on this machine")
    printed = subprocess.run(
        [readelf, "-n", true], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"Build ID:\s*([0-9a-f]+)", printed)
    if not found:
        pytest.skip(f"{true} carries no build ID")
    assert elf_notes.build_id(true) == found.group(1)
    assert elf_notes.library_build(true)["build_id"] == found.group(1)


@pytest.mark.parametrize("elf_class", [1, 2])
@pytest.mark.parametrize("endian", ["<", ">"])
def test_readelf_reads_the_hand_written_files_as_this_reader_does(tmp_path, elf_class, endian):
    """The files above are real ELF as far as notes go: readelf finds the same build ID."""
    readelf = shutil.which("readelf")
    if not readelf:
        pytest.skip("no readelf on this machine")
    prop = note(b"GNU", NT_GNU_PROPERTY_TYPE_0, b"\0" * 16, endian, align=8)
    path = write_elf(
        tmp_path / "lib.so",
        [(prop + build_id_note(PIP_BUILD, endian, align=8), 8)],
        elf_class=elf_class,
        endian=endian,
    )
    printed = subprocess.run(
        [readelf, "-n", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"Build ID:\s*([0-9a-f]+)", printed).group(1) == PIP_BUILD.hex()
    assert elf_notes.build_id(str(path)) == PIP_BUILD.hex()
