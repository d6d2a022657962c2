"""The ranks' collective runs in the serving image before anything serving is touched.

vllm_serve's tasks/collective.yml runs a two-rank all_reduce (Gloo on the simulated pair) in
containers made with the Ray containers' settings whenever a node has no record of a pass for
the serving image's ID and its comm settings. It is recorded on each node, skipped while
nothing changed, run again for a changed comm setting, and a failure stops the run while the
running group keeps serving.
"""

from __future__ import annotations

import json

import pytest
from conftest import on_node, run_playbook

RECORD = "/etc/dgx-spark/vllm/collective.json"
DECIDED = "Say whether the collective runs"
STOPPED = "Stop before anything serving is touched when the collective failed or hung"
# A comm setting of the ranks' own (spark_rank_env reaches every rank's environment).
CHANGED = '{"spark_rank_env": {"DGX_SPARK_SIM_COLLECTIVE": "changed"}}'


def serve(*extra: str):
    return run_playbook("deploy.yml", "--tags", "serve", *extra)


def said(run, task: str) -> list[str]:
    return [str(r.get("msg", "")) for name, _h, r in run.results() if name == task]


def record(node) -> dict:
    got = on_node(node, "cat", RECORD, check=False)
    return json.loads(got.stdout) if got.returncode == 0 else {}


def container(node, name: str) -> dict:
    got = on_node(node, "docker", "inspect", name, check=False)
    return json.loads(got.stdout)[0] if got.returncode == 0 else {}


def checked(run) -> str:
    passes = said(run, STOPPED)
    assert passes, f"the collective did not run:\n{said(run, DECIDED)}"
    return passes[0]


@pytest.fixture(scope="module")
def first(deployed_pair, nodes):
    """A serve run after the records were removed: the collective is due on every node."""
    for node in nodes:
        on_node(node, "rm", "-f", RECORD)
    run = serve()
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    yield run
    # Back to the inventory's settings (the collective passes again for them).
    again = serve()
    assert again.rc == 0, again.failures() or again.raw[-3000:]


def test_the_collective_ran_over_gloo_and_is_recorded(first, nodes):
    assert said(first, DECIDED)[0].startswith("Two-rank collective in"), said(first, DECIDED)
    assert "runs (" in said(first, DECIDED)[0]
    message = checked(first)
    for line in message.splitlines():
        assert "all_reduce over 2 ranks, backend gloo, transport gloo" in line, message
    print(f"\ncollective on the sim:\n{message}")
    for node in nodes:
        kept = record(node)
        assert kept["backend"] == "gloo" and kept["op"] == "all_reduce", kept
        # Each node built its own serving image: the record names that node's.
        image_id = container(node, "dgx-spark-ray")["Image"]
        assert kept["image_id"] == image_id, (node.name, kept, image_id)
        assert kept["elapsed_s"] > 0 and len(kept["digest"]) == 16, kept
    # The one-off containers are gone.
    for node in nodes:
        assert not container(node, "dgx-spark-collective")


def test_a_rerun_with_nothing_changed_does_not_run_it(first, nodes):
    before = [record(node) for node in nodes]
    run = serve()
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert "skipped (passed for this image and these comm settings" in said(run, DECIDED)[0]
    assert not [m for m in said(run, STOPPED) if m], said(run, STOPPED)
    assert [record(node) for node in nodes] == before


def test_a_changed_comm_setting_runs_it_again(first, nodes):
    before = {node.name: record(node)["digest"] for node in nodes}
    run = serve("-e", CHANGED)
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert "the comm settings changed since the last passed collective" in said(run, DECIDED)[0]
    assert "backend gloo" in checked(run)
    after = {node.name: record(node)["digest"] for node in nodes}
    assert all(after[n] != before[n] for n in before), (before, after)


def test_a_failing_collective_stops_before_anything_serving_is_touched(first, nodes):
    serving = container(nodes[0], "dgx-spark-vllm")
    rays = {node.name: container(node, "dgx-spark-ray") for node in nodes}
    records = {node.name: record(node) for node in nodes}
    # A changed setting makes it due; the ranks meet at an address nobody answers (TEST-NET-1).
    run = serve(
        "-e",
        '{"spark_rank_env": {"DGX_SPARK_SIM_COLLECTIVE": "unreachable"}}',
        "-e",
        "vllm_serve_collective_master_addr=192.0.2.1",
        "-e",
        "vllm_serve_collective_timeout=20",
    )
    assert run.rc != 0, "the run went on past a failed collective"
    failed = [f for f in run.failures() if "two-rank collective" in f]
    assert failed, run.failures()
    assert "Nothing serving was touched" in failed[0], failed[0]
    assert "backend gloo" in failed[0] and "Try:" in failed[0], failed[0]
    print(f"\na refused collective:\n{failed[0]}")
    # The serving and Ray containers are the same ones, started at the same time.
    after = container(nodes[0], "dgx-spark-vllm")
    assert (after["Id"], after["State"]["StartedAt"]) == (
        serving["Id"],
        serving["State"]["StartedAt"],
    )
    assert after["State"]["Running"]
    for node in nodes:
        ray = container(node, "dgx-spark-ray")
        assert (ray["Id"], ray["State"]["StartedAt"]) == (
            rays[node.name]["Id"],
            rays[node.name]["State"]["StartedAt"],
        )
        assert not container(node, "dgx-spark-collective")
        assert record(node) == records[node.name]
    # And the endpoint still answers: a serve run with the same settings as before proves it
    # without restarting anything (its probe asks the running pair for one token).
    check = serve("-e", CHANGED)
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    probes = [r for name, _h, r in check.results() if name == "Ask the running pair for one token"]
    assert probes and probes[0].get("healthy"), probes
    assert container(nodes[0], "dgx-spark-vllm")["Id"] == serving["Id"]
