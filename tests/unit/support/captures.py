"""Fixtures of tools' output with their provenance.

A hardware fixture starts with a header of ``#|`` lines: ``captured`` (where and when this
project ran the tool) or ``reconstructed`` (from a public capture of that tool, whose address
the header gives). The tool's output follows, exactly; no tool prints a ``#|`` line.
"""

from __future__ import annotations

from pathlib import Path

MARK = "#|"
KINDS = ("captured", "reconstructed")


def split(path: Path) -> tuple[str, str]:
    """(the provenance header without its marks, the tool's output)."""
    header, body = [], []
    for line in path.read_text().splitlines(keepends=True):
        if not body and line.startswith(MARK):
            header.append(line[len(MARK) :].strip())
        else:
            body.append(line)
    return " ".join(h for h in header if h), "".join(body)


def tool_output(path: Path) -> str:
    """What the tool printed, without the provenance header."""
    return split(path)[1]
