"""Busy is not dead: the head's watchdog does not restart a pair whose probe waits in a full
queue, and still restarts a frozen rank as quickly as before.

The serving group runs with two sequence slots (vllm_serve_max_num_seqs: 2), so ten clients
asking for long completions keep a queue in front of every new request. A watchdog started
for this module beside the role's (paused meanwhile) probes every 3 s with a 1 s timeout and
restarts after 2 misses: under the load every probe misses, and only what /metrics shows
(tokens rising, requests running) keeps it from restarting. Then the worker's rank is frozen
(SIGSTOP, as benchmarks/drills.py does): no tokens, nothing running, and the watchdog restarts
the group within its probes' time plus the container's stop.

Needs the deployed pair; the module ends with the inventory's own settings deployed again.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import drills, on_node, run_playbook

pytestmark = pytest.mark.drill

SERVE = drills.SERVE
MODEL = drills.SERVED_MODEL
KEY = SERVE["vllm_serve_api_key"]
WATCHDOG = "dgx-spark-watchdog"
TEST_WATCHDOG = "dgx-spark-watchdog-busy"
# The test watchdog's limits: a probe timeout far below the queue's wait.
INTERVAL, TIMEOUT, FAILURES = 3, 1, 2


def docker_on(node, *argv: str, check: bool = True) -> str:
    return on_node(node, "docker", *argv, check=check).stdout.strip()


def started(node) -> tuple[str, int]:
    """(StartedAt, RestartCount) of the head's serving container."""
    out = docker_on(node, "inspect", "-f", "{{.State.StartedAt}} {{.RestartCount}}",
                    "dgx-spark-vllm")  # fmt: skip
    at, count = out.split()
    return at, int(count)


def url(nodes) -> str:
    return f"http://{nodes[0].mgmt_ip}:{SERVE.get('vllm_serve_port', 8000)}"


class Load(threading.Thread):
    """One client asking for long completions back to back until halted."""

    def __init__(self, base: str, halt: threading.Event):
        super().__init__(daemon=True)
        self.client = drills.endpoint(base, KEY, timeout=300)
        self.halt = halt
        self.done = 0

    def run(self) -> None:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        while not self.halt.is_set():
            status, _ = self.client.request("/v1/completions", body)
            self.done += status == 200


@pytest.fixture(scope="module")
def queued_pair(deployed_pair, nodes):
    """The group with two sequence slots, the role's watchdog paused and this module's running;
    afterwards the role's watchdog and the inventory's settings are back."""
    run = run_playbook("deploy.yml", "-e", json.dumps({"vllm_serve_max_num_seqs": 2}))
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    head = nodes[0]
    image = docker_on(head, "inspect", "-f", "{{.Config.Image}}", WATCHDOG)
    args = json.loads(docker_on(head, "inspect", "-f", "{{json .Args}}", WATCHDOG))
    keep = [a for a in args if a.split("=", 1)[0] in ("--url", "--model", "--container", "--auth")]
    docker_on(head, "stop", WATCHDOG)
    docker_on(head, "rm", "-f", TEST_WATCHDOG, check=False)
    docker_on(head, "run", "-d", "--name", TEST_WATCHDOG, "--network", "host",
              "--volumes-from", WATCHDOG, "--entrypoint", "python3", image,
              "/etc/dgx-spark-watchdog/dgx_spark_watchdog.py", *keep,
              "--state=/tmp/state.json", f"--interval={INTERVAL}", f"--timeout={TIMEOUT}",
              f"--start-interval={INTERVAL}", f"--failures={FAILURES}",
              "--busy-limit=600")  # fmt: skip
    try:
        yield head
    finally:
        print("\n" + docker_on(head, "logs", TEST_WATCHDOG, check=False))
        docker_on(head, "rm", "-f", TEST_WATCHDOG, check=False)
        docker_on(head, "start", WATCHDOG, check=False)
        run = run_playbook("deploy.yml")
        assert run.rc == 0, run.failures() or run.raw[-3000:]


def metrics(nodes) -> dict:
    text, why = drills.endpoint(url(nodes), KEY, timeout=10).metrics()
    assert text, why
    return drills.module_util("vllm_metrics").summarize(text, MODEL)


def test_a_busy_pair_is_not_restarted(queued_pair, nodes):
    head = queued_pair
    before = started(head)
    halt = threading.Event()
    clients = [Load(url(nodes), halt) for _ in range(10)]
    for client in clients:
        client.start()
    try:
        time.sleep(10)
        seen = metrics(nodes)
        # The probe's own wait: one token behind the queue, timed like the watchdog's.
        probe = drills.endpoint(url(nodes), KEY, timeout=120).complete(MODEL, "ping")
        # Two probe rounds past the restart point, the busy verdict judged at each.
        time.sleep(FAILURES * (INTERVAL + 2 * TIMEOUT) * 6)
        later = metrics(nodes)
    finally:
        halt.set()
        for client in clients:
            client.join(timeout=120)
    log = docker_on(head, "logs", TEST_WATCHDOG)
    state = json.loads(docker_on(head, "exec", TEST_WATCHDOG, "cat", "/tmp/state.json"))
    print(f"\nmetrics under load: {seen}\nprobe under load: {probe.latency_ms} ms "
          f"({'answered' if probe.ok else probe.error})\nwatchdog: {state}")  # fmt: skip
    assert seen["running"] == 2 and seen["waiting"] > 0, seen
    assert probe.latency_ms > TIMEOUT * 1000, "no queue: the probe answered within its timeout"
    assert later["generation_tokens"] > seen["generation_tokens"], (seen, later)
    assert "is busy (" in log and ": not restarting dgx-spark-vllm" in log, log
    assert ": restarting dgx-spark-vllm" not in log, log
    assert started(head) == before, "the busy group was restarted"
    assert state["restarts"] == 0, state
    assert sum(c.done for c in clients) > 0


def test_a_frozen_rank_is_still_restarted(queued_pair, nodes):
    head, worker = nodes[0], nodes[1]
    client = drills.endpoint(url(nodes), KEY, timeout=30)
    deadline = time.monotonic() + 120
    while not client.complete(MODEL, "ping").ok:
        assert time.monotonic() < deadline, "the pair does not serve before the freeze"
        time.sleep(2)
    before = started(head)
    frozen_at = time.monotonic()
    drills.make_fault("rank-freeze", head, worker)
    # Today's time: FAILURES probes (each its timeout, /health's and /metrics' at most), the
    # intervals between them, the 30 s the restart gives the old container to stop.
    bound = FAILURES * (INTERVAL + 3 * TIMEOUT) + INTERVAL + 30 + 15
    while started(head) == before:
        assert time.monotonic() - frozen_at < bound, docker_on(head, "logs", TEST_WATCHDOG)
        time.sleep(1)
    restarted_after = time.monotonic() - frozen_at
    print(f"\nfrozen rank restarted after {restarted_after:.1f} s (bound {bound} s)")
    assert "did not answer" in docker_on(head, "logs", TEST_WATCHDOG)
    deadline = time.monotonic() + 600
    while not client.complete(MODEL, "ping").ok:
        assert time.monotonic() < deadline, "the pair did not serve again after the restart"
        time.sleep(2)
