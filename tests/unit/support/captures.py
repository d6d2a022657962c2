"""Fixtures of tools' output with their provenance.

Every file under ``tests/unit/fixtures/`` (but a folder's README.md) says where it comes from
in a header of ``#|`` lines, which no tool prints:

- ``captured``: this project ran the tool; the header names the tool and its version, the
  machine it ran on (``on ...``) and the date (``YYYY-MM-DD``).
- ``derived``: made from another fixture of the same folder; the header names it (``derived
  from `<file>```) and says what was changed (``changed: ...``) and why (``why: ...``).
- ``reconstructed``: the tool's output as someone published it, with the page's address
  (``https://...``); lines written rather than copied, or values from another source, are named.
- ``constructed``: an example this project wrote where no capture or publication shows the
  case (a leftover configuration file, a RoCE GID table); the header says what it stands for
  and gives the address of the format's public description (``https://...``).

JSON holds no comment: the header of ``<name>.json`` is its sibling ``<name>.json.source``,
made of the same ``#|`` lines, and the JSON file holds the tool's output alone.

Tests read a fixture through ``tool_output`` or ``load_json``: the header is cut off here,
never by the parser under test. Text is read as stored (a carriage return stays one).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MARK = "#|"
KINDS = ("captured", "derived", "reconstructed", "constructed")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SIDECAR = ".source"
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d(?!\d)")
_VERSION = re.compile(r"\b\d+\.\d+(?:\.\d+)?")
_DERIVED_FROM = re.compile(r"^derived from `([\w.-]+)`")


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def split(path: Path) -> tuple[str, str]:
    """(the provenance header without its marks, the tool's output)."""
    header, body = [], []
    for line in _read(path).splitlines(keepends=True):
        if not body and line.startswith(MARK):
            header.append(line[len(MARK) :].strip())
        else:
            body.append(line)
    return " ".join(h for h in header if h), "".join(body)


def tool_output(path: Path) -> str:
    """What the tool printed, without the provenance header."""
    return split(path)[1]


def load_json(path: Path):
    """A JSON fixture's content (its header lives in the sibling ``.source`` file)."""
    return json.loads(tool_output(path))


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR)


def provenance(path: Path) -> str:
    """The header of a fixture: its own ``#|`` lines, or its sidecar's for JSON."""
    if path.suffix == ".json":
        return split(sidecar(path))[0] if sidecar(path).is_file() else ""
    return split(path)[0]


def fixture_files(root: Path = FIXTURES) -> list[Path]:
    """Every fixture under ``root``: not the READMEs, not the JSON headers."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name != "README.md" and not p.name.endswith(SIDECAR)
    )


def provenance_errors(path: Path) -> list[str]:
    """What the header of one fixture lacks; [] when it says where the file comes from."""
    header = provenance(path)
    kind = header.split(maxsplit=1)[0].rstrip(":,") if header else ""
    if kind not in KINDS:
        where = sidecar(path).name if path.suffix == ".json" else "its first lines"
        kinds = "', '#| ".join(KINDS[:-1])
        return [f"no '#| {kinds}' or '#| {KINDS[-1]}' header in {where}"]
    errors = []
    if kind == "captured":
        if not _DATE.search(header):
            errors.append("captured: no date (YYYY-MM-DD)")
        if not _VERSION.search(_DATE.sub("", header)):
            errors.append("captured: no version of the tool")
        if " on " not in header:
            errors.append("captured: no machine ('on ...')")
    elif kind == "derived":
        source = _DERIVED_FROM.match(header)
        parent = path.with_name(source.group(1)) if source else None
        if parent is None or not parent.is_file():
            errors.append("derived: names no fixture of its folder ('derived from `<file>`')")
        elif provenance(parent).startswith("derived"):
            errors.append(f"derived: {parent.name} is itself derived")
        if "changed:" not in header or "why:" not in header:
            errors.append("derived: does not say what was changed ('changed:') and why ('why:')")
    elif kind == "constructed":
        if not re.search(r"https://\S+", header):
            errors.append("constructed: no address of the format's description (https://...)")
    elif not re.search(r"https://\S+", header):
        errors.append("reconstructed: no address of the public source (https://...)")
    if not tool_output(path).strip():
        errors.append("no tool output after the header")
    return errors
