# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Stamps: a node's note that a costly check passed, and with which inputs.

A check that loads the link, starts containers or reads 119 GB runs again only when what it
depends on changed. Each such check leaves one stamp on the node, ``<dir>/<name>.json``:

* ``name``: the check (``link-check``, ``collective``, ``weights-<model>``, ...);
* ``inputs``: what the check depended on, the values themselves (a file tree as its digest),
  so that a skip can say what it was given and a rerun what changed;
* ``result``: a short note of what passed (measured Gb/s, the NCCL answer);
* ``passed_at``: when, UTC, ISO 8601;
* ``format``: this shape's number; a stamp of another format is read as none.

Everything here is pure but ``write`` and ``remove``; the module dgx_spark.cluster.stamp is the
one caller on the nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from datetime import UTC, datetime

from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import (
    digest,
    shorten,
    write_record,
)

FORMAT = 1
DEFAULT_DIR = "/var/lib/dgx-spark/stamps"
FIELDS = ("name", "inputs", "result", "passed_at", "format")
TIME = "%Y-%m-%dT%H:%M:%SZ"
# The value of a tree input whose walk did not finish: never the same as a stamp's.
INCOMPLETE = "incomplete"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
WIDTH = 40


def check_name(name: str) -> str:
    """The name, or ValueError when it is no plain file name."""
    if not _NAME.match(str(name or "")):
        raise ValueError(
            f"stamp name {name!r}: letters, digits, '.', '_' and '-' only, first a letter or digit"
        )
    return str(name)


def path(directory: str, name: str) -> str:
    return os.path.join(directory, f"{check_name(name)}.json")


def read(text: str | None) -> dict | None:
    """A stamp from its JSON text, or None when absent, malformed or of another format."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if any(k not in data for k in FIELDS) or not isinstance(data["inputs"], dict):
        return None
    return data


def make(name: str, inputs: dict, result, now: datetime) -> dict:
    """A stamp for a check that passed at ``now`` (aware, or naive UTC)."""
    return {
        "name": check_name(name),
        "inputs": json.loads(json.dumps(inputs, sort_keys=True, default=str)),
        "result": json.loads(json.dumps(result, sort_keys=True, default=str)),
        "passed_at": now.astimezone(UTC).strftime(TIME) if now.tzinfo else now.strftime(TIME),
        "format": FORMAT,
    }


def same(old: dict | None, new: dict) -> bool:
    """Whether ``old`` says what ``new`` says, but for when it passed."""
    if old is None:
        return False
    return {k: old.get(k) for k in FIELDS if k != "passed_at"} == {
        k: new.get(k) for k in FIELDS if k != "passed_at"
    }


def tree_input(fingerprint: dict) -> str:
    """A file tree (converge_record.tree_fingerprint) as an input: 16 hex digits of its
    digest, or INCOMPLETE where the walk stopped (too many files, an unreadable directory)."""
    if not fingerprint.get("complete"):
        return INCOMPLETE
    return digest([fingerprint.get("exists"), fingerprint.get("entries")], 16)


def _flat(inputs: dict, prefix: str = "") -> dict:
    """Nested mappings as dotted names, so a difference names the leaf that changed."""
    flat = {}
    for key, value in inputs.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flat(value, name + "."))
        else:
            flat[name] = value
    return flat


def _changed_lines(old: str, new: str) -> tuple[str, str]:
    """Of two texts of several lines, the lines only one of them has."""
    before, after = old.splitlines(), new.splitlines()
    gone = [line for line in before if line not in after]
    came = [line for line in after if line not in before]
    return " / ".join(gone) or "(none)", " / ".join(came) or "(none)"


def _pair(old, new) -> tuple[str, str]:
    if isinstance(old, str) and isinstance(new, str) and ("\n" in old or "\n" in new):
        old, new = _changed_lines(old, new)
    return (
        "(none)" if old is None else shorten(old),
        "(none)" if new is None else shorten(new),
    )


def _diff(old: dict, new: dict, prefix: str, found: list[str]) -> None:
    for key in sorted(set(old) | set(new), key=str):
        name = f"{prefix}{key}"
        before, after = old.get(key), new.get(key)
        if before == after and (key in old) == (key in new):
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            _diff(before, after, name + ".", found)
            continue
        shown = _pair(before, after)
        found.append(f"{name}: {shown[0]} -> {shown[1]}")


def differences(stamp: dict | None, inputs: dict) -> list[str]:
    """Each input that differs from the stamp's, as ``name: OLD -> NEW`` (values shortened;
    within mappings on both sides by the dotted name of what changed, a text of several lines
    by the lines that changed); empty when the stamp was made with these inputs or there is
    no stamp."""
    if stamp is None:
        return []
    found: list[str] = []
    _diff(
        stamp.get("inputs") or {},
        json.loads(json.dumps(inputs, sort_keys=True, default=str)),
        "",
        found,
    )
    return found


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(str(text), TIME).replace(tzinfo=UTC)
    except ValueError:
        return None


def age(passed_at: str, now: datetime) -> str:
    """How long ago, in one rough unit: ``just now``, ``12 min ago``, ``3 h ago``, ``2 d ago``."""
    when = parse_time(passed_at)
    if when is None:
        return "at an unknown time"
    seconds = (now.astimezone(UTC) - when).total_seconds()
    if seconds < 60:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    raise AssertionError("unreachable")


def summary(result) -> str:
    """A result as one short line: a mapping's leaves as ``key=value``, else the value; cut at
    160 characters (a result may be a whole document, such as a registry probe's)."""
    if isinstance(result, dict):
        flat = _flat(result)
        line = ", ".join(f"{k}={shorten(v, 24)}" for k, v in flat.items())
        return shorten(line, 4 * WIDTH) if line else "(nothing)"
    return shorten(result, 80) if result not in (None, "") else "(nothing)"


def reason(name: str, stamp: dict | None, inputs: dict, now: datetime) -> str:
    """One line for the skip or the run."""
    if stamp is None:
        return "runs: no stamp"
    incomplete = sorted(k for k, v in _flat(inputs).items() if v == INCOMPLETE)
    if incomplete:
        return f"runs: {', '.join(incomplete)} could not be read whole"
    changed = differences(stamp, inputs)
    if changed:
        named = []
        for line in changed:
            key, _colon, rest = line.partition(": ")
            before, _arrow, after = rest.partition(" -> ")
            named.append(f"{key} changed from {before} to {after}")
        return "runs: " + "; ".join(named)
    passed = stamp["passed_at"]
    return (
        f"skipped: {name} passed {passed} ({age(passed, now)}) with these inputs: "
        f"{summary(stamp.get('result'))}"
    )


def check(name: str, stamp: dict | None, inputs: dict, now: datetime) -> dict:
    """What state=check answers: ``valid`` (the stamp holds for these inputs), ``reason``,
    ``stamp`` (as read, or None) and ``differences``."""
    line = reason(name, stamp, inputs, now)
    return {
        "valid": line.startswith("skipped: "),
        "reason": line,
        "stamp": stamp,
        "differences": differences(stamp, inputs),
    }


def status_lines(stamps: dict, now: datetime) -> list[str]:
    """Each stamp of a node as one line for the status report: name, age, result, inputs."""
    lines = []
    for name in sorted(stamps):
        stamp = stamps[name]
        if stamp is None:
            lines.append(f"{name}: unreadable (the check runs again)")
            continue
        inputs = ", ".join(f"{k}={shorten(v, 24)}" for k, v in _flat(stamp["inputs"]).items())
        lines.append(
            f"{name}: passed {stamp['passed_at']} ({age(stamp['passed_at'], now)}): "
            f"{summary(stamp.get('result'))}; inputs: {inputs or '(none)'}"
        )
    return lines


def load(directory: str, name: str) -> dict | None:
    """The stamp ``name`` in ``directory``, or None."""
    try:
        with open(path(directory, name), encoding="utf-8") as handle:
            return read(handle.read())
    except OSError:
        return None


def load_all(directory: str) -> dict:
    """Every stamp in ``directory`` by name (None for one that cannot be read)."""
    found = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for entry in names:
        stem, ext = os.path.splitext(entry)
        if ext == ".json" and _NAME.match(stem):
            found[stem] = load(directory, stem)
    return found


def write(directory: str, stamp: dict) -> str:
    """Write a stamp atomically, root's alone (mode 0600, a missing directory 0700): an input
    may be a setting the node keeps to itself."""
    target = path(directory, stamp["name"])
    write_record(target, stamp)
    return target


def remove(directory: str, name: str, dry: bool = False) -> bool:
    """Remove a stamp (with ``dry``, only look); whether there was one."""
    target = path(directory, name)
    if not os.path.lexists(target):
        return False
    if dry:
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    return True
