"""playbooks/soak.yml on the simulated pair: a minute under load passes and prints tokens/s per
minute and the longest stall; a rank frozen mid-soak fails it, naming the stall.

The drill freezes the worker's rank as benchmarks/drills.py's rank-freeze does (SIGSTOP of
its RayWorkerProc actor; with the multinode backend every process of its serving container)
while the soak's streams are running, and lets the processes go on (SIGCONT) afterwards. The
head's watchdog would not restart the group in time: the frozen engine keeps reporting the
soak's requests as running, which it believes busy for vllm_serve_watchdog_busy_limit.

Needs the pair serving (make demo); leaves it serving.
"""

from __future__ import annotations

import calendar
import threading
import time

import pytest
from conftest import drills, run_playbook

SERVE = drills.SERVE
MODEL = drills.SERVED_MODEL
KEY = SERVE["vllm_serve_api_key"]
# The drill's limit: well under the watchdog's three probes 10 s apart on the sim.
STALL_S = 10


def _url(head) -> str:
    return f"http://{head.mgmt_ip}:{SERVE.get('vllm_serve_port', 8000)}"


def _serves(head) -> bool:
    return drills.endpoint(_url(head), KEY, timeout=30).complete(MODEL, "spark").ok


def _result(run, task: str) -> dict:
    (found,) = [r for name, _host, r in run.results() if name == task]
    return found


# A drill for its time alone: the shortest soak is a minute of load on the CPU vLLM. The
# verdict and the figures it prints are unit-tested (soak.judge, and the module against a
# local endpoint that streams and one that freezes).
@pytest.mark.drill
def test_a_minute_under_load_passes_with_its_figures(serving_pair):
    run = run_playbook("playbooks/soak.yml", "-e", "soak_minutes=1", timeout=600)
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    assert KEY not in run.raw, "the soak printed the API key"
    soak = _result(run, "Keep the endpoint under load")
    shown = _result(run, "Show tokens/s per minute and the longest stall")["msg"]
    print(f"\nsoak wall time: {run.seconds:.1f} s\n{shown}")
    assert soak["passed"], soak["msg"]
    assert soak["streams"] == 4 and soak["seconds"] == pytest.approx(60, abs=1)
    (minute,) = soak["minutes"]
    assert minute["tokens"] > 0 and minute["tokens_per_s"] > 0, soak["minutes"]
    assert soak["failed_requests"] == 0, soak["errors"]
    assert soak["requests"] >= 4, soak
    assert soak["longest_stall"]["seconds"] < 60 and not soak["longest_stall"]["ongoing"]
    # What the user reads: the minute's rate and the longest stall, then the verdict.
    assert f"minute    1: {minute['tokens_per_s']:>8.1f} tokens/s" in shown, shown
    assert f"longest stall: {soak['longest_stall']['seconds']:.1f} s from" in shown, shown
    assert "soak passed: 1 min 0 s under 4 streams" in shown, shown


def _rank_pids(worker) -> list[str]:
    """The worker rank's processes, chosen as drills.make_fault('rank-freeze') chooses them."""
    if drills.backend(worker) == "multinode":
        top = drills.on_node(worker, "docker", "top", "dgx-spark-vllm", "-eo", "pid")
        return top.split()[1:]
    return drills.on_node(worker, "pgrep", "-f", "ray::RayWorkerProc").split()[:1]


def _running(url: str) -> int:
    text, _why = drills.endpoint(url, KEY, timeout=10).metrics()
    if not text:
        return 0
    return drills.module_util("vllm_metrics").summarize(text, MODEL).get("running") or 0


@pytest.mark.drill
def test_a_rank_frozen_mid_soak_fails_it_naming_the_stall(serving_pair, nodes):
    head, worker = nodes[0], nodes[1]
    url = _url(head)
    done: dict = {}

    def soak() -> None:
        done["run"] = run_playbook(
            "playbooks/soak.yml", "-e", "soak_minutes=3", "-e", f"soak_stall_s={STALL_S}",
            timeout=600,
        )  # fmt: skip

    thread = threading.Thread(target=soak, daemon=True)
    thread.start()
    pids: list[str] = []
    try:
        # Mid-soak: its streams are running, and have been for a while.
        deadline = time.monotonic() + 120
        while _running(url) < 1:
            assert thread.is_alive(), done.get("run") and done["run"].raw[-3000:]
            assert time.monotonic() < deadline, "the soak's streams never ran"
            time.sleep(1)
        time.sleep(15)
        assert thread.is_alive(), "the soak ended before the freeze"
        pids = _rank_pids(worker)
        frozen_wall, frozen_at = time.time(), time.monotonic()
        drills.on_node(worker, "kill", "-STOP", *pids)
        thread.join(timeout=STALL_S + 120)
        assert not thread.is_alive(), "the soak did not stop at the stall"
        time_to_fail = time.monotonic() - frozen_at
    finally:
        if pids:
            drills.on_node(worker, "kill", "-CONT", *pids, check=False)
    run = done["run"]
    result = _result(run, "Keep the endpoint under load")
    failed = _result(run, "Fail on a stall")
    stall = result["longest_stall"]
    print(f"\nfrozen rank: the soak failed {time_to_fail:.1f} s after the freeze "
          f"(soak_stall_s {STALL_S}); stall {stall}\n{failed['msg']}")  # fmt: skip
    assert run.rc != 0
    assert failed.get("failed") and not result["passed"]
    assert failed["msg"].startswith("soak failed: stall of at least"), failed["msg"]
    assert (
        f"limit soak_stall_s {STALL_S} s; streams 1, 2, 3, 4 waiting on a request" in failed["msg"]
    ), failed["msg"]
    assert stall["ongoing"] and stall["streams"] == [1, 2, 3, 4]
    # The stall named began at the freeze (the last token before it), not earlier.
    began = calendar.timegm(time.strptime(stall["began"], "%Y-%m-%d %H:%M:%S UTC"))
    assert frozen_wall - 5 <= began <= frozen_wall + 2, (stall, frozen_wall)
    assert result["seconds"] < 3 * 60, "the soak ran on past the stall"
    assert time_to_fail <= STALL_S + 30, time_to_fail


@pytest.fixture(autouse=True)
def _serving_afterwards(nodes):
    """The pair serves after each test: thawed ranks catch up, else deploy.yml restarts it."""
    yield
    deadline = time.monotonic() + 180
    while not _serves(nodes[0]):
        if time.monotonic() > deadline:
            run = run_playbook("deploy.yml")
            assert run.rc == 0, run.failures() or run.raw[-3000:]
            assert _serves(nodes[0]), "the pair does not serve after deploy.yml"
            return
        time.sleep(5)
