#!/usr/bin/env python3
"""Where the time of `make demo`, `make test` and `.ci/run` goes.

    phases.py run NAME -- COMMAND...   run COMMAND as the phase NAME: says when it starts, a
                                       line every 30 s while it runs, and its seconds at the
                                       end; appends that line to $DGX_SPARK_PHASES if set
    phases.py run --lowest-priority NAME -- COMMAND...
                                       the same, with COMMAND in a session of its own at the
                                       lowest CPU priority: beside other phases, it takes only
                                       the CPU they leave idle (shown in the table, not summed)
    phases.py begin                    empty $DGX_SPARK_PHASES (unless an outer script already
                                       began it: DGX_SPARK_PHASES_OUTER=1)
    phases.py table [LOG...]           the table of phases found in LOGs (default
                                       $DGX_SPARK_PHASES): the [phase] lines this script
                                       writes and the seconds the sim prints for its own
                                       steps ([sim] ... in 12s)

Standard library only: it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HEARTBEAT_S = 30
BESIDE = "beside the others at the lowest priority"
# "[phase] sim-up: 123.4 s (ok)" / "[phase] lint: 3.0 s (failed, rc 2)"
PHASE_DONE = re.compile(
    r"^\[phase\] (?P<name>[\w.+-]+): (?P<seconds>\d+(?:\.\d+)?) s \((?P<how>[^)]*)\)"
)
# The sim's own steps: "[sim] vllm-donor:0.32.0-cpu: built in 145s", "... loaded into
# spark-1, spark-2 in 105s", "[sim] tiny model: weights trained ... in 9s".
SIM_STEP = re.compile(
    r"^\[sim\] (?P<name>[^:]+(?::[\w.\-]+)?): (?P<what>.*?) in (?P<seconds>\d+(?:\.\d+)?)s\b"
)


def log_file() -> Path | None:
    path = os.environ.get("DGX_SPARK_PHASES")
    return Path(path) if path else None


def say(line: str) -> None:
    print(line, flush=True)
    path = log_file()
    if path is not None and line.startswith("[phase]") and PHASE_DONE.match(line):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(line + "\n")


def lowest_priority() -> None:
    """In the child, before its command: the lowest CPU priority for its whole session. Where
    the kernel shares CPU time between sessions first (sched_autogroup), a nice value only
    counts against the same session's processes, so the session's own weight is lowered too
    (/proc/self/autogroup, once the child leads a session of its own)."""
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write("19")
    except OSError:
        pass  # no autogroup: the nice value alone weighs against every process
    os.nice(19)


def run(name: str, command: list[str], lowest: bool = False) -> int:
    """Run one phase; its output passes through untouched."""
    started = time.monotonic()
    say(f"[phase] {name}: started" + (f" ({BESIDE})" if lowest else ""))
    parent = os.environ.get("DGX_SPARK_PHASE_PARENT")
    if lowest:  # a stop of this phase stops its session too (below)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # Started before the heartbeat's thread: a preexec_fn is safe only while there is none.
    proc = subprocess.Popen(
        command,
        env={**os.environ, "DGX_SPARK_PHASE_PARENT": name},
        start_new_session=lowest,
        preexec_fn=lowest_priority if lowest else None,  # noqa: PLW1509
    )
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            say(f"[phase] {name}: still running, {time.monotonic() - started:.0f} s so far")

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        rc = proc.wait()
    except BaseException:
        # Its own session does not get the terminal's interrupt: stop all of it here.
        if lowest:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
    seconds = time.monotonic() - started
    how = "ok" if rc == 0 else f"failed, rc {rc}"
    # A phase inside another (run in parallel with its siblings) is shown, not summed; so is
    # one at the lowest priority, beside the others.
    how += f", within {parent}" if parent else ""
    how += f", {BESIDE}" if lowest else ""
    say(f"[phase] {name}: {seconds:.1f} s ({how})")
    return rc


def beside_or_within(how: str) -> bool:
    """A phase run inside another, or beside the others at the lowest priority: the table
    shows it indented and does not add it to the total."""
    return ", within " in how or f", {BESIDE}" in how


def parse(text: str) -> list[tuple[str, float, str]]:
    """(name, seconds, how) of every phase and sim step in a log, in order."""
    rows = []
    for line in text.splitlines():
        phase = PHASE_DONE.match(line.strip())
        if phase:
            name = f"  {phase['name']}" if beside_or_within(phase["how"]) else phase["name"]
            rows.append((name, float(phase["seconds"]), phase["how"]))
            continue
        step = SIM_STEP.match(line.strip())
        if step:
            rows.append((f"  sim: {step['name']} ({step['what']})", float(step["seconds"]), "step"))
    return rows


def table(rows: list[tuple[str, float, str]]) -> str:
    """The phases with their seconds and minutes. Sim steps and phases run within another are
    indented and not summed: the total is the wall time of the outer phases."""
    if not rows:
        return "no phases found"
    width = max(len(name) for name, _s, _h in rows)
    lines = [f"{'phase'.ljust(width)}  {'seconds':>8}  {'min':>5}  result"]
    total = 0.0
    for name, seconds, how in rows:
        if how != "step" and not beside_or_within(how):
            total += seconds
        lines.append(f"{name.ljust(width)}  {seconds:8.1f}  {seconds / 60:5.1f}  {how}")
    lines.append(f"{'total (phases)'.ljust(width)}  {total:8.1f}  {total / 60:5.1f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "run" and "--" in argv:
        split = argv.index("--")
        options, name = argv[1 : split - 1], argv[split - 1]
        if split >= 2 and options in ([], ["--lowest-priority"]):
            return run(name, argv[split + 1 :], lowest=bool(options))
    if argv[:1] == ["begin"]:
        path = log_file()
        if path is not None and os.environ.get("DGX_SPARK_PHASES_OUTER") != "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        return 0
    if argv[:1] == ["table"]:
        paths = [Path(p) for p in argv[1:]] or ([log_file()] if log_file() else [])
        text = "".join(p.read_text() for p in paths if p.exists())
        print(table(parse(text)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
