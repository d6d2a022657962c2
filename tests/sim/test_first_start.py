"""A first start on the pair: judged by its progress, not by a clock, and refused before
anything stops when the model itself cannot take the settings. A start that fails is
rolled back, and the run says which way it ended: the previous group serves again, was
started again but does not answer yet, or nothing served before to roll back to.

Slowing the start needs the sim's donor image with ``dgxsim_ray_cpu/slow_load.py`` (a vLLM
general plugin that sleeps before each checkpoint shard, ``VLLM_DGXSIM_SECONDS_PER_SHARD``,
or stops at one, ``VLLM_DGXSIM_STALL_AT_SHARD``): rebuild the donor image first. The tiny
model has two shards.

Needs the deployed pair. The module ends with the inventory's own settings deployed again.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import on_node, run_playbook
from test_serving import (
    KEY,
    ROLLBACK_WAIT_TASK,
    SERVE,
    WAIT_TASK,
    complete,
    serve,
)


@pytest.fixture(scope="module")
def restored(serving_pair, nodes):
    """The pair serving with the inventory's key before the module, and its settings deployed
    again after it (seconds when a refusal changed nothing; a restart after the drills)."""
    yield
    run = run_playbook("deploy.yml")
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert complete(nodes, KEY)


# The module starts from the pair serving the inventory's settings, and deploy.yml restores
# them after it. The slowed start comes last: the group it leaves serving is a slow one, and a
# rollback to it would take minutes.
pytestmark = pytest.mark.usefixtures("restored")

STALL = 60  # the smallest stall time the role accepts
# Each of the tiny model's two shards takes 45 s: a start longer than the stall time.
SLOW_START = {
    "vllm_serve_env": {"VLLM_DGXSIM_SECONDS_PER_SHARD": "45"},
    "vllm_serve_start_stall_timeout": STALL,
    "vllm_serve_health_timeout": 900,
}
INSPECT = ["docker", "inspect", "-f", "{{.State.StartedAt}}", "dgx-spark-vllm"]


def _wait(run, task=WAIT_TASK) -> dict:
    waits = [r for name, host, r in run.results() if name == task and host == "spark-1"]
    assert waits and "seconds" in waits[-1], "the run restarted nothing"
    return waits[-1]


def _started(nodes) -> str:
    return on_node(nodes[0], *INSPECT).stdout.strip()


@pytest.mark.drill
def test_a_stalled_start_is_judged_within_the_stall_time_naming_its_phase(nodes):
    # The change also brings a new key, which the rolled-back group never serves with.
    extra = {"vllm_serve_env": {"VLLM_DGXSIM_STALL_AT_SHARD": "2"},
             "vllm_serve_api_key": "never-served-key-0456",
             "vllm_serve_start_stall_timeout": STALL, "vllm_serve_health_timeout": 900}  # fmt: skip
    run = serve("-e", json.dumps(extra))
    assert run.rc != 0
    wait = _wait(run)
    assert not wait["healthy"] and wait["stalled"] is True and wait["phase"] == "weights"
    assert "the start stalled while loading weights" in wait["reason"], wait["reason"]
    # The shard bar shows what it last drew: tqdm may not redraw 1/2 before the stall.
    assert re.search(r"[01]/2 shards", wait["reason"]), wait["reason"]
    # judged one stall time after the last shard, give or take a poll and the load before it
    assert STALL <= wait["seconds"] < 2 * STALL + 30, wait["seconds"]
    message = " ".join(run.failures())
    assert "vllm_serve_start_stall_timeout is 60 s" in message, message
    assert _wait(run, ROLLBACK_WAIT_TASK)["healthy"]
    print(f"\nstalled start: judged after {wait['seconds']:.0f}s: {wait['reason']}")
    assert complete(nodes, KEY)
    # The watchdog asks the rolled-back group with that group's key: over three of the sim's
    # probe intervals it sees it serve and restarts nothing.
    started = _started(nodes)
    time.sleep(3 * SERVE["vllm_serve_watchdog_interval"] + 10)
    assert _started(nodes) == started
    state = json.loads(on_node(nodes[0], "cat", "/var/lib/dgx-spark/watchdog/state.json").stdout)
    assert state["state"] == "serving" and state["misses"] == 0, state


def test_a_max_model_len_beyond_the_models_is_refused_before_anything_stops(nodes):
    started = _started(nodes)
    run = serve("-e", "vllm_serve_max_model_len=100000")
    assert run.rc != 0
    message = " ".join(run.failures())
    assert "vllm_serve_max_model_len (--max-model-len)" in message, message
    assert "User-specified max_model_len (100000) is greater than the derived" in message, message
    assert "no container was touched" in message, message
    assert run.changed()["spark-1"] == run.changed()["spark-2"] == 0, run.changed_tasks()
    ran = {name for name, _h, r in run.results() if not r.get("skipped")}
    assert "Stop the running ranks" not in ran and "Pause the watchdogs" not in ran
    assert _started(nodes) == started
    assert complete(nodes, KEY)


@pytest.mark.drill
def test_a_slow_start_that_keeps_progressing_serves(nodes):
    """Each shard takes 45 s: the start lasts longer than the stall time (the old rule would
    have ended it at the deadline), but every step comes within it, so it serves."""
    run = serve("-e", json.dumps(SLOW_START))
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    wait = _wait(run)
    assert wait["healthy"] and wait["phase"] == "serving"
    assert wait["seconds"] > STALL + 30, wait["seconds"]
    progress = "\n".join(wait["progress"])
    assert "loading weights" in progress and "1/2 shards" in progress, progress
    assert wait["progress"][-1].endswith(": serving"), progress
    print(f"\nslowed start: served after {wait['seconds']:.0f}s:\n{progress}")
    assert complete(nodes, KEY)


# A start that stops at the second shard, judged after one stall time at most.
FAILED_START = {
    "vllm_serve_env": {"VLLM_DGXSIM_STALL_AT_SHARD": "2"},
    "vllm_serve_start_stall_timeout": STALL,
    "vllm_serve_health_timeout": STALL,
}


@pytest.mark.drill
def test_a_rollback_to_a_group_that_does_not_answer_yet_says_so(nodes):
    """The group that serves before is a slow one (two shards of 45 s; in step already after
    the slowed start's test): rolled back, it cannot answer within one stall time. The run
    says the previous containers were started again but do not answer yet; they serve soon
    after."""
    slow = serve("-e", json.dumps(SLOW_START))
    assert slow.rc == 0, slow.failures() or slow.raw[-3000:]
    run = serve("-e", json.dumps(FAILED_START))
    assert run.rc != 0
    assert not _wait(run)["healthy"]
    back = _wait(run, ROLLBACK_WAIT_TASK)
    assert not back["healthy"], back
    message = " ".join(run.failures())
    assert "Rolled back: the previous containers were started again but do not answer yet" in (
        message
    ), message
    assert "model_cache_verify=checksum" in message, message
    deadline = time.monotonic() + 300
    while not complete(nodes, KEY):
        assert time.monotonic() < deadline, "the rolled-back group never served"
        time.sleep(5)
    print(f"\nrolled back, not answering yet: {back['reason']}")


@pytest.mark.drill
def test_a_failed_start_with_nothing_served_before_has_nothing_to_roll_back_to(nodes):
    """Nothing serves when the run starts (the head's serving container and its watchdog
    stopped by hand): a start that fails keeps no previous containers and says so. The
    module's end deploys the inventory's settings again."""
    for name in ("dgx-spark-watchdog", "dgx-spark-vllm"):
        on_node(nodes[0], "docker", "stop", name)
    run = serve("-e", json.dumps(FAILED_START))
    assert run.rc != 0
    assert not _wait(run)["healthy"]
    ran = {name for name, _h, r in run.results() if not r.get("skipped")}
    assert ROLLBACK_WAIT_TASK not in ran, "a rollback ran with nothing to roll back to"
    message = " ".join(run.failures())
    assert "Nothing served before this run, so there is nothing to roll back to" in message, message
    print(f"\nnothing to roll back to: {message[:300]}")
    said = [r.get("msg") for name, host, r in run.results()
            if name.startswith("Say what was stopped") and host == "spark-1"]  # fmt: skip
    assert said and "stopped: dgx-spark-vllm (stopped, kept for its logs)" in said[0][0], said
    assert "no rank left in dgx-spark-ray" in said[0][1], said
    assert "dgx_spark.cluster.logs" in said[0][2], said

    # The failed start stays stopped: neither Docker nor the watchdog starts it again.
    def state(node, name):
        shown = on_node(node, "docker", "inspect", "-f",
                        "{{.State.Running}} {{.RestartCount}} {{.State.StartedAt}}", name,
                        check=False)  # fmt: skip
        return shown.stdout.strip() if shown.returncode == 0 else "absent"

    after_run = state(nodes[0], "dgx-spark-vllm")
    assert after_run.startswith("false "), after_run
    time.sleep(90)
    assert state(nodes[0], "dgx-spark-vllm") == after_run
    assert not state(nodes[0], "dgx-spark-watchdog").startswith("true"), "the watchdog runs"
    for node in nodes:
        top = on_node(node, "docker", "top", "dgx-spark-ray", "-eo", "pid,args").stdout
        assert "ray::RayWorkerProc" not in top, (node.name, top)

    # The cause fixed (the inventory's settings), the next run serves.
    again = run_playbook("deploy.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
    assert complete(nodes, KEY)
    print(f"after the failed first start, deploy.yml served in {again.seconds:.0f}s")
