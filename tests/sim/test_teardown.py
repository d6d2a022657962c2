"""playbooks/teardown.yml on the simulated pair: with -e teardown_remove_weights=true every
container the collection made (serving, watchdog, Ray, monitoring) and the weights leave both
nodes, while the images and the host preparation (comm.env) stay. The module takes the pair
as it serves with the inventory's key, and leaves it torn down: the module after it
(test_monitoring) starts with a whole run of deploy.yml, which places the weights again and
brings Ray and serving back, and requires the pair to answer after it; a module that needs
the pair serving and finds it torn down deploys it first (conftest's serving_pair)."""

from __future__ import annotations

import pytest
from conftest import playbook_report as playbook

MODEL_DIR = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
RECORD = "/var/lib/dgx-spark/models/.verified/tiny-qwen3-moe.json"
COMM_ENV = "/etc/dgx-spark/comm.env"
SERVING_ALIAS = "dgx-spark/vllm-serving:current"
CONTAINERS = ("dgx-spark-vllm", "dgx-spark-ray")
COMPONENT_LABEL = "dgx_spark.cluster.component"


def failures(report: dict) -> list[str]:
    return [
        f"{host}: {task['task']['name']}: {res.get('msg')}"
        for play in report["plays"]
        for task in play["tasks"]
        for host, res in task["hosts"].items()
        if res.get("failed") or res.get("unreachable")
    ]


def task_names(report: dict) -> set[str]:
    """The tasks that ran on some host (not only skipped)."""
    return {
        task["task"]["name"].split(" : ", 1)[-1]
        for play in report["plays"]
        for task in play["tasks"]
        if any(not res.get("skipped") for res in task["hosts"].values())
    }


def node_state(host) -> dict:
    """What the teardown may and may not remove, read on the node itself."""
    names = host.check_output("sudo docker ps -a --format '{{.Names}}'").split()
    labelled = host.check_output(
        f"sudo docker ps -a --filter label={COMPONENT_LABEL} --format '{{{{.Names}}}}'"
    ).split()
    images = host.check_output("sudo docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}'")
    return {
        "containers": sorted(n for n in names if n in CONTAINERS),
        # Every container the collection made: its label, or its name's prefix.
        "collection": sorted({n for n in names if n.startswith("dgx-spark-")} | set(labelled)),
        "images": sorted(images.splitlines()),
        "model": host.file(MODEL_DIR).exists,
        "record": host.file(RECORD).exists,
        "comm_env": host.check_output(f"sudo sha256sum {COMM_ENV}"),
    }


@pytest.fixture(scope="module")
def teardown(serving_pair, hosts):
    """The serving pair (deployed first when it does not answer), torn down with the weights."""
    before = {name: node_state(host) for name, host in hosts.items()}
    report = playbook("playbooks/teardown.yml", "-e", "teardown_remove_weights=true")
    after = {name: node_state(host) for name, host in hosts.items()}
    return before, report, after


def test_deployment_was_there(teardown):
    before, _report, _after = teardown
    for name, state in before.items():
        assert state["containers"], f"{name}: nothing was serving before the teardown"
        assert state["model"] and state["record"], f"{name}: no weights before the teardown"


def test_teardown_removes_the_weights_without_syncing_them(teardown):
    _before, report, after = teardown
    assert report["rc"] == 0, failures(report)
    for name, state in after.items():
        assert not state["model"], f"{name}: {MODEL_DIR} is still there"
        assert not state["record"], f"{name}: {RECORD} is still there"
    ran = task_names(report)
    assert "Remove the model from the node" in ran
    for fetching in (
        "Copy the local model directory to the head",
        "Push the model from the head to the worker over the fast link",
        "Describe and check the head's copy",
    ):
        assert fetching not in ran, f"the teardown ran '{fetching}'"


def test_teardown_removes_every_container_the_collection_made(teardown):
    before, _report, after = teardown
    # Before: the serving group's watchdog on the head, beside the ranks' containers.
    assert "dgx-spark-watchdog" in before["spark-1"]["collection"], before["spark-1"]
    for name, state in after.items():
        assert state["containers"] == [], f"{name}: {state['containers']} left"
        assert state["collection"] == [], f"{name}: {state['collection']} left"


def test_teardown_keeps_the_images_and_the_host_preparation(teardown):
    before, _report, after = teardown
    for name in before:
        assert after[name]["images"] == before[name]["images"], name
        assert any(line.startswith(SERVING_ALIAS) for line in after[name]["images"]), name
        assert after[name]["comm_env"] == before[name]["comm_env"], name
