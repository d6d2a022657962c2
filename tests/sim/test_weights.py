"""Broken weights on the serving pair. A worker copy that lacks a shard, or whose shard changed,
is refused before any rank restarts, naming the node and the file. A shard broken so that the
check cannot see it (its size and modification time put back, as a hand edit after the check
would leave it) reaches vLLM: the serving stage then fails quoting the loader's error and puts
the previous group back."""

from __future__ import annotations

import contextlib
import json
import shlex
import time

import pytest
from conftest import on_node, run_playbook
from test_serving import KEY, complete

MODEL_DIR = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
SHARD = "model-00002-of-00002.safetensors"
BACKUP = "/var/lib/dgx-spark/test-weights-backup"
STARTED = ["docker", "inspect", "-f", "{{.State.StartedAt}}"]
GENERATION = "dgx_spark.cluster.generation"
RANK_CONTAINERS = ("spark-1/dgx-spark-vllm", "spark-1/dgx-spark-ray", "spark-2/dgx-spark-ray")


def sh(node, script: str) -> str:
    return on_node(node, "sh", "-c", script).stdout.strip()


def started(nodes) -> dict[str, str]:
    """When each rank container started: the serving driver on the head, Ray everywhere."""
    head, worker = nodes
    return {
        "spark-1/vllm": on_node(head, *STARTED, "dgx-spark-vllm").stdout.strip(),
        "spark-1/ray": on_node(head, *STARTED, "dgx-spark-ray").stdout.strip(),
        "spark-2/ray": on_node(worker, *STARTED, "dgx-spark-ray").stdout.strip(),
    }


@contextlib.contextmanager
def worker_shard(nodes):
    """The worker's shard, kept aside and put back as it was (bytes and modification time)."""
    worker = nodes[1]
    path = shlex.quote(f"{MODEL_DIR}/{SHARD}")
    sh(worker, f"mkdir -p {BACKUP} && cp -p {path} {BACKUP}/")
    try:
        yield worker, path
    finally:
        sh(worker, f"cp -p {BACKUP}/{SHARD} {path} && rm -rf {BACKUP}")


def serve_with_a_change(*entry: str):
    """A serving run that would restart the group: a setting the ranks start with changes.
    ``entry``: the playbook and its options (one is needed)."""
    assert entry and entry[0].endswith(".yml"), entry
    return run_playbook(*entry, "-e", "vllm_serve_max_num_batched_tokens=4096")


# Each case through one of the serving stage's two entries: deploy.yml's serve tag, where the
# model stage's play ends at once, and the stage's playbook alone. The refusal on the worker
# must stop the head too, before it restarts anything.
@pytest.mark.parametrize(
    ("damage", "problem", "entry"),
    [
        ("rm -f {path}", f"missing (1): {SHARD}", ("deploy.yml", "--tags", "serve")),
        ("printf broken | dd of={path} bs=1 seek=4096 conv=notrunc status=none",
         f"SHA-256 differs (1): {SHARD}", ("playbooks/serve.yml",)),
    ],
    ids=["missing", "changed"],
)  # fmt: skip
def test_a_broken_worker_copy_is_refused_before_any_rank_restarts(
    deployed_pair, damage, problem, entry
):
    nodes = deployed_pair
    before = started(nodes)
    with worker_shard(nodes) as (worker, path):
        sh(worker, damage.format(path=path))
        run = serve_with_a_change(*entry)
        assert run.rc != 0
        message = " ".join(run.failures())
        print(f"\n{message}")
        assert f"spark-2: the model in {MODEL_DIR} differs from the head's (spark-1)" in message
        assert problem in message, message
        assert "No rank was restarted" in message
        assert set(run.changed().values()) == {0}, run.changed_tasks()
        assert started(nodes) == before


def state(nodes) -> dict[str, dict]:
    """Every container of each node by name: ID, image ID, generation label, running."""
    out = {}
    for node in nodes:
        names = on_node(node, "docker", "ps", "--all", "--format", "{{.Names}}").stdout.split()
        for name in names:
            got = json.loads(on_node(node, "docker", "inspect", name).stdout)[0]
            out[f"{node.name}/{name}"] = {
                "id": got["Id"],
                "image": got["Image"],
                "generation": (got["Config"]["Labels"] or {}).get(GENERATION),
                "running": got["State"]["Running"],
            }
    return out


def answers_within(nodes, seconds: float) -> float | None:
    """Seconds until the endpoint answers the inventory's key, None if it does not in time."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if complete(nodes, KEY, timeout=10):
            return time.monotonic() - start
        time.sleep(5)
    return None


@pytest.mark.drill
def test_a_shard_the_check_cannot_see_fails_the_start_and_rolls_back(deployed_pair):
    nodes = deployed_pair
    before = state(nodes)
    driver = before["spark-1/dgx-spark-vllm"]
    assert driver["running"] and driver["generation"], driver
    with worker_shard(nodes) as (worker, path):
        # The first bytes of a safetensors file give its header's length: an absurd one, with
        # the file's size and modification time as they were.
        sh(worker, f"printf '\\377\\377\\377\\377\\377\\377\\377\\177' | dd of={path} bs=1 "
                   f"conv=notrunc status=none && touch -r {BACKUP}/{SHARD} {path}")  # fmt: skip
        # The serving stage as the drill was written for (without an entry the call named
        # no playbook: ansible-playbook -e -i ...).
        run = serve_with_a_change("deploy.yml", "--tags", "serve")
        message = " ".join(run.failures())
        print(f"\n{message}")
        assert run.rc != 0
        assert "did not serve" in message and "Rolled back" in message, message
        # The loader's own error, from the worker's rank, first.
        loader = f"the rank on {nodes[1].fast_ip}: safetensors._safetensors_rust.SafetensorError"
        assert f"{loader}: Error while deserializing header" in message, message
        # The previous group reads the same shard: it cannot serve either, and says what to do.
        assert "were started again but do not answer yet" in message, message
        assert "model_cache_verify=checksum" in message, message
        waits = {name: r.get("seconds") for name, _h, r in run.results() if "Wait until" in name}
        print(f"waits: {waits}, run {run.seconds:.0f}s")
        # Rolled back, not left down: the same containers by name (the failed driver is gone,
        # the kept one has its name back), the rank containers the same by ID and image, the
        # driver with its previous configuration (generation); no image moved, so the Ray
        # containers ran on. (The watchdog may be made again for the rolled-back group.)
        after = state(nodes)
        assert set(after) == set(before), sorted(set(after) ^ set(before))
        for name in RANK_CONTAINERS:
            kept = {k: before[name][k] for k in ("id", "image", "generation")}
            assert {k: after[name][k] for k in kept} == kept, name
        assert (
            after["spark-1/dgx-spark-ray"]["running"] and after["spark-2/dgx-spark-ray"]["running"]
        )
    # The shard is whole again: the rolled-back driver serves the inventory's key by itself
    # (Docker's unless-stopped restarts a driver whose load failed), no Ansible run between.
    took = answers_within(nodes, 300)
    assert took is not None, "the rolled-back group did not serve once the shard was whole"
    assert state(nodes)["spark-1/dgx-spark-vllm"]["id"] == driver["id"]
    print(f"the rolled-back group served {took:.0f}s after the shard was put back")
    # And the next full run finds the pair serving.
    again = run_playbook("deploy.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
