"""Every fixture under tests/unit/fixtures says where it comes from (tests/unit/support/
captures.py describes the header: captured, derived or reconstructed)."""

from __future__ import annotations

import json

import pytest
from support.captures import (
    FIXTURES,
    SIDECAR,
    fixture_files,
    provenance,
    provenance_errors,
    sidecar,
    split,
    tool_output,
)

FILES = fixture_files()


def test_the_walk_sees_every_fixture_folder():
    folders = {p.parent.name for p in FILES}
    assert folders == {d.name for d in FIXTURES.iterdir() if d.is_dir()}
    assert {"host_prep", "operate", "vllm_serve"} <= folders


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_says_where_it_comes_from(path):
    assert provenance_errors(path) == [], provenance(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_folders_readme_names_each_of_its_fixtures(path):
    readme = path.parent / "README.md"
    if not readme.is_file():
        pytest.skip(f"{path.parent.name} has no README")
    assert f"`{path.name}`" in readme.read_text(), f"{path.name} is not in {readme}"


def test_json_fixtures_are_the_tools_output_alone():
    for path in (p for p in FILES if p.suffix == ".json"):
        assert split(path)[0] == "", f"{path.name}: a JSON file holds no header"
        json.loads(tool_output(path))
        assert sidecar(path).is_file(), f"{path.name}: no {sidecar(path).name}"


def test_every_header_file_belongs_to_a_json_fixture():
    orphans = [
        s.name
        for s in FIXTURES.rglob(f"*{SIDECAR}")
        if not s.with_name(s.name[: -len(SIDECAR)]).is_file() or not s.name.endswith(".json.source")
    ]
    assert orphans == []


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("", ["no '#| captured', '#| derived', '#| reconstructed' or '#| constructed' header in "
              "its first lines"]),
        ("#| captured on the pair: ethtool 6.1", ["captured: no date (YYYY-MM-DD)"]),
        ("#| captured 2026-12-04 on the pair: ethtool", ["captured: no version of the tool"]),
        ("#| captured 2026-12-04: ethtool 6.1", ["captured: no machine ('on ...')"]),
        ("#| reconstructed from github.com/x/y", [
            "reconstructed: no address of the public source (https://...)"]),
        ("#| derived from `gone.txt`: changed: x; why: y", [
            "derived: names no fixture of its folder ('derived from `<file>`')"]),
        ("#| derived from `a.txt`: the states set to Down", [
            "derived: does not say what was changed ('changed:') and why ('why:')"]),
        ("#| derived from `a.txt`: changed: both states; why: no cable", []),
        ("#| reconstructed: https://github.com/x/y/issues/1, verbatim", []),
        ("#| constructed example: a leftover netplan file", [
            "constructed: no address of the format's description (https://...)"]),
        ("#| constructed example: a leftover netplan file; format: https://netplan.example/yaml",
         []),
    ],
)  # fmt: skip
def test_the_header_check_refuses_what_it_should(tmp_path, header, expected):
    (tmp_path / "a.txt").write_text("#| captured 2026-12-04 on the pair: tool 1.0\nline\n")
    path = tmp_path / "b.txt"
    path.write_text((header + "\n" if header else "") + "line\n")
    assert provenance_errors(path) == expected


def test_a_header_alone_is_not_a_fixture(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("#| captured 2026-12-04 on the pair: tool 1.0\n")
    assert provenance_errors(path) == ["no tool output after the header"]


def test_the_tool_output_starts_after_the_header_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "d.log"
    path.write_bytes(
        b"#| captured 2026-12-04 on the pair: tool 1.0\nA\r\n#| not a header\r\x1b[0mB\n"
    )
    assert tool_output(path) == "A\r\n#| not a header\r\x1b[0mB\n"
