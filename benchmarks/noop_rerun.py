#!/usr/bin/env python3
"""What a rerun of deploy.yml with nothing to do costs, against an `ansible -m ping` of the pair.

Runs deploy.yml once (a full run when the pair is not in step; it records), then N times
more with nothing to do, and N pings of the same inventory; prints the medians, their ratio
(issue #42's goal: at most 2), and the tasks each node ran. It also times the floor no rerun
can go below: ansible-playbook reading deploy.yml and its roles without connecting
(--list-tasks), as a multiple of the ping. `--full` also times N runs of
every stage with nothing to change (-e deploy_full=true; issue #42's goal: at most 60 s),
the cost before the in-step check.

Usage: noop_rerun.py [--runs 5] [--full] [-i inventories/sim]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def timed(cmd: list[str], json_out: bool = False) -> tuple[float, dict]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    if json_out:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}")
    return seconds, json.loads(proc.stdout)["stats"] if json_out else {}


def print_tasks(stats: dict) -> None:
    for host, counts in sorted(stats.items()):
        tasks = counts["ok"] + counts["changed"] + counts["skipped"] + counts["failures"]
        print(f"  {host:10} tasks {tasks:4}  changed {counts['changed']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="also time -e deploy_full=true")
    parser.add_argument("-i", "--inventory", default="inventories/sim")
    args = parser.parse_args()
    deploy = [str(BIN / "ansible-playbook"), "-i", args.inventory, "deploy.yml"]
    ping = [str(BIN / "ansible"), "-i", args.inventory, "sparks", "-m", "ansible.builtin.ping"]
    first, _ = timed(deploy, json_out=True)
    reruns, pings, parses, stats = [], [], [], {}
    for _ in range(args.runs):
        seconds, stats = timed(deploy, json_out=True)
        reruns.append(seconds)
        pings.append(timed(ping)[0])
        parses.append(timed([*deploy, "--list-tasks"])[0])
    rerun, ping_s = statistics.median(reruns), statistics.median(pings)
    parse = statistics.median(parses)
    print(f"first deploy.yml (records):         {first:7.1f} s")
    print(f"deploy.yml with nothing to do:      {rerun:7.1f} s  (median of {args.runs})")
    print(f"ansible -m ping of the pair:        {ping_s:7.2f} s  (median of {args.runs})")
    print(f"ratio:                              {rerun / ping_s:7.1f}  (issue #42: <= 2)")
    print(
        f"deploy.yml read, no connection:     {parse:7.2f} s  "
        f"({parse / ping_s:.1f}x the ping: the floor of any rerun)"
    )
    print_tasks(stats)
    if args.full:
        fulls, full_stats = [], {}
        for _ in range(args.runs):
            seconds, full_stats = timed([*deploy, "-e", "deploy_full=true"], json_out=True)
            fulls.append(seconds)
        full = statistics.median(fulls)
        print(
            f"every stage, nothing to change:     {full:7.1f} s  (median of {args.runs}; "
            f"issue #42: <= 60; each {', '.join(f'{s:.0f}' for s in fulls)})"
        )
        print_tasks(full_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
