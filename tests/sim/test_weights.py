"""Broken weights on the serving pair. A worker copy that lacks a shard, or whose shard changed,
is refused before any rank restarts, naming the node and the file. A shard broken so that the
check cannot see it (its size and modification time put back, as a hand edit after the check
would leave it) reaches vLLM: the serving stage then fails quoting the loader's error and puts
the previous group back."""

from __future__ import annotations

import contextlib
import shlex

import pytest
from conftest import on_node, run_playbook

MODEL_DIR = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
SHARD = "model-00002-of-00002.safetensors"
BACKUP = "/var/lib/dgx-spark/test-weights-backup"
STARTED = ["docker", "inspect", "-f", "{{.State.StartedAt}}"]


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
    """A serving run that would restart the group: a setting the ranks start with changes."""
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


@pytest.mark.drill
def test_a_shard_the_check_cannot_see_fails_the_start_and_rolls_back(deployed_pair):
    nodes = deployed_pair
    with worker_shard(nodes) as (worker, path):
        # The first bytes of a safetensors file give its header's length: an absurd one, with
        # the file's size and modification time as they were.
        sh(worker, f"printf '\\377\\377\\377\\377\\377\\377\\377\\177' | dd of={path} bs=1 "
                   f"conv=notrunc status=none && touch -r {BACKUP}/{SHARD} {path}")  # fmt: skip
        run = serve_with_a_change()
        message = " ".join(run.failures())
        print(f"\n{message}")
        assert run.rc != 0
        assert "did not serve" in message and "Rolled back" in message, message
        # The loader's own error, from the worker's rank, first.
        loader = f"the rank on {nodes[1].fast_ip}: safetensors._safetensors_rust.SafetensorError"
        assert f"{loader}: Error while deserializing header" in message, message
        # The previous group reads the same shard: it cannot serve either, and says what to do.
        assert "model_cache_verify=checksum" in message, message
        waits = {name: r.get("seconds") for name, _h, r in run.results() if "Wait until" in name}
        print(f"waits: {waits}, run {run.seconds:.0f}s")
    # The shard is whole again: the next full run brings the pair back to serving.
    again = run_playbook("deploy.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
