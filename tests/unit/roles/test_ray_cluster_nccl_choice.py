"""ray_cluster's tasks/nccl_choice.yml after its reads: what it makes of the probe's answer (given
now or stamped), what it stamps, what it hands the module and what it prints.

The node-reading tasks (stat, the image's facts, the stamp, the probe container) need a
node with Docker; here their registered results are set to what they return on a Spark whose
image carries the pip wheel's NCCL 2.28.9 and whose node has DGX OS's, and the role's own later
tasks run as they are in the file, with the role's vars, on two local hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TASKS = yaml.safe_load((ROOT / "roles/ray_cluster/tasks/nccl_choice.yml").read_text())
PROBE_TASK = "Ask the serving image which libnccl its torch loads, and read the node's"
AFTER = [
    "Keep both libraries for the choice",
    "Decide which libnccl the ranks load",
    "Publish the choice for ray_cluster and vllm_serve",
    "Print both NCCL versions and the choice",
]
HOST_LIB = "/usr/lib/aarch64-linux-gnu/libnccl.so.2"
HOST_REAL = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
IMAGE_ID = "sha256:" + "1f" * 32
# The public reports' first eight hex digits of each 2.28.9 build's ID; the rest is made up.
PIP_ID = "a7f420a1" + "5e" * 16
DGX_ID = "c0db9360" + "17" * 16
FILE_STAT = {"exists": True, "size": 190_000_000, "mtime": 1767225600.25, "inode": 4242}
NODE_KEY = f"{HOST_REAL}:190000000:1767225600.25:4242"
ANSWER = {
    "version": "2.28.9",
    "library": {"path": WHEEL, "real_path": WHEEL, "size": 219_000_000, "build_id": PIP_ID,
                "sha256": None, "error": None, "how": "mapped by torch"},
    "files": [WHEEL],
    "node": {"path": "/opt/dgx-spark-nccl-node/libnccl.so.2",
             "real_path": "/opt/dgx-spark-nccl-node/libnccl.so.2", "size": 190_000_000,
             "build_id": DGX_ID, "sha256": None, "error": None},
}  # fmt: skip


def registered(stamped: dict | None, probed: dict | None) -> dict:
    """What the reading tasks register on a node: the probe ran now (``probed``) or was skipped
    for the answer of a stamp that holds (``stamped``)."""
    out = {
        "_ray_cluster_nccl_host": {
            "stat": {"exists": True, "islnk": True, "lnk_source": HOST_REAL}
        },
        "_ray_cluster_nccl_host_file": {"stat": FILE_STAT},
        "_ray_cluster_ldconfig": {"stdout_lines": []},
        "_ray_cluster_image_info": {"images": [{"Id": IMAGE_ID}]},
        "_ray_cluster_nccl_stamp": {
            "valid": stamped is not None,
            "stamp": {"result": stamped} if stamped is not None else None,
            "inputs": {"image_id": IMAGE_ID, "node_library": NODE_KEY},
        },
    }
    if probed is None:
        out["_ray_cluster_image_nccl"] = {"skipped": True, "changed": False}
    else:
        output = "torch warns here\ndgx-spark-nccl: " + json.dumps(probed) + "\n"
        out["_ray_cluster_image_nccl"] = {"status": 0, "container": {"Output": output}}
    return out


def run(tmp_path: Path, given: dict) -> dict:
    """The tasks after the reads, on spark-1 and spark-2; returns each task's results by name."""
    probe = next(t for t in TASKS if t["name"] == PROBE_TASK)
    spec = probe["community.docker.docker_container"]
    # How the probe task would be called now: its mount, its last argument and whether it runs.
    show = {
        "name": "Show the probe task's settings",
        "ansible.builtin.debug": {"msg": {
            "volumes": spec["volumes"],
            "node_argument": spec["entrypoint"][4],
            "runs": "{{ " + " and ".join(f"({c})" for c in probe["when"]) + " }}",
        }},
    }  # fmt: skip
    tasks = [
        {"name": "Set what the reads registered",
         "ansible.builtin.set_fact": {k: f"{{{{ given[inventory_hostname]['{k}'] }}}}"
                                      for k in next(iter(given.values()))}},
        show,
        *[t for t in TASKS if t.get("name") in AFTER],
        {"name": "Show the facts", "ansible.builtin.debug": {"msg": {
            "resolved": "{{ _spark_nccl_resolved | default('unset') }}",
            "to_keep": "{{ _ray_cluster_nccl_to_keep }}",
            "image_build": "{{ _ray_cluster_nccl_image_build }}",
            "host_build": "{{ _ray_cluster_nccl_host_build }}"}}},
    ]  # fmt: skip
    play = [{
        "name": "The NCCL choice's tasks on given answers",
        "hosts": "all",
        "gather_facts": False,
        "vars_files": [str(ROOT / "roles/ray_cluster/vars/main.yml")],
        "vars": {
            "given": given,
            "ray_cluster_nccl_library": "auto",
            "ray_cluster_nccl_host_library": HOST_LIB,
            "ray_cluster_image": "dgx-spark/vllm-serving:current",
            "ray_cluster_cache_dir": "/var/lib/dgx-spark/cache",
        },
        "tasks": tasks,
    }]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for name in given}}}))  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
         "-i", str(tmp_path / "hosts.yml")],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    return {
        task["task"]["name"]: task["hosts"] for play_ in report["plays"] for task in play_["tasks"]
    }


@pytest.fixture(scope="module")
def probed_now(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probed")
    return run(tmp, {n: registered(None, ANSWER) for n in ("spark-1", "spark-2")})


def test_a_fresh_answer_reaches_the_module_and_the_node_is_named_as_the_node_names_it(probed_now):
    facts = probed_now["Show the facts"]["spark-1"]["msg"]
    assert facts["resolved"] == "host"
    assert facts["image_build"]["build_id"] == PIP_ID
    assert facts["host_build"]["path"] == HOST_LIB and facts["host_build"]["real_path"] == HOST_REAL
    choice = probed_now["Decide which libnccl the ranks load"]["spark-1"]
    assert choice["library"] == "host"
    assert f"spark-2's 2.28.9 (190.0 MB, build c0db9360, {HOST_REAL}" in choice["message"]


def test_a_fresh_answer_is_stamped_with_the_image_and_the_nodes_file(probed_now):
    keep = probed_now["Show the facts"]["spark-2"]["msg"]["to_keep"]
    assert keep["inputs"] == {"image_id": IMAGE_ID, "node_library": NODE_KEY}
    assert keep["answer"] == ANSWER


def test_the_probe_would_mount_the_nodes_file_and_run_while_no_stamp_holds(probed_now):
    shown = probed_now["Show the probe task's settings"]["spark-1"]["msg"]
    assert shown["volumes"] == [f"{HOST_REAL}:/opt/dgx-spark-nccl-node/libnccl.so.2:ro"]
    assert shown["node_argument"] == "/opt/dgx-spark-nccl-node/libnccl.so.2"
    assert shown["runs"] is True


def test_the_print_names_both_builds(probed_now):
    msg = probed_now["Print both NCCL versions and the choice"]["spark-1"]["msg"]
    line = " ".join(msg.split())
    assert line.startswith(
        f"spark-1: NCCL on the node: 2.28.9 ({HOST_LIB}), 190.0 MB, build c0db9360; "
        f"in dgx-spark/vllm-serving:current: 2.28.9, torch loads {WHEEL} (mapped by torch), "
        "219.0 MB, build a7f420a1; the ranks load the node's."
    ), line


def test_a_stamp_that_holds_stands_for_the_probe(tmp_path):
    got = run(tmp_path, {n: registered(ANSWER, None) for n in ("spark-1", "spark-2")})
    assert got["Show the probe task's settings"]["spark-1"]["msg"]["runs"] is False
    facts = got["Show the facts"]["spark-1"]["msg"]
    assert facts["resolved"] == "host" and facts["to_keep"] == {}
    assert facts["image_build"]["build_id"] == PIP_ID


def test_the_simulated_pair_no_libnccl_anywhere(tmp_path):
    """A CPU image (torch has no NCCL, no wheel) and nodes without libnccl: nothing mounted, the
    image's kept, and the answer stamped."""
    cpu = {"version": "none in torch (AttributeError: a CPU build has no NCCL)", "library": None,
           "files": [], "node": None}  # fmt: skip
    given = registered(None, cpu)
    given["_ray_cluster_nccl_host"] = {"stat": {"exists": False}}
    given["_ray_cluster_nccl_host_file"] = {"stat": {"exists": False}}
    got = run(tmp_path, {n: given for n in ("spark-1", "spark-2")})
    shown = got["Show the probe task's settings"]["spark-1"]["msg"]
    assert shown["volumes"] == [] and shown["node_argument"] == ""
    facts = got["Show the facts"]["spark-2"]["msg"]
    assert facts["resolved"] == "image" and facts["host_build"] is None
    assert facts["to_keep"]["answer"] == cpu
    line = " ".join(got["Print both NCCL versions and the choice"]["spark-1"]["msg"].split())
    assert line.startswith(
        f"spark-1: NCCL on the node: none at {HOST_LIB}; in dgx-spark/vllm-serving:current: "
        "none in torch (AttributeError: a CPU build has no NCCL); the ranks load the image's."
    ), line


def test_before_the_image_is_built_auto_waits(tmp_path):
    given = registered(None, None)
    given["_ray_cluster_image_info"] = {"images": []}
    given["_ray_cluster_nccl_stamp"] = {"skipped": True}
    got = run(tmp_path, {n: given for n in ("spark-1", "spark-2")})
    assert got["Show the facts"]["spark-1"]["msg"]["resolved"] == "unset"
    assert got["Decide which libnccl the ranks load"]["spark-1"]["pending"] is True
    line = " ".join(got["Print both NCCL versions and the choice"]["spark-1"]["msg"].split())
    assert "in dgx-spark/vllm-serving:current: not on this node yet" in line
