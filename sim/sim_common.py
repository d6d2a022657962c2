"""What simctl.py and sim_images.py share: where the sim keeps its state, the labels on all it
makes, the docker client it calls, and how a long step reports its progress."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".sim"
# Its one home: read as sim_common.DOCKER elsewhere, so pointing it at another client (tests do)
# reaches every call.
DOCKER = os.environ.get("DGXSIM_DOCKER", "docker")

LABEL = "dgx_spark.sim"
INPUTS_LABEL = "dgx_spark.sim.inputs"


@dataclass(frozen=True)
class Node:
    """One simulated Spark: its inventory name, management IP and fast-link IP."""

    name: str
    mgmt_ip: str
    fast_ip: str

    @property
    def container(self) -> str:
        return f"dgxsim-{self.name}"

    @property
    def volume(self) -> str:
        return f"dgxsim-{self.name}-docker"


class SimError(Exception):
    """A problem the user can act on; printed without a traceback."""


def log(msg: str) -> None:
    # One write per line: sim-up's background steps log from several threads at once.
    print(f"[sim] {msg}\n", end="", flush=True)
    # A step's time also goes to the phase log of make demo / make test (tools/phases.py).
    phases = os.environ.get("DGX_SPARK_PHASES")
    if phases and re.search(r" in \d+s\b", msg):
        with open(phases, "a") as out:
            out.write(f"[sim] {msg}\n")


def docker(
    *args: str, check: bool = True, capture: bool = True, **kw
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([DOCKER, *args], text=True, capture_output=capture, check=False, **kw)
    except FileNotFoundError as exc:
        raise SimError(
            f"the docker client '{DOCKER}' is not installed. Install Docker Engine "
            "(Debian: apt-get install docker.io) and start dockerd."
        ) from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()
        raise SimError(f"docker {' '.join(args[:3])} failed: {detail}")
    return proc


# A long step says something at least this often (issue: a newcomer cannot tell slow from hung).
HEARTBEAT_S = 20


def run_step(
    cmd: list[str], what: str, *, steps: str | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a long command: the lines matching ``steps`` (a regex) are printed as they come,
    and a line every HEARTBEAT_S seconds says it still runs; the whole output is kept for the
    error message."""
    started = time.monotonic()
    lines: list[str] = []
    pattern = re.compile(steps) if steps else None
    proc = subprocess.Popen(
        cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=1
    )

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if pattern and pattern.search(line):
                log(f"{what}: {line.strip()[:120]}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            log(f"{what}: still running, {time.monotonic() - started:.0f} s so far")
    reader.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")
