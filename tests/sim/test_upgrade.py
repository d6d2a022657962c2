"""Upgrading vLLM on the running pair: a new base under the same tag (as an owner's rebuild of
vllm-node with a newer vLLM gives; the sim's base is served as it is, as a Spark's likely is),
`playbooks/images.yml`, then `deploy.yml`. The images stage touches nothing that serves; the
rerun sees the new image and moves every rank (the Ray containers and the driver) to it
together; a new image that does not serve is rolled back as a whole.

The module starts from the pair converged with the inventory under the key test_serving rotated
to (conftest's converge: deploy.yml, a no-op or a repair of what an earlier module left). Every
run here gives that key: after test_serving's rotation the first run is then a no-op, instead
of one more restart of the group for the inventory's key; alone, the module's first deploy.yml
rotates to it. Afterwards the base tag names the inventory's base again, but the pair keeps
serving the test's base: the next deploy.yml moves it back (a converge, whose images stage
points the alias at the inventory's base again, and a restart).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from conftest import (
    CONVERGE,
    ROOT,
    converge,
    load_changed_image,
    node_image_id,
    on_node,
    run_playbook,
)
from test_rerun import ran
from test_serving import ROTATED, Client, complete, vllm_start_seconds

CLUSTER = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/cluster.yml").read_text())
BASE = CLUSTER["hybrid_image_base"]
HELD = "dgxsim-test/inventory-base:held"
ALIAS = "dgx-spark/vllm-serving:current"
PREVIOUS = "dgx-spark/vllm-serving:previous"
RANKS = ("dgx-spark-ray", "dgx-spark-vllm")
# Every run of this module serves under test_serving's rotated key (see above).
KEY = ROTATED
UNDER_KEY = ("-e", f"vllm_serve_api_key={KEY}")
# The upgrade keeps one build, so the build the ranks left must go within the upgrade's run.
KEEP_ONE = ("-e", "hybrid_image_keep_builds=1", *UNDER_KEY)
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


def test_an_image_rebuild_reaches_every_rank(upgrade, nodes):
    before = {n.name: containers(n) for n in nodes}
    assert "dgx-spark-vllm" in before["spark-1"] and "dgx-spark-ray" in before["spark-2"], before
    alias_before = {n.name: node_image_id(n, ALIAS) for n in nodes}
    new_base = load_changed_image(nodes, BASE, BASE, {"dgxsim.test.base": "upgrade"})

    # 1. The images stage points the alias at the new base, and nothing that serves notices.
    # The image the ranks run stays while they run it (they move at the serve stage).
    with Client(nodes, [KEY]) as client:
        time.sleep(2)
        images = run_playbook("playbooks/images.yml", *KEEP_ONE)
        time.sleep(2)
    assert images.rc == 0, images.failures() or images.raw[-3000:]
    assert client.failed == 0, client.failed
    assert {n.name: containers(n) for n in nodes} == before
    alias = {n.name: node_image_id(n, ALIAS) for n in nodes}
    assert all(alias[n] != alias_before[n] for n in alias), (alias, alias_before)
    assert all(node_image_id(n, alias_before[n.name]) for n in nodes), alias_before

    # 2. What the rerun and the status see: ranks on the old image (the alias is the new base
    # itself, which the ranks do not run yet).
    check = run_playbook("playbooks/noop.yml", *KEEP_ONE)
    said = check.noop_report()
    assert said.startswith(CONVERGE), said
    assert alias["spark-1"] == new_base, said
    for node in nodes:
        for name in before[node.name]:
            assert (
                f"{node.name}: {ALIAS} is {short(alias[node.name])} but {name} runs "
                f"{short(before[node.name][name]['image'])}" in said
            ), said
    status = run_playbook("playbooks/status.yml", *UNDER_KEY)
    assert status.rc != 0
    assert "the ranks are not on one image" in status.messages(), status.messages()

    # 3. deploy.yml moves every rank to the new image, in one restart of the group.
    with Client(nodes, [KEY]) as client:
        time.sleep(2)
        run = run_playbook("deploy.yml", *KEEP_ONE)
        time.sleep(3)
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    for node in nodes:
        now = containers(node)
        assert set(now) == set(before[node.name]), now
        assert {c["image"] for c in now.values()} == {alias[node.name]}, (node.name, now)
        # The base the ranks left is the owner's image: it stays, under the name they gave it.
        assert node_image_id(node, HELD) == alias_before[node.name], node.name
    assert "keeps" in run.messages() and "the serving stage" in run.messages()
    assert complete(nodes, KEY)
    # A converge: every stage ran, and only the ranks moved (host_prep changed nothing).
    said, tasks = run.noop_report(), ran(run)
    assert said.startswith(CONVERGE), said
    assert "Gather the network facts the links are checked against" in tasks, sorted(tasks)
    assert not [t for t in run.changed_tasks() if "host_prep" in t], run.changed_tasks()
    start = vllm_start_seconds(run)
    gap = client.longest_gap()
    again = run_playbook("deploy.yml", *KEEP_ONE)
    assert again.rc == 0, again.failures() or again.raw[-3000:]
    assert set(again.changed().values()) == {0}, again.changed_tasks()
    print(
        f"\nupgrade: images.yml {images.seconds:.0f}s with 0 failed requests; deploy.yml "
        f"{run.seconds:.0f}s, downtime {gap:.0f}s (vLLM start {start:.0f}s, "
        f"{client.failed} failed requests); rerun {again.seconds:.1f}s"
    )
    assert gap <= start + 30, (gap, start)


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


def test_a_deploy_that_builds_another_image_judges_nccl_on_it(upgrade, nodes):
    """Back to the inventory's base, up to the ray stage (deploy.yml --tags images,ray): its
    preflight judges the NCCL of the image serving now; its images stage then moves the alias;
    the ray stage makes the choice again on the image the ranks are to run and keeps that
    image's answer. (Judged only at preflight, the next run had no answer for the new image and
    probed again: molecule's idempotence failed so on a pair that held an older serving image.)
    The ranks keep their image until a serve stage moves them (the module's docstring)."""
    for node in nodes:
        on_node(node, "docker", "tag", upgrade[node.name], BASE)
        on_node(node, "rm", "-f", NCCL_STAMP)
    serving = {n.name: node_image_id(n, ALIAS) for n in nodes}
    run = run_playbook("deploy.yml", "--tags", "images,ray", *UNDER_KEY)
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    for node in nodes:
        alias = node_image_id(node, ALIAS)
        assert alias and alias != serving[node.name], (node.name, alias)
        assert {c["image"] for c in containers(node).values()} == {serving[node.name]}, node.name
        kept = on_node(node, "cat", NCCL_STAMP, check=False)
        assert kept.returncode == 0, (node.name, kept.stderr)
        stamp = json.loads(kept.stdout)
        assert stamp["inputs"]["image_id"] == alias and stamp["result"], (node.name, stamp)
    assert complete(nodes, KEY)
