"""Upgrading vLLM on the running pair: a new base under the same tag (as an owner's rebuild of
vllm-node with a newer vLLM gives; the sim's base is served as it is, as a Spark's likely is),
`playbooks/images.yml`, then `deploy.yml`. A new image that does not serve is rolled back as a
whole (a drill). How a new serving image reaches the running pair (the images stage alone
touches nothing that serves, the rerun moves every rank together, NCCL is judged again on the
new image) is test_profiles' switch, whose second profile needs the hybrid image.

The module starts from the pair converged with the inventory under the key test_serving rotated
to (conftest's converge: deploy.yml, a no-op or a repair of what an earlier module left). Every
run here gives that key. Afterwards the base tag names the inventory's base again, but the pair
keeps serving the test's base: the next deploy.yml moves it back.
"""

from __future__ import annotations

import time

import pytest
import yaml
from conftest import (
    ROOT,
    converge,
    load_changed_image,
    node_image_id,
    on_node,
    run_playbook,
)
from test_serving import ROTATED, Client, complete

CLUSTER = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/cluster.yml").read_text())
BASE = CLUSTER["hybrid_image_base"]
HELD = "dgxsim-test/inventory-base:held"
ALIAS = "dgx-spark/vllm-serving:current"
PREVIOUS = "dgx-spark/vllm-serving:previous"
RANKS = ("dgx-spark-ray", "dgx-spark-vllm")
# Every run of this module serves under test_serving's rotated key (see above).
KEY = ROTATED
UNDER_KEY = ("-e", f"vllm_serve_api_key={KEY}")
# Where the ray stage keeps the serving image's NCCL answer, by image ID (spark_cache_dir/nccl).
NCCL_STAMP = "/var/lib/dgx-spark/stamps/nccl-answer.json"


def short(image_id: str) -> str:
    return image_id[:19]


def containers(node) -> dict[str, dict]:
    """The running rank-holding containers of a node: image, ID, start."""
    out = {}
    for name in RANKS:
        form = "{{.Image}} {{.Id}} {{.State.StartedAt}} {{.State.Running}}"
        got = on_node(node, "docker", "inspect", "--format", form, name, check=False)
        if got.returncode == 0:
            image, cid, started, running = got.stdout.split()
            if running == "true":
                out[name] = {"image": image, "id": cid, "started": started}
    return out


GENERATION = "dgx_spark.cluster.generation"


def all_containers(node) -> set[str]:
    """The names of every container on a node, running or not."""
    got = on_node(node, "docker", "ps", "--all", "--format", "{{.Names}}")
    return set(got.stdout.split())


def label(node, container: str, name: str) -> str:
    form = '{{index .Config.Labels "' + name + '"}}'
    got = on_node(node, "docker", "inspect", "--format", form, container, check=False)
    return got.stdout.strip() if got.returncode == 0 else ""


@pytest.fixture(scope="module")
def upgrade(sim, nodes):
    """The pair converged with the inventory under the rotated key (deploy.yml repaired whatever
    an earlier module left, such as test_monitoring's containers), and the
    inventory's base tagged again afterwards; the test's bases go once nothing runs them. While
    the test's bases hold the tag, the inventory's keeps a name of its own, as an owner keeps
    the image they built."""
    converge("test_upgrade", nodes, *UNDER_KEY, key=KEY)
    base = {n.name: node_image_id(n, BASE) for n in nodes}
    for node in nodes:
        on_node(node, "docker", "tag", base[node.name], HELD)
    yield base
    for node in nodes:
        on_node(node, "docker", "tag", base[node.name], BASE)
        on_node(node, "docker", "image", "rm", HELD)
        on_node(node, "docker", "image", "prune", "--force", "--filter", "label=dgxsim.test.base")


@pytest.mark.drill
def test_a_new_image_that_does_not_serve_is_rolled_back_as_a_whole(upgrade, nodes):
    serving = {n.name: node_image_id(n, ALIAS) for n in nodes}
    names = {n.name: all_containers(n) for n in nodes}
    ranks = {n.name: set(containers(n)) for n in nodes}
    generation = label(nodes[0], "dgx-spark-vllm", GENERATION)
    assert generation, "the driver carries no generation label"
    # The base's vLLM imports, parses the command line and lists its models; only its
    # engine fails to start: it loads no platform plugin (VLLM_PLUGINS names none it has), so
    # the CPU platform it falls back to has no Ray resource for the ranks.
    load_changed_image(nodes, BASE, BASE, {"dgxsim.test.base": "no-engine"},
                       ["VLLM_PLUGINS=dgxsim-test-no-such-plugin"])  # fmt: skip
    images = run_playbook("playbooks/images.yml", *UNDER_KEY)
    assert images.rc == 0, images.failures() or images.raw[-3000:]
    broken = {n.name: node_image_id(n, ALIAS) for n in nodes}
    assert all(broken[n] != serving[n] for n in broken)

    with Client(nodes, [KEY]) as client:
        time.sleep(2)
        run = run_playbook("deploy.yml", *UNDER_KEY)
        time.sleep(3)
    assert run.rc != 0
    message = "\n".join(run.failures())
    assert f"did not serve on {ALIAS} ({short(broken['spark-1'])})" in message, message
    # The engine's own refusal (vllm/v1/executor/ray_utils.py in the base's vLLM 0.32.0):
    # without the sim's platform plugin the CPU platform has no Ray device key.
    assert "ValueError: current platform cpu does not support ray" in message, message
    assert f"Rolled back: the previous containers serve again on {PREVIOUS}" in message, message
    # The state, not only the words: every rank-holding container runs the image that served
    # before (the alias still names the one that failed), the same containers by name and no
    # other (the failed ones are gone, the kept one has its name back), and the driver is the
    # previous configuration (its generation), answering the module's key.
    for node in nodes:
        now = containers(node)
        assert set(now) == ranks[node.name], (node.name, now)
        assert {c["image"] for c in now.values()} == {serving[node.name]}, (node.name, now)
        assert node_image_id(node, PREVIOUS) == serving[node.name]
        assert node_image_id(node, ALIAS) == broken[node.name]
        assert all_containers(node) == names[node.name], node.name
    assert label(nodes[0], "dgx-spark-vllm", GENERATION) == generation
    assert complete(nodes, KEY)
    print(
        f"\nrollback: deploy.yml {run.seconds:.0f}s, downtime {client.longest_gap():.0f}s, "
        f"{client.failed} failed requests"
    )
