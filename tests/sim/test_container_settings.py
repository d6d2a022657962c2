"""A container is what its settings say: a key taken out of a setting leaves the running
containers on a plain run, and a container whose settings did not change is not recreated.

A run with one more key in spark_rank_env (the ranks' environment, given to the Ray and the
serving containers) puts it in every rank's container; the next plain run (the inventory's
spark_rank_env) takes it out of every one of them, the pair serves, and the run after that is
a no-op. community.docker compares an environment, mounts, devices and labels as "more may be
present" unless told; spark_container_comparisons tells it to compare them strictly.

A file the Ray containers load (comm.env, written by host_prep) reaches them the same way: a
converge runs every stage, so the one that rewrites it recreates the Ray containers, and the
serve stage follows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import CONVERGE, NOOP, _answers, on_node

# Two whole deploys in each test (about four minutes): drills, run by `make test-drills`,
# not `make test`.
pytestmark = pytest.mark.drill


INVENTORY = Path(__file__).resolve().parents[2] / "inventories" / "sim"
KEY = "DGX_SPARK_TAKEN_AWAY"
RANK_CONTAINERS = ("dgx-spark-ray", "dgx-spark-vllm")


def containers(node) -> dict[str, dict]:
    """The node's rank containers: name -> {id, env (a dict)}."""
    names = on_node(node, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
    found = {}
    for name in [n for n in names if n in RANK_CONTAINERS]:
        attrs = json.loads(on_node(node, "docker", "inspect", name).stdout)[0]
        env = dict(item.split("=", 1) for item in attrs["Config"]["Env"])
        found[name] = {"id": attrs["Id"], "env": env, "running": attrs["State"]["Running"]}
    return found


def test_a_key_taken_from_spark_rank_env_leaves_every_rank_container(deployed_pair, playbook):
    nodes = deployed_pair
    inventory_env = yaml.safe_load((INVENTORY / "group_vars/all/cluster.yml").read_text())[
        "spark_rank_env"
    ]
    with_key = {"spark_rank_env": {**inventory_env, KEY: "1"}}
    added = playbook("deploy.yml", "-e", json.dumps(with_key))
    assert added.rc == 0, added.failures() or added.raw[-4000:]
    before = {node.name: containers(node) for node in nodes}
    for node in nodes:
        assert "dgx-spark-ray" in before[node.name], (node.name, sorted(before[node.name]))
        for name, seen in before[node.name].items():
            assert seen["env"].get(KEY) == "1", (node.name, name)
    assert "dgx-spark-vllm" in before[nodes[0].name]

    plain = playbook("deploy.yml")
    assert plain.rc == 0, plain.failures() or plain.raw[-4000:]
    print(f"\nwith {KEY}: {added.seconds:.0f}s; without: {plain.seconds:.0f}s")
    after = {node.name: containers(node) for node in nodes}
    for node in nodes:
        assert sorted(after[node.name]) == sorted(before[node.name]), node.name
        for name, seen in after[node.name].items():
            assert KEY not in seen["env"], (node.name, name, "still carries", KEY)
            assert seen["running"], (node.name, name)
            # The inventory's keys stay: only what the settings no longer give went.
            assert {k: seen["env"].get(k) for k in inventory_env} == inventory_env, (
                node.name,
                name,
            )
    assert _answers(nodes), "the pair does not serve after the key was taken away"

    again = playbook("deploy.yml")
    assert again.rc == 0, again.failures()
    assert again.noop_report().startswith(NOOP), again.noop_report()
    # Nothing was recreated by the run with nothing to do.
    assert {node.name: containers(node) for node in nodes} == after


def test_a_file_host_prep_rewrites_reaches_the_stages_it_is_handed_to(deployed_pair, playbook):
    """A setting only host_prep reads (host_prep_comm_env_extra) changes comm.env, which the
    Ray containers load: the run converges naming the setting, host_prep writes the file, the
    ray stage recreates the Ray containers with it and the serve stage follows them; every Ray
    container carries the variable and the pair serves. The inventory's run takes it out of
    every Ray container again, and the next run is a no-op."""
    nodes = deployed_pair
    extra = ["-e", json.dumps({"host_prep_comm_env_extra": {"NCCL_DEBUG": "WARN"}})]
    try:
        run = playbook("deploy.yml", *extra)
        assert run.rc == 0, run.failures() or run.raw[-3000:]
        said = run.noop_report()
        assert said.startswith(CONVERGE), said
        assert 'spark-2: host_prep_comm_env_extra: set to {"NCCL_DEBUG": "WARN"}' in said, said
        for node in nodes:
            assert containers(node)["dgx-spark-ray"]["env"].get("NCCL_DEBUG") == "WARN", node.name
        assert _answers(nodes), "the pair does not serve with the variable"
    finally:
        back = playbook("deploy.yml")
    assert back.rc == 0, back.failures() or back.raw[-3000:]
    for node in nodes:
        assert "NCCL_DEBUG" not in containers(node)["dgx-spark-ray"]["env"], node.name
    assert playbook("playbooks/noop.yml").noop_report().startswith(NOOP)
