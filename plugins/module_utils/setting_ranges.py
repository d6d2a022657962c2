# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whole-number settings checked against their ranges, one message per refusal naming the
variable; shared by the roles' setting checks."""

from __future__ import annotations


def whole(value) -> int | None:
    """The value as a whole number (a string or float that is one counts), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def range_errors(values: dict, ranges: dict) -> list[str]:
    """``values`` by variable name; ``ranges`` the same names to (lowest, highest, unit).
    Names absent from ``values`` are not checked."""
    errors = []
    for name, (low, high, unit) in ranges.items():
        if name not in values:
            continue
        number = whole(values[name])
        if number is None or not low <= number <= high:
            errors.append(f"{name} is {values[name]!r}; allowed: whole {unit} {low}-{high}")
    return errors
