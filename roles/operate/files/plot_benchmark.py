# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plot a benchmark results directory (its summary.csv) written by playbooks/benchmark.yml.

    python plot_benchmark.py RESULTS_DIR [--compare OTHER_RESULTS_DIR]

Writes into RESULTS_DIR: throughput.png (output tokens/s against concurrency), ttft.png and
itl.png (p50/p90/p99 against concurrency), one line per prompt/output shape; with --compare,
compare.png: output tokens/s of both directories on one plot. Prints each file it writes.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

PERCENTILES = (50, 90, 99)
STYLES = {50: "-", 90: "--", 99: ":"}


def read_summary(directory: Path) -> dict[tuple[int, int], list[dict]]:
    """Rows of summary.csv grouped by (input_len, output_len), sorted by concurrency."""
    path = directory / "summary.csv"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: is {directory} a benchmark results directory?")
    shapes: dict[tuple[int, int], list[dict]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) if v not in ("", None) else None for k, v in row.items()}
            shape = (int(values["input_len"]), int(values["output_len"]))
            shapes.setdefault(shape, []).append(values)
    if not shapes:
        raise SystemExit(f"{path} has no rows")
    for rows in shapes.values():
        rows.sort(key=lambda r: r["concurrency"])
    return shapes


def _axes(title: str, ylabel: str, concurrency: list[float]):
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    axes.set_title(title)
    axes.set_xlabel("concurrency (requests in flight)")
    axes.set_ylabel(ylabel)
    axes.set_xscale("log", base=2)
    axes.set_xticks(concurrency, [f"{c:g}" for c in concurrency])
    axes.grid(True, which="both", alpha=0.3)
    return figure, axes


def _save(figure, axes, path: Path) -> Path:
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _levels(*groups) -> list[float]:
    return sorted({r["concurrency"] for shapes in groups for rows in shapes.values() for r in rows})


def plot_throughput(shapes, directory: Path) -> Path:
    figure, axes = _axes("Output throughput", "output tokens/s", _levels(shapes))
    for (inp, out), rows in sorted(shapes.items()):
        axes.plot([r["concurrency"] for r in rows], [r["output_throughput"] for r in rows],
                  marker="o", label=f"{inp} in / {out} out")  # fmt: skip
    return _save(figure, axes, directory / "throughput.png")


def plot_latency(shapes, directory: Path, metric: str, title: str) -> Path:
    figure, axes = _axes(title, "milliseconds", _levels(shapes))
    for index, ((inp, out), rows) in enumerate(sorted(shapes.items())):
        color = f"C{index}"
        for p in PERCENTILES:
            key = f"p{p}_{metric}_ms"
            points = [(r["concurrency"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                axes.plot(*zip(*points, strict=True), STYLES[p], marker="o", color=color,
                          label=f"p{p}, {inp} in / {out} out")  # fmt: skip
    return _save(figure, axes, directory / f"{metric}.png")


def plot_compare(shapes, other, directory: Path, other_dir: Path) -> Path:
    figure, axes = _axes("Output throughput: two runs", "output tokens/s", _levels(shapes, other))
    for label, group, style in ((directory.name, shapes, "-"), (other_dir.name, other, "--")):
        for (inp, out), rows in sorted(group.items()):
            name = label if len(group) == 1 else f"{label}, {inp} in / {out} out"
            axes.plot([r["concurrency"] for r in rows], [r["output_throughput"] for r in rows],
                      style, marker="o", label=name)  # fmt: skip
    return _save(figure, axes, directory / "compare.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--compare", type=Path, help="an earlier results directory")
    args = parser.parse_args(argv)
    shapes = read_summary(args.results_dir)
    written = [
        plot_throughput(shapes, args.results_dir),
        plot_latency(shapes, args.results_dir, "ttft", "Time to first token"),
        plot_latency(shapes, args.results_dir, "itl", "Inter-token latency"),
    ]
    if args.compare:
        other = read_summary(args.compare)
        written.append(plot_compare(shapes, other, args.results_dir, args.compare))
    for path in written:
        print(f"plot: {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
