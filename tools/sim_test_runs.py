#!/usr/bin/env python3
"""Where the sim tests' time goes: every Ansible run a session of tests/sim made, from the log
its conftest writes (.cache/sim-test-runs.jsonl, one JSON object a line), summed by test
module and by what ran (the playbook with its tags, and whether every stage ran), with the
longest runs and the share of the session spent inside Ansible.

It answers which runs make `make test` long: on the sim's two cores a task costs about a
third of a CPU-second, so a whole run of deploy.yml (400-odd tasks) is minutes, and the
suite's time is mostly how many whole runs it makes.

The log's first line is the session's start ({"session": <epoch seconds>}), its last the
session's end ({"ended": <epoch seconds>}, once the tests are done); each run's line:
    {"test": "test_upgrade.py::test_x", "phase": "call", "argv": ["deploy.yml", ...],
     "start": <epoch seconds>, "seconds": 12.3, "rc": 0, "tasks": 427, "ran": 690}
`tasks` is the number of tasks the run reached; `ran` the task results on hosts that were
not skipped (null for a run read as text).

Usage (from the repository root, after `make sim-test` or `make test`):
    python3 tools/sim_test_runs.py [LOG] [--top N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

DEFAULT_LOG = Path(".cache") / "sim-test-runs.jsonl"
# The options that change which part of a playbook runs (the rest are settings).
SCOPE_OPTIONS = ("--tags", "--skip-tags", "--limit", "-l", "-t")


def read_log(text: str) -> tuple[float | None, float | None, list[dict]]:
    """(the session's start, its end, its runs) from the log's text; the end is None while
    the session runs; a torn line is skipped."""
    session, ended, runs = None, None, []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "session" in entry:
            session, ended, runs = entry["session"], None, []
        elif "ended" in entry:
            ended = entry["ended"]
        elif "argv" in entry:
            runs.append(entry)
    return session, ended, runs


def kind(argv: list[str]) -> str:
    """What a run was, for grouping: its playbook (or ad-hoc module) with the options that
    scope it, and `every stage` where deploy_full=true asked for them all."""
    words, scope, full = [], [], False
    it = iter(argv)
    for arg in it:
        if arg in SCOPE_OPTIONS:
            scope.append(f"{arg} {next(it, '')}")
        elif arg in ("-e", "--extra-vars"):
            full = full or next(it, "").replace(" ", "") == "deploy_full=true"
        elif arg == "-m":
            words.append(f"-m {next(it, '')}")
        elif not arg.startswith("-") and not words:
            words.append(Path(arg).name if arg.startswith("/") else arg)
    return " ".join([*words, *scope, *(["(every stage)"] if full else [])]) or "?"


def masked(argv: list[str]) -> list[str]:
    """``argv`` as the log keeps it: each extra variable by its name alone (a test may pass
    a key), but for true and false, which `kind` reads."""
    out, it = [], iter(argv)
    for arg in it:
        out.append(arg)
        if arg in ("-e", "--extra-vars"):
            value = next(it, "")
            name, sep, setting = value.partition("=")
            keep = sep and " " not in value and setting.lower() in ("true", "false")
            out.append(value if keep else f"{name}=..." if sep and "{" not in name else "...")
    return out


def module_of(test: str) -> str:
    return test.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py") or "?"


def summary(session: float | None, runs: list[dict], now: float, top: int = 10) -> str:
    """The report: the session's seconds, the share inside Ansible, by module, by kind of
    run, and the longest runs."""
    if not runs:
        return "No Ansible run is on record for this session."
    inside = sum(r["seconds"] for r in runs)
    start = session if session is not None else min(r["start"] for r in runs)
    wall = max(now - start, inside)
    lines = [
        f"{len(runs)} Ansible runs took {inside:.0f} s of the session's {wall:.0f} s "
        f"({100 * inside / wall:.0f} %); tasks reached {sum(r.get('tasks') or 0 for r in runs)}, "
        f"task results on hosts {sum(r.get('ran') or 0 for r in runs)}."
    ]

    def table(title: str, key) -> None:
        groups: dict[str, list[dict]] = defaultdict(list)
        for run in runs:
            groups[key(run)].append(run)
        lines.append(f"{title:<48} {'runs':>5} {'seconds':>8} {'tasks/run':>9}")
        for name, group in sorted(groups.items(), key=lambda g: -sum(r["seconds"] for r in g[1])):
            seconds = sum(r["seconds"] for r in group)
            tasks = sum(r.get("tasks") or 0 for r in group) / len(group)
            lines.append(f"{name[:48]:<48} {len(group):>5} {seconds:>8.0f} {tasks:>9.0f}")

    table("by test module", lambda r: module_of(r["test"]))
    table("by what ran", lambda r: kind(r["argv"]))
    lines.append(f"the {min(top, len(runs))} longest runs:")
    for run in sorted(runs, key=lambda r: -r["seconds"])[:top]:
        lines.append(
            f"{run['seconds']:>7.0f} s  {run['test']} ({run['phase']}): {kind(run['argv'])}, "
            f"{run.get('tasks') or 0} tasks, rc {run['rc']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("log", nargs="?", type=Path, default=DEFAULT_LOG)
    parser.add_argument("--top", type=int, default=10, help="how many of the longest runs")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        print(f"{args.log}: no such log (run the sim tests first)", file=sys.stderr)
        return 2
    session, ended, runs = read_log(args.log.read_text(encoding="utf-8"))
    last = max((r["start"] + r["seconds"] for r in runs), default=0.0)
    print(summary(session, runs, now=ended or last, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
