# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The operate role's settings, checked before status, benchmark or logs run: each refusal
names its variable and what is allowed."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils.setting_ranges import (
    range_errors,
    whole,
)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# Whole-number settings: (lowest, highest, what they count).
WHOLE = {
    "operate_status_disk_warn_pct": (1, 100, "percent"),
    "operate_status_timeout": (1, 600, "seconds"),
    "operate_benchmark_prompts_per_slot": (1, 10000, "prompts"),
    "operate_benchmark_min_prompts": (1, 100000, "prompts"),
    "operate_benchmark_seed": (0, 2**32 - 1, "numbers"),
    "operate_benchmark_run_timeout": (60, 86400, "seconds"),
    "operate_logs_lines": (1, 1000000, "lines"),
}
METRICS_INTERVAL = (0.1, 60.0)


def setting_errors(settings: dict) -> list[str]:
    """What the operate role's settings refuse; only the settings present are checked."""
    errors = range_errors(settings, WHOLE)
    if "operate_status_metrics_interval" in settings:
        value = _number(settings["operate_status_metrics_interval"])
        low, high = METRICS_INTERVAL
        if value is None or not low <= value <= high:
            errors.append(
                f"operate_status_metrics_interval is "
                f"{settings['operate_status_metrics_interval']!r}; allowed: seconds {low}-{high}"
            )
    paths = settings.get("operate_status_disk_paths", ["/"])
    if (
        not isinstance(paths, list)
        or not paths
        or not all(isinstance(p, str) and p.startswith("/") for p in paths)
    ):
        errors.append(
            f"operate_status_disk_paths is {paths!r}; allowed: a list of one or more absolute paths"
        )
    concurrency = settings.get("operate_benchmark_concurrency", [1])
    if (
        not isinstance(concurrency, list)
        or not concurrency
        or not all((whole(c) or 0) >= 1 for c in concurrency)
    ):
        errors.append(
            f"operate_benchmark_concurrency is {concurrency!r}; allowed: a list of one or more "
            "whole numbers >= 1"
        )
    lengths = settings.get("operate_benchmark_lengths", [{"input": 1, "output": 1}])
    if (
        not isinstance(lengths, list)
        or not lengths
        or not all(
            isinstance(pair, dict)
            and set(pair) == {"input", "output"}
            and (whole(pair["input"]) or 0) >= 1
            and (whole(pair["output"]) or 0) >= 1
            for pair in lengths
        )
    ):
        errors.append(
            f"operate_benchmark_lengths is {lengths!r}; allowed: a list of one or more "
            "{input: N, output: M} token counts, each >= 1"
        )
    return errors
