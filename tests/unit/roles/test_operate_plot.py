"""roles/operate/files/plot_benchmark.py: PNGs from a results directory's summary.csv."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import bench_results
from support.captures import load_json

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "operate"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plot():
    spec = importlib.util.spec_from_file_location(
        "plot_benchmark", ROOT / "roles" / "operate" / "files" / "plot_benchmark.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results_dir(path: Path, scale: float = 1.0) -> Path:
    rows = []
    for fixture in sorted(FIXTURES.glob("bench_serve_*.json")):
        row = bench_results.summary_row(load_json(fixture), 96, 24)
        row["output_throughput"] *= scale
        rows.append(row)
    path.mkdir()
    (path / "summary.csv").write_text(bench_results.to_csv(rows))
    return path


def test_plots_and_compare(plot, tmp_path, capsys):
    first = _results_dir(tmp_path / "first")
    second = _results_dir(tmp_path / "second", scale=1.5)
    assert plot.main([str(second), "--compare", str(first)]) == 0
    names = {"throughput.png", "ttft.png", "itl.png", "compare.png"}
    for name in names:
        data = (second / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    printed = capsys.readouterr().out.splitlines()
    assert {Path(line.split(": ", 1)[1]).name for line in printed} == names


def test_a_directory_without_summary_is_refused(plot, tmp_path):
    with pytest.raises(SystemExit, match="summary.csv does not exist"):
        plot.main([str(tmp_path)])
