"""The ranks' collective runs in the serving image before anything serving is touched.

vllm_serve's tasks/collective.yml runs a two-rank all_reduce (Gloo on the simulated pair) in
containers made with the Ray containers' settings whenever a node's stamp ``collective`` does
not hold for the serving image's ID and its comm settings (comm.env, the ranks' environment,
the NCCL library). It is stamped on each node, skipped while nothing changed (shown by
test_serving's key rotation, a serve run whose comm settings stay) and run again for a
changed comm setting; a failure stops the run while the running group keeps serving.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from conftest import node_image_id, on_node, run_playbook
from test_serving import KEY, complete

STAMP = "/var/lib/dgx-spark/stamps/collective.json"
ALIAS = "dgx-spark/vllm-serving:current"
DECIDED = "Say whether the collective runs"
STOPPED = "Stop before anything serving is touched when the collective failed or hung"
WRONG_SUM = Path(__file__).resolve().parent / "collective_wrong_sum"
WRONG_SUM_IMAGE = "dgxsim-collective/wrong-sum:latest"


def serve(*extra: str):
    """The serving stage alone, as an owner reruns it: with no preflight or ray stage in the
    run, it decides the NCCL the ranks load itself (read-only), as deploy.yml's would."""
    return run_playbook("playbooks/serve.yml", *extra)


def said(run, task: str) -> list[str]:
    return [str(r.get("msg", "")) for name, _h, r in run.results() if name == task]


def stamp(node) -> dict:
    got = on_node(node, "cat", STAMP, check=False)
    return json.loads(got.stdout) if got.returncode == 0 else {}


def container(node, name: str) -> dict:
    got = on_node(node, "docker", "inspect", name, check=False)
    return json.loads(got.stdout)[0] if got.returncode == 0 else {}


def sorted_nodes(nodes) -> list:
    return sorted(nodes, key=lambda n: n.name)


def checked(run) -> str:
    passes = said(run, STOPPED)
    assert passes, f"the collective did not run:\n{said(run, DECIDED)}"
    return passes[0]


@pytest.fixture(scope="module")
def first(deployed_pair, nodes):
    """The serving stage after the stamps were removed: the collective is due on every node. The
    settings stay the inventory's throughout, so no test here restarts the serving group."""
    for node in nodes:
        on_node(node, "rm", "-f", STAMP)
    run = serve()
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    return run


def test_the_first_run_ran_it_passed_and_stamped_it_on_every_node(first, nodes):
    stale = "; ".join(f"{n.name}: runs: no stamp" for n in sorted_nodes(nodes))
    assert said(first, DECIDED) == [f"Two-rank collective in {ALIAS}: runs ({stale})"]
    lines = checked(first).splitlines()
    # One line per rank, as the sim's Gloo run prints it (no NCCL without a GPU).
    assert [line.split(":", 1)[0] for line in lines] == [n.name for n in sorted_nodes(nodes)]
    for node, line in zip(sorted_nodes(nodes), lines, strict=True):
        got = re.fullmatch(
            rf"{node.name}: all_reduce over 2 ranks, backend gloo, transport gloo, "
            r"busbw ([0-9.]+) GB/s, ([0-9.]+) s",
            line,
        )
        assert got, line
        rec = stamp(node)
        assert rec["format"] == 1 and rec["name"] == "collective", rec
        assert rec["result"] == {
            "backend": "gloo", "op": "all_reduce", "transport": "gloo",
            "nccl_version": "", "nccl_library": "",
            "busbw_gbps": float(got[1]), "elapsed_s": float(got[2]),
        }, rec  # fmt: skip
        assert rec["inputs"]["image_id"] == node_image_id(node, ALIAS), rec
        assert sorted(rec["inputs"]) == [
            "comm_env", "image_id", "model_env", "nccl_host_library", "nccl_library", "rank_env",
        ], rec  # fmt: skip
        assert "NCCL_SOCKET_IFNAME=" in rec["inputs"]["comm_env"], rec
        # The pair's choice for spark_nccl_library auto (a CPU build's torch has no NCCL: the
        # image's), as deploy.yml's runs stamp it, so they find this stamp holds.
        assert rec["inputs"]["nccl_library"] == "image", rec
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec["passed_at"]), rec
    # And the rank's container is gone.
    assert not [n.name for n in nodes if container(n, "dgx-spark-collective")]


def test_a_failing_collective_stops_before_anything_serving_is_touched(first, nodes):
    serving = container(nodes[0], "dgx-spark-vllm")
    rays = {node.name: container(node, "dgx-spark-ray") for node in nodes}
    stamps = {node.name: stamp(node) for node in nodes}
    # A changed setting makes it due; the ranks meet at an address nobody answers (TEST-NET-1).
    run = serve(
        "-e",
        '{"spark_rank_env": {"DGX_SPARK_SIM_COLLECTIVE": "unreachable"}}',
        "-e",
        "vllm_serve_collective_master_addr=192.0.2.1",
        "-e",
        "vllm_serve_collective_timeout=10",
    )
    assert run.rc != 0, "the run went on past a failed collective"
    # The changed comm setting is what made it due again.
    assert (
        "runs: rank_env.DGX_SPARK_SIM_COLLECTIVE changed from (none) to unreachable"
        in said(run, DECIDED)[0]
    ), said(run, DECIDED)
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
        assert stamp(node) == stamps[node.name]
    # And the pair still serves: one token with the inventory's key, from the same container.
    assert complete(nodes, KEY)
    assert container(nodes[0], "dgx-spark-vllm")["Id"] == serving["Id"]


def build_context(folder: Path) -> bytes:
    """``folder`` as a tar archive, the build context ``docker build -`` reads on stdin (GNU
    format: the legacy builder takes a PAX archive, Python's default, for a Dockerfile)."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
    return packed.getvalue()


@pytest.mark.drill
def test_a_rank_that_sums_wrong_is_refused_naming_it(first, nodes):
    """The serving alias moved to an image whose rank 1 (the worker's) adds 1 to what its
    first all_reduce returned (collective_wrong_sum/: only the collective's own process is
    touched). The image's new ID makes the collective due; the worker's value check finds its
    sum wrong, the run stops naming that node, and nothing serving was touched. The alias is
    put back afterwards, so the pair is as it was."""
    serving = container(nodes[0], "dgx-spark-vllm")
    rays = {node.name: container(node, "dgx-spark-ray") for node in nodes}
    stamps = {node.name: stamp(node) for node in nodes}
    kept = {node.name: node_image_id(node, ALIAS) for node in nodes}
    context = build_context(WRONG_SUM)
    try:
        for node in nodes:
            on_node(node, "docker", "build", "-q", "-t", WRONG_SUM_IMAGE,
                    "--build-arg", f"BASE={ALIAS}", "-", data=context)  # fmt: skip
            on_node(node, "docker", "tag", WRONG_SUM_IMAGE, ALIAS)
        run = serve()
    finally:
        for node in nodes:
            on_node(node, "docker", "tag", kept[node.name], ALIAS)
            on_node(node, "docker", "rmi", WRONG_SUM_IMAGE, check=False)
    assert run.rc != 0, "the run went on past a rank that summed wrong"
    assert "runs (" in said(run, DECIDED)[0], said(run, DECIDED)
    failed = [f for f in run.failures() if "two-rank collective" in f]
    assert failed, run.failures()
    message = failed[0]
    print(f"\na rank that sums wrong:\n{message}")
    # The worker's rank (rank 1) is named with its wrong values; the head's rank passed.
    worker_line = next(line for line in message.splitlines() if line.startswith("spark-2:"))
    assert re.search(r"\d+ wrong values after the collective", worker_line), worker_line
    head_line = next(line for line in message.splitlines() if line.startswith("spark-1:"))
    assert "wrong values" not in head_line and "backend gloo" in head_line, head_line
    assert "Nothing serving was touched" in message, message
    after = container(nodes[0], "dgx-spark-vllm")
    assert (after["Id"], after["State"]["StartedAt"]) == (
        serving["Id"],
        serving["State"]["StartedAt"],
    )
    for node in nodes:
        ray = container(node, "dgx-spark-ray")
        assert (ray["Id"], ray["State"]["StartedAt"]) == (
            rays[node.name]["Id"],
            rays[node.name]["State"]["StartedAt"],
        )
        assert stamp(node) == stamps[node.name]
        assert node_image_id(node, ALIAS) == kept[node.name]
    assert complete(nodes, KEY)
