# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Summary rows from the JSON results ``vllm bench serve --save-result`` writes.

One row per run (a concurrency level and a prompt/output shape); the CSV the benchmark
playbook leaves beside the raw JSON and that the plotting script reads.
"""

from __future__ import annotations

import csv
import io

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")

COLUMNS = [
    "concurrency",
    "input_len",
    "output_len",
    "num_prompts",
    "completed",
    "failed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "total_input_tokens",
    "total_output_tokens",
] + [
    f"{stat}_{metric}_ms"
    for metric in LATENCIES
    for stat in ("mean", *(f"p{p}" for p in PERCENTILES))
]


class BenchResultError(ValueError):
    """A result file lacks what a summary row needs."""


def _percentile(result: dict, metric: str, p: int):
    # vLLM names the 50th both median_* and p50_* (when asked for 50); either will do.
    for key in (f"p{p}_{metric}_ms", f"median_{metric}_ms" if p == 50 else None):
        if key and result.get(key) is not None:
            return result[key]
    return None


def summary_row(result: dict, input_len: int | None = None, output_len: int | None = None) -> dict:
    """The CSV row of one run; lengths are the ones asked for, else the run's means."""
    for key in ("completed", "duration", "output_throughput"):
        if key not in result:
            raise BenchResultError(f"not a vllm bench serve result: no {key!r}")
    completed = result["completed"]
    concurrency = result.get("max_concurrency")
    row = {
        "concurrency": concurrency,
        "input_len": input_len
        if input_len is not None
        else _mean_len(result.get("input_lens"), result.get("total_input_tokens"), completed),
        "output_len": output_len
        if output_len is not None
        else _mean_len(result.get("output_lens"), result.get("total_output_tokens"), completed),
        "num_prompts": result.get("num_prompts"),
        "completed": completed,
        "failed": result.get("failed", 0),
        "duration_s": round(result["duration"], 3),
        "request_throughput": round(result.get("request_throughput", 0.0), 3),
        "output_throughput": round(result["output_throughput"], 2),
        "total_token_throughput": round(result.get("total_token_throughput", 0.0), 2),
        "total_input_tokens": result.get("total_input_tokens"),
        "total_output_tokens": result.get("total_output_tokens"),
    }
    for metric in LATENCIES:
        mean = result.get(f"mean_{metric}_ms")
        row[f"mean_{metric}_ms"] = None if mean is None else round(mean, 2)
        for p in PERCENTILES:
            value = _percentile(result, metric, p)
            row[f"p{p}_{metric}_ms"] = None if value is None else round(value, 2)
    return row


def _mean_len(lengths, total, completed) -> int | None:
    """Mean length per request: from the per-request list (--save-detailed), else the totals."""
    if lengths:
        return round(sum(lengths) / len(lengths))
    if total and completed:
        return round(total / completed)
    return None


def check_row(row: dict) -> list[str]:
    """Why a row's numbers do not hang together; empty when they do."""
    errors = []
    if not row["completed"]:
        errors.append("no request completed")
    if row["failed"]:
        errors.append(f"{row['failed']} requests failed")
    if not row["output_throughput"] or row["output_throughput"] <= 0:
        errors.append("output throughput is zero")
    if row["duration_s"] and row["total_output_tokens"] is not None:
        derived = row["total_output_tokens"] / row["duration_s"]
        if abs(derived - row["output_throughput"]) > max(0.02 * derived, 0.05):
            errors.append(
                f"output throughput {row['output_throughput']} is not total output tokens "
                f"over duration ({derived:.2f})"
            )
    for metric in ("ttft", "itl"):
        p50, p99 = row[f"p50_{metric}_ms"], row[f"p99_{metric}_ms"]
        if p50 is None or p99 is None or p50 <= 0:
            errors.append(f"no {metric.upper()} percentiles")
        elif p99 < p50:
            errors.append(f"{metric.upper()} p99 {p99} is below p50 {p50}")
    return errors


def to_csv(rows: list[dict]) -> str:
    """Rows sorted by shape then concurrency, as CSV with a header."""
    ordered = sorted(
        rows, key=lambda r: (r["input_len"] or 0, r["output_len"] or 0, r["concurrency"] or 0)
    )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in ordered:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})
    return buffer.getvalue()


def table(rows: list[dict]) -> list[str]:
    """A short fixed-width table for the console."""
    head = ["conc", "in", "out", "ok", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99"]  # fmt: skip
    body = [
        [str(r["concurrency"]), str(r["input_len"]), str(r["output_len"]), str(r["completed"]),
         f"{r['request_throughput']:.2f}", f"{r['output_throughput']:.1f}",
         _ms(r["p50_ttft_ms"]), _ms(r["p99_ttft_ms"]), _ms(r["p50_itl_ms"]), _ms(r["p99_itl_ms"])]
        for r in sorted(rows, key=lambda r: (r["input_len"] or 0, r["output_len"] or 0,
                                             r["concurrency"] or 0))
    ]  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return [
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]
    ]


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f} ms"
