#!/usr/bin/env python3
"""What the two kinds of run of deploy.yml cost (docs/deploy.md: "No-op or converge").

Runs deploy.yml once (a converge when the pair is not as the last converge left it; it
records), then N times more with nothing to do (no-ops), and N pings of the same inventory;
prints the medians, their ratio, and the tasks each node ran. It also times the floor no run
can go below: ansible-playbook reading deploy.yml and its roles without connecting
(--list-tasks), as a multiple of the ping. `--full` also times N converges with nothing to
change (-e deploy_full=true: every stage, each idempotent). `--change NAME=VALUE` times a
converge with one setting changed until the pair serves again (the run ends only once the
endpoint answers), then the converge back to the inventory's value.

Usage: noop_rerun.py [--runs 5] [--full] [--change NAME=VALUE] [-i inventories/sim]
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
    # The sim owner's sudo password is vaulted; its password file is the sim's (as the Makefile).
    env.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", str(ROOT / "inventories/sim/vault-password"))
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
    parser.add_argument("--change", metavar="NAME=VALUE", help="also time a converge with it")
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
    print(f"no-op deploy.yml:                   {rerun:7.1f} s  (median of {args.runs})")
    print(f"ansible -m ping of the pair:        {ping_s:7.2f} s  (median of {args.runs})")
    print(f"ratio:                              {rerun / ping_s:7.1f}")
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
            f"converge, nothing to change:        {full:7.1f} s  (median of {args.runs}; "
            f"each {', '.join(f'{s:.0f}' for s in fulls)})"
        )
        print_tasks(full_stats)
    if args.change:
        changed, change_stats = timed([*deploy, "-e", args.change], json_out=True)
        back, _ = timed(deploy, json_out=True)
        print(f"converge with {args.change}, to serving: {changed:7.1f} s; back: {back:.1f} s")
        print_tasks(change_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
