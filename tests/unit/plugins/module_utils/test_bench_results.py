"""plugins/module_utils/bench_results.py on `vllm bench serve` (0.32) results from the pair."""

from __future__ import annotations

import copy
import csv
import io
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import bench_results
from support.captures import load_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"
RUNS = {1: "bench_serve_c1_in96_out24.json", 4: "bench_serve_c4_in96_out24.json"}


def _result(concurrency):
    return load_json(FIXTURES / RUNS[concurrency])


@pytest.mark.parametrize("concurrency", sorted(RUNS))
def test_row_of_a_real_run(concurrency):
    result = _result(concurrency)
    row = bench_results.summary_row(result, 96, 24)
    assert row["concurrency"] == concurrency
    assert (row["input_len"], row["output_len"]) == (96, 24)
    assert row["completed"] == result["num_prompts"] and row["failed"] == 0
    assert row["output_throughput"] > 0
    assert row["total_output_tokens"] == row["completed"] * 24  # --ignore-eos
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < row[f"p50_{metric}_ms"] <= row[f"p90_{metric}_ms"] <= row[f"p99_{metric}_ms"]
    assert bench_results.check_row(row) == []


def test_lengths_default_to_the_runs_own():
    row = bench_results.summary_row(_result(1))
    assert row["output_len"] == 24
    assert 90 <= row["input_len"] <= 100


def test_csv_and_table_are_sorted_by_concurrency():
    rows = [bench_results.summary_row(_result(c), 96, 24) for c in (4, 1)]
    parsed = list(csv.DictReader(io.StringIO(bench_results.to_csv(rows))))
    assert [r["concurrency"] for r in parsed] == ["1", "4"]
    assert list(parsed[0]) == bench_results.COLUMNS
    assert float(parsed[1]["output_throughput"]) == rows[0]["output_throughput"]
    table = bench_results.table(rows)
    assert table[0].split()[:3] == ["conc", "in", "out"]
    assert table[1].split()[0] == "1" and len(table) == 3


def test_inconsistent_numbers_are_named():
    bad = copy.deepcopy(_result(4))
    bad["output_throughput"] *= 3
    bad["failed"] = 2
    bad["p99_itl_ms"] = bad["p50_itl_ms"] / 2
    errors = bench_results.check_row(bench_results.summary_row(bad, 96, 24))
    assert any("2 requests failed" in e for e in errors)
    assert any("not total output tokens over duration" in e for e in errors)
    assert any("ITL p99" in e for e in errors)


def test_not_a_result():
    with pytest.raises(bench_results.BenchResultError):
        bench_results.summary_row({"date": "x"})
