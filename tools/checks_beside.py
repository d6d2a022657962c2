#!/usr/bin/env python3
"""What lint and sanity cost a playbook run beside them, at the lowest CPU priority (as
`make test` runs them) and at equal priority (as it did before).

On the serving pair, times `deploy.yml -e deploy_full=true` (every stage, nothing to change:
the SSH-bound kind of run molecule and the sim tests are made of) alone, then beside
`make lint sanity` started through `phases.py run --lowest-priority`, then beside the same at
equal priority, then alone again; prints each run's seconds, its slowdown against the mean of
the two runs alone, and how long lint and sanity took beside it.

Usage (the pair up and deployed, from the repository root):
    .venv/bin/python tools/checks_beside.py [-i inventories/sim]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The product's no-op rerun benchmark (benchmarks/noop_rerun.py) times a playbook run; this
# tool times its runs the same way.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from noop_rerun import BIN, ROOT, timed  # noqa: E402

PHASES = ROOT / "tools" / "phases.py"
CHECKS = ["make", "--no-print-directory", "-j2", "--output-sync=target", "lint", "sanity"]
# Let lint and sanity start (their first seconds read files) before the run is timed.
HEAD_START_S = 15


def deploy(inventory: str) -> float:
    """Seconds of a run of every stage (noop_rerun's timing: it stops here when one fails)."""
    return timed([str(BIN / "ansible-playbook"), "deploy.yml", "-i", inventory,
                  "-e", "deploy_full=true"])[0]  # fmt: skip


def beside(inventory: str, lowest: bool) -> tuple[float, float]:
    """(the run's seconds, lint and sanity's seconds) with the checks beside the run."""
    option = ["--lowest-priority"] if lowest else []
    # Into a file, not /dev/null: make's --output-sync locks its output, and a lock another
    # program holds on /dev/null would hold make at its first target's end.
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        checks = subprocess.Popen(
            [sys.executable, str(PHASES), "run", *option, "lint+sanity", "--", *CHECKS],
            # make sets its own PATH and ANSIBLE_CONFIG; this run adds nothing to the phases log.
            cwd=ROOT, env={**os.environ, "DGX_SPARK_PHASES": ""}, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        time.sleep(HEAD_START_S)
        seconds = deploy(inventory)
        if checks.wait() != 0:
            out.seek(0)
            sys.exit(f"make lint sanity failed:\n{out.read().decode()[-3000:]}")
        return seconds, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", default="inventories/sim")
    args = parser.parse_args()
    alone = [deploy(args.inventory)]
    lowest, lowest_checks = beside(args.inventory, lowest=True)
    equal, equal_checks = beside(args.inventory, lowest=False)
    alone.append(deploy(args.inventory))
    base = sum(alone) / len(alone)
    print("deploy.yml -e deploy_full=true            seconds  slowdown  lint+sanity")
    print(f"alone (first, last)                       {alone[0]:5.1f}, {alone[1]:5.1f}")
    for label, seconds, checks in (
        ("beside lint+sanity, lowest priority", lowest, lowest_checks),
        ("beside lint+sanity, equal priority", equal, equal_checks),
    ):
        print(f"{label:40}  {seconds:7.1f}  {seconds / base - 1:+7.0%}  {checks:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
