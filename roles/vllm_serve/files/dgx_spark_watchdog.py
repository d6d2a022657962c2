# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Liveness that asks the model, on the head: restart the serving group when it stops serving.

Docker's restart policy brings back a process that exited; it cannot see ranks that still
run but no longer answer (a rank frozen, a peer that left the collective, a driver whose Ray
actors are gone). Every ``interval`` seconds this watchdog asks the endpoint for one token.
After ``failures`` unanswered probes in a row, and once the group is past its start-up grace,
it restarts the head's serving container (under vLLM's Ray executor the whole group: the
ranks are that driver's actors and die with it). The start-up grace ends as soon as the
started group has answered a probe or its API server's ``/health`` has answered (weights
loaded, engine up): a rank that freezes right after a start is judged at once, not after the
grace. While it starts, the grace lasts as long as the container's log shows progress (a new
phase, one more shard, a compile step: ``vllm_start.py``, installed beside this script): it
ends after ``stall`` seconds without progress, or ``grace`` seconds after the start however
it progresses. After ``max_restarts`` restarts within
``window`` seconds it gives up loudly: it stops restarting and says so in its state file
(``state: gave-up``, with the reason), which ``playbooks/status.yml`` shows, instead of
looping silently.

Busy is not dead: under full load the probe's one token can wait in the queue longer than the
probe allows. Before a restart the watchdog reads vLLM's ``/metrics`` (with the key): tokens
generated or prefilled since the read before, or requests running, mean the engine works
(``vllm_metrics.busy_reason``). It then logs why and waits (``state: busy``), for at most
``busy_limit`` seconds; a restart would throw away every request in flight. A frozen rank
generates nothing and runs nothing, and is restarted as before.

A serving container stopped on purpose (``docker stop``: exited, not restarting, although its
restart policy would bring back a crash) is left stopped (``state: stopped``): the serving
stage stops a failed first start that way, keeping it for its logs.

Standard library only; the Docker Engine API is reached over the mounted socket, the endpoint
through the collection's one client of it (``vllm_client.py``, installed beside this script
with ``vllm_health.py``, which judges its answers). The key is read from the serving
configuration's auth.json (mounted read-only), never from arguments.
"""

from __future__ import annotations

import argparse
import calendar
import http.client
import json
import os
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

# vllm_start.py and vllm_client.py (the collection's module_utils) are installed beside this
# script, each with the module_utils it imports (watchdog.yml).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_client  # noqa: E402
import vllm_metrics  # noqa: E402
import vllm_start  # noqa: E402

# Docker brings a container with these policies back after a crash, not after `docker stop`.
RESTARTING_POLICIES = ("always", "unless-stopped")


@dataclass
class Watch:
    """What the watchdog remembers between probes; ``decide`` is its only logic."""

    failures: int = 3
    grace: float = 600.0
    max_restarts: int = 3
    window: float = 1800.0
    misses: int = 0
    restarts: list[float] = field(default_factory=list)
    gave_up: str = ""
    last_answer: float | None = None
    last_up: float | None = None
    # Without progress in the log for this long a start is past its grace (grace: the ceiling).
    stall: float | None = None
    last_progress: float | None = None
    # A busy server (vllm_metrics.busy_reason) is not restarted for this long after it was
    # first found busy instead of answering.
    busy_limit: float = 600.0
    busy_since: float | None = None

    def decide(
        self,
        now: float,
        answered: bool,
        started_at: float | None,
        up: bool = False,
        busy: str = "",
        stopped: bool = False,
    ) -> str:
        """'ok', 'wait', 'busy', 'stopped', 'restart' or 'give-up' after one probe at ``now``.

        ``started_at`` is when the serving container last started (None: not running);
        ``up``: its API server's ``/health`` answered although the completion did not;
        ``busy``: why ``/metrics`` shows the engine at work ('' when it does not);
        ``stopped``: the container was stopped on purpose, and stays so.
        """
        if up:
            self.last_up = now
        if answered:
            # Serving again (a rerun of the serve stage, a peer back): watch afresh.
            self.misses, self.gave_up, self.last_answer = 0, "", now
            self.busy_since = None
            return "ok"
        if stopped:
            self.misses, self.busy_since = 0, None
            return "stopped"
        if self.gave_up:
            return "give-up"
        if self.starting(now, started_at):
            # Started, neither served nor up yet (weights load, compile): not a failure yet.
            return "wait"
        self.misses += 1
        if self.misses < self.failures:
            return "wait"
        if not busy:
            self.busy_since = None
        else:
            self.busy_since = now if self.busy_since is None else self.busy_since
            if now - self.busy_since < self.busy_limit:
                # Judged again at the next probe: a server that stops working is restarted then.
                self.misses = self.failures - 1
                return "busy"
        recent = [t for t in self.restarts if now - t < self.window]
        if len(recent) >= self.max_restarts:
            self.gave_up = (
                f"{len(recent)} restarts in {int(self.window)} s did not bring the endpoint back"
            )
            return "give-up"
        self.restarts = [*recent, now]
        self.misses, self.busy_since = 0, None
        return "restart"

    def starting(self, now: float, started_at: float | None) -> bool:
        """Within the start-up grace of the container started at ``started_at``: neither an
        answer nor an up ``/health`` seen since that start."""
        if started_at is None:
            return False
        if any(t is not None and t >= started_at for t in (self.last_answer, self.last_up)):
            return False
        stall = self.grace if self.stall is None else self.stall
        progress = max(started_at, self.last_progress or started_at)
        verdict = vllm_start.stall_verdict(now, started_at, progress, stall, self.grace)
        return verdict == "progressing"


class DockerSocket(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=120)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def docker(sock: str, method: str, path: str) -> tuple[int, dict]:
    conn = DockerSocket(sock)
    try:
        conn.request(method, path)
        answer = conn.getresponse()
        raw = answer.read()
        return answer.status, (json.loads(raw) if raw.strip().startswith(b"{") else {})
    finally:
        conn.close()


def docker_raw(sock: str, path: str) -> tuple[int, bytes]:
    conn = DockerSocket(sock)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def demux(raw: bytes) -> str:
    """The text of a container's log as the Engine API sends it: framed per stream (8-byte
    headers) unless the container has a TTY."""
    if len(raw) < 8 or raw[0] not in (0, 1, 2) or raw[1:4] != b"\0\0\0":
        return raw.decode("utf-8", "replace")
    out, at = [], 0
    while at + 8 <= len(raw):
        size = int.from_bytes(raw[at + 4 : at + 8], "big")
        out.append(raw[at + 8 : at + 8 + size])
        at += 8 + size
    return b"".join(out).decode("utf-8", "replace")


def new_log_lines(sock: str, container: str, after: float) -> list[str]:
    """The container's log lines stamped after ``after`` (Docker's clock, this host's)."""
    query = f"stdout=1&stderr=1&timestamps=1&since={int(after)}"
    status, raw = docker_raw(sock, f"/containers/{container}/logs?{query}")
    if status != 200:
        return []
    lines = []
    for line in demux(raw).splitlines():
        try:
            stamp = vllm_start.split_line(line)[0]
        except ValueError:
            stamp = None
        if stamp is None or stamp > after:
            lines.append(line)
    return lines


def container_state(sock: str, container: str) -> tuple[float | None, bool]:
    """(when the container last started, None when it does not run; whether it was stopped on
    purpose)."""
    status, info = docker(sock, "GET", f"/containers/{container}/json")
    return read_state(info if status == 200 else {})


def read_state(info: dict) -> tuple[float | None, bool]:
    """``container_state`` from the Engine API's inspect answer."""
    state = info.get("State") or {}
    if state.get("Running"):
        started = time.strptime(state["StartedAt"][:19], "%Y-%m-%dT%H:%M:%S")
        return calendar.timegm(started), False
    policy = ((info.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name", "")
    # A crash under these policies is restarting; exited and not restarting: `docker stop`.
    stopped = (
        state.get("Status") == "exited"
        and not state.get("Restarting")
        and policy in RESTARTING_POLICIES
    )
    return None, stopped


def urllib_open(url: str, data=None, headers=None, method=None, timeout: float = 30.0):
    """vllm_client's opener here, where no Ansible is: urllib with open_url's arguments."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (the endpoint's URL)


def probe(url: str, key: str, model: str, timeout: float) -> bool:
    """One token from the model: the ranks compute together."""
    endpoint = vllm_client.Client(url, key, timeout, opener=urllib_open)
    return endpoint.complete(model, "ping").ok


def metrics(url: str, key: str, model: str, timeout: float) -> dict | None:
    """vLLM's gauges and counters for ``model`` (``vllm_metrics.summarize``); None when
    ``/metrics`` gives none."""
    text = vllm_client.Client(url, key, timeout, opener=urllib_open).metrics()[0]
    try:
        return vllm_metrics.summarize(text, model) if text else None
    except vllm_metrics.MetricsError:
        return None


def health(url: str, timeout: float) -> bool:
    """The API server's ``/health`` answers (the engine is up, whether or not the ranks are)."""
    return vllm_client.Client(url, timeout=timeout, opener=urllib_open).health()[0] == 200


def write_state(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**state, "at": int(time.time())}) + "\n")
    os.replace(tmp, path)


def write_metrics(path: Path, **values: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"dgx_spark_watchdog_{k} {v}\n" for k, v in values.items()))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--container", default="dgx-spark-vllm")
    parser.add_argument("--auth", type=Path, help="auth.json of the serving configuration")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--docker-socket", default="/var/run/docker.sock")
    parser.add_argument("--interval", type=float, default=30)
    # While a start is in its grace, probes come this often: the grace ends with the first
    # answer, and a group that serves briefly before the next fault must not go unseen.
    parser.add_argument("--start-interval", type=float, default=2)
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--failures", type=int, default=3)
    parser.add_argument("--grace", type=float, default=3600)
    parser.add_argument("--stall", type=float, default=900)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--window", type=float, default=1800)
    parser.add_argument("--busy-limit", type=float, default=600)
    args = parser.parse_args(argv)
    # The script is its container's PID 1, which the kernel spares SIGTERM unless it asks for
    # it: without this, every `docker stop` (the serving stage pauses the watchdog before each
    # restart of the group) waited Docker's 10 s and then killed it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    watch = Watch(args.failures, args.grace, args.max_restarts, args.window, stall=args.stall,
                  busy_limit=args.busy_limit)  # fmt: skip
    progress, read_until = None, 0.0
    # The last /metrics read and its time: busy_reason compares two reads.
    seen, seen_at = None, 0.0
    while True:
        key = json.loads(args.auth.read_text())["key"] if args.auth and args.auth.exists() else ""
        since, stopped = container_state(args.docker_socket, args.container)
        if since is not None and (progress is None or progress.started != since):
            progress, read_until = vllm_start.StartProgress(since), since - 1
            watch.last_progress = None
        if progress is not None and watch.starting(time.time(), since):
            lines = new_log_lines(args.docker_socket, args.container, read_until)
            stamps = [vllm_start.split_line(line)[0] for line in lines]
            read_until = max([read_until, *[t for t in stamps if t]])
            progress.feed(lines, time.time())
            watch.last_progress = progress.last_progress
        answered = since is not None and probe(args.url, key, args.model, args.timeout)
        up = since is not None and not answered and health(args.url, args.timeout)
        busy = ""
        if since is not None and not answered and not watch.starting(time.time(), since):
            now_metrics, now_at = metrics(args.url, key, args.model, args.timeout), time.time()
            busy = vllm_metrics.busy_reason(seen, now_metrics, now_at - seen_at)
            seen, seen_at = now_metrics, now_at
        else:
            seen = None
        verdict = watch.decide(time.time(), answered, since, up, busy, stopped)
        if verdict == "busy":
            waited = int(time.time() - (watch.busy_since or time.time()))
            print(f"watchdog: {args.model} did not answer a probe within {args.timeout:g} s but "
                  f"is busy ({busy}): not restarting {args.container}; waited {waited} s of "
                  f"at most {args.busy_limit:g} s", flush=True)  # fmt: skip
        elif verdict == "restart":
            how = ""
            if busy:
                how = f" and stayed busy past {args.busy_limit:g} s ({busy})"
            if progress is not None and since is not None and progress.started == since:
                how += f" (its start reached: {progress.summary()})"
            print(f"watchdog: {args.model} did not answer {args.failures} probes{how}: "
                  f"restarting {args.container}", flush=True)  # fmt: skip
            docker(args.docker_socket, "POST", f"/containers/{args.container}/restart?t=30")
        elif verdict == "give-up":
            print(f"watchdog: giving up: {watch.gave_up}", file=sys.stderr, flush=True)
        state = {"ok": "serving", "wait": "waiting", "busy": "busy", "stopped": "stopped",
                 "restart": "restarted", "give-up": "gave-up"}[verdict]  # fmt: skip
        phase = progress.phase if progress is not None and verdict == "wait" else ""
        write_state(args.state, state=state, reason=watch.gave_up or busy, misses=watch.misses,
                    restarts=len(watch.restarts), phase=phase)  # fmt: skip
        # For node exporter's textfile collector (the monitoring role links it in).
        write_metrics(args.state.with_name("watchdog.prom"), answered=int(answered),
                      starting=int(watch.starting(time.time(), since)),
                      gave_up=int(verdict == "give-up"), busy=int(verdict == "busy"),
                      restarts=len(watch.restarts))  # fmt: skip
        time.sleep(args.start_interval if watch.starting(time.time(), since) else args.interval)


if __name__ == "__main__":
    sys.exit(main())
