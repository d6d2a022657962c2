#!/usr/bin/env python3
"""Where the machine's CPU goes during a playbook run on the simulated pair: the controller
(everything outside the containers: ansible-playbook, its workers, ssh), each node container
(sshd, the modules' Python, the node's dockerd) and each container a node runs (Ray, vLLM,
the watchdog); with the wall time, how busy all cores were, and the time the hypervisor
took (steal), which is what makes the same run's time vary from machine to machine.

It answers whether a phase of `make test` can go faster beside another one: when a run
keeps the cores busy, running more beside it only shares them.

Reads the kernel's per-cgroup CPU time (cgroup v1 cpuacct.usage or v2 cpu.stat) and
/proc/stat, as root, on the machine that runs the pair.

Usage (the pair up and deployed, from the repository root):
    .venv/bin/python tools/cpu_split.py [-i inventories/sim] [-- COMMAND...]
    .venv/bin/python tools/cpu_split.py --idle 60
Without a command it runs `deploy.yml -e deploy_full=true` (every stage, nothing to change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

# The product's no-op rerun benchmark (benchmarks/noop_rerun.py) times a playbook run; this
# tool times its runs the same way.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from noop_rerun import BIN, timed  # noqa: E402

CGROUP = Path("/sys/fs/cgroup")
# The sim's node containers carry this label (sim/sim_common.py).
NODE_LABEL = "dgx_spark.sim=node"
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...
BUSY_FIELDS = (0, 1, 2, 5, 6)
STEAL_FIELD = 7


def proc_stat_seconds(text: str, hz: int) -> tuple[float, float]:
    """(busy, steal) CPU seconds of all cores from /proc/stat's first line."""
    fields = [int(v) for v in text.splitlines()[0].split()[1:]]
    return sum(fields[i] for i in BUSY_FIELDS) / hz, fields[STEAL_FIELD] / hz


def cgroup_seconds(name: str, text: str) -> float:
    """CPU seconds in a cgroup file: v1 cpuacct.usage (ns) or v2 cpu.stat (usage_usec)."""
    if name == "cpuacct.usage":
        return int(text) / 1e9
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"no usage_usec in {name}")


def cgroup_files(root: Path = CGROUP) -> dict[str, Path]:
    """Container ID -> its CPU usage file, for each container cgroup Docker made (cgroupfs or
    systemd driver, v1 or v2)."""
    found: dict[str, Path] = {}
    for parent in (root / "cpuacct" / "docker", root / "docker", root / "system.slice"):
        if not parent.is_dir():
            continue
        for entry in parent.iterdir():
            cid = entry.name.removeprefix("docker-").removesuffix(".scope")
            if len(cid) != 64:
                continue
            for name in ("cpuacct.usage", "cpu.stat"):
                if (entry / name).is_file():
                    found[cid] = entry / name
                    break
    return found


def snapshot(files: dict[str, Path], hz: int) -> dict[str, float]:
    """CPU seconds so far: per container ID, and the machine's 'busy' and 'steal'."""
    got = {}
    for cid, path in files.items():
        with contextlib.suppress(OSError):  # the container went in between
            got[cid] = cgroup_seconds(path.name, path.read_text())
    got["busy"], got["steal"] = proc_stat_seconds(Path("/proc/stat").read_text(), hz)
    return got


def split(
    before: dict[str, float], after: dict[str, float], names: dict[str, str]
) -> tuple[float, float, list[tuple[str, float]]]:
    """(busy, steal, rows): the machine's busy and stolen seconds between two snapshots, and
    rows of (where, seconds), largest first: each named container that used CPU, and the
    controller (busy less all containers). A container that started in between counts from
    zero; one that ended in between is not seen (its time stays in no row)."""
    busy = after["busy"] - before["busy"]
    steal = after["steal"] - before["steal"]
    rows = []
    for cid, seconds in after.items():
        if cid in ("busy", "steal"):
            continue
        used = seconds - before.get(cid, 0.0)
        if used > 0:
            rows.append((names.get(cid, cid[:12]), used))
    rows.append(("controller (outside the containers)", busy - sum(s for _n, s in rows)))
    return busy, steal, sorted(rows, key=lambda row: -row[1])


def container_names() -> dict[str, str]:
    """Container ID -> name: the node containers, and 'node/name' for what each node runs."""

    def ps(*prefix: str, label: str = "") -> list[tuple[str, str]]:
        cmd = [*prefix, "docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"]
        out = subprocess.run(cmd + (["--filter", f"label={label}"] if label else []),
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return [tuple(line.split()) for line in out.splitlines() if line]

    names = {}
    for cid, node in ps(label=NODE_LABEL):
        names[cid] = node
        for inner, name in ps("docker", "exec", node):
            names[inner] = f"{node}/{name}"
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", default="inventories/sim")
    parser.add_argument("--idle", type=float, metavar="SECONDS",
                        help="run nothing: what the pair uses by itself for that long")  # fmt: skip
    parser.add_argument("command", nargs="*", help="after --: the command to measure")
    args = parser.parse_args()
    command = args.command or [str(BIN / "ansible-playbook"), "deploy.yml", "-i",
                               args.inventory, "-e", "deploy_full=true"]  # fmt: skip
    hz = os.sysconf("SC_CLK_TCK")
    cores = os.cpu_count() or 1
    files = cgroup_files()
    if not files:
        sys.exit(f"no container cgroups under {CGROUP}: run this as root on the pair's machine")
    before = snapshot(files, hz)
    if args.idle is not None:
        what = f"the pair alone for {args.idle:.0f} s"
        time.sleep(args.idle)
        wall = args.idle
    else:
        what = " ".join(Path(c).name if c.startswith("/") else c for c in command)
        wall = timed(command)[0]  # noop_rerun's: it stops here when the command fails
    after = snapshot(cgroup_files(), hz)
    # Named afterwards: a container the run started has a name then.
    busy, steal, rows = split(before, after, container_names())
    print(f"{what}: {wall:.1f} s wall on {cores} cores")
    share = wall * cores
    print(f"  CPU busy {busy:.1f} s ({busy / share:.0%} of all cores); "
          f"taken by the hypervisor (steal) {steal:.1f} s ({steal / share:.0%})")  # fmt: skip
    for where, seconds in rows:
        print(f"  {seconds:7.1f} s  {seconds / busy:4.0%}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
