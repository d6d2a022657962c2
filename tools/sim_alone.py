#!/usr/bin/env python3
"""Run every tests/sim module alone, each in a fresh pytest process, in a shuffled order.

Proves that no module leans on what another left behind: each takes the pair from what it
finds. The order comes from a seed, printed first so that a failing order can be run again
(`--seed N`); `--dry-run` prints the order without running anything. Each module's output
goes to .cache/sim-alone/<module>.log; the table at the end gives module, result (pass,
fail, none: nothing collected, error: pytest itself failed) and seconds.

Usage (from the repository root, on the pair `make demo` leaves):
    python3 tools/sim_alone.py [--seed N] [-m "not drill"] [--dry-run] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path("tests") / "sim"
LOGS = Path(".cache") / "sim-alone"
# pytest's exit codes (https://docs.pytest.org/en/stable/reference/exit-codes.html).
OUTCOMES = {0: "pass", 1: "fail", 5: "none"}


def modules(folder: Path) -> list[str]:
    """The test modules of a folder, by name, sorted (the shuffle's starting point)."""
    return sorted(path.name for path in folder.glob("test_*.py"))


def order(names: list[str], seed: int) -> list[str]:
    """The names shuffled by ``seed``: the same seed, the same order."""
    shuffled = sorted(names)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def outcome(rc: int) -> str:
    """A pytest exit status in a word: pass, fail, none (nothing collected) or error."""
    return OUTCOMES.get(rc, "error")


def table(rows: list[tuple[str, str, float]], seed: int) -> str:
    """module / result / seconds, in the order they ran, with the seed and the totals."""
    width = max([len("module"), *(len(name) for name, _r, _s in rows)])
    lines = [f"seed {seed}", f"{'module':<{width}}  {'result':<6}  {'seconds':>8}"]
    lines += [f"{name:<{width}}  {result:<6}  {seconds:>8.1f}" for name, result, seconds in rows]
    counts = {
        word: sum(r == word for _n, r, _s in rows) for word in ("pass", "fail", "none", "error")
    }
    said = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    total = sum(seconds for _n, _r, seconds in rows)
    lines.append(f"{'total':<{width}}  {said or '0 modules'}  ({total:.1f} s)")
    return "\n".join(lines)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=None, help="the shuffle's seed (default: random)")
    p.add_argument(
        "-m", dest="marks", default="not drill", help="pytest's -m (default: %(default)s)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the order, run nothing")
    p.add_argument("--tests", type=Path, default=TESTS, help="the folder (default: %(default)s)")
    p.add_argument("pytest_args", nargs="*", help="after --: more arguments for each pytest")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    return args


def run_one(name: str, args: argparse.Namespace) -> tuple[str, str, float]:
    cmd = [sys.executable, "-m", "pytest", "-q", str(args.tests / name), *args.pytest_args]
    if args.marks:
        cmd += ["-m", args.marks]
    log = ROOT / LOGS / (Path(name).stem + ".log")
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    return name, outcome(rc.returncode), seconds


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    names = order(modules(ROOT / args.tests), args.seed)
    print(f"seed {args.seed}: {len(names)} modules: {' '.join(names)}", flush=True)
    if args.dry_run:
        return 0
    (ROOT / LOGS).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        rows.append(run_one(name, args))
        print(f"{rows[-1][0]}: {rows[-1][1]} in {rows[-1][2]:.0f}s", flush=True)
    print(table(rows, args.seed))
    return 0 if all(result in ("pass", "none") for _n, result, _s in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
