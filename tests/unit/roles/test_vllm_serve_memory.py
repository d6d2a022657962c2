"""roles/vllm_serve/tasks/memory.yml as preflight runs it, on two local "nodes" without Docker
or a GPU: each node reads a /proc/meminfo sample (tests/unit/fixtures/vllm_serve/), a stand-in
Docker API on a Unix socket says which rank containers run, and stand-in `docker` and
`nvidia-smi` commands answer `docker top` and the per-process GPU memory query."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from support.captures import tool_output
from support.docker_stand_in import docker_api

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "vllm_serve"
IDS = {"dgx-spark-vllm": "ab" * 32, "dgx-spark-ray": "cd" * 32}


def _containers(running) -> list[dict]:
    """The rank containers that run, as the shared stand-in Docker API serves them."""
    return [
        {"Id": IDS[name], "Names": [f"/{name}"], "State": "running", "Labels": {},
         "inspect": {"Id": IDS[name], "Name": f"/{name}", "State": {"Running": True}}}
        for name in running
    ]  # fmt: skip


def run(tmp_path: Path, samples: dict, running=(), **extra) -> dict:
    """Run memory.yml on spark-1 and spark-2 against the stand-in Docker API (the rank
    containers in ``running``, no serving image: as on a first run, vLLM's own figure is then
    measured at the serve stage); {rc, out, results: {task name: result}}."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "docker").write_text("#!/bin/sh\n[ \"$1\" = top ] && printf 'PID\\n4100\\n4242\\n'\n")
    # The stand-ins read the samples as the tools print them: without the provenance header.
    apps = tmp_path / "compute_apps.csv"
    apps.write_text(tool_output(FIXTURES / "nvidia_smi_compute_apps_llama.txt"))
    (stubs / "nvidia-smi").write_text(f"#!/bin/sh\ncat '{apps}'\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {}
    for name, sample in samples.items():
        meminfo = tmp_path / f"meminfo_{name}"
        meminfo.write_text(tool_output(FIXTURES / sample))
        hosts[name] = {**host, "_vllm_serve_meminfo_path": str(meminfo)}
    inventory = {
        "all": {
            "vars": {"spark_hardware": True, **extra},
            "children": {
                "sparks": {
                    "children": {
                        "spark_head": {"hosts": {"spark-1": hosts["spark-1"]}},
                        "spark_workers": {"hosts": {"spark-2": hosts["spark-2"]}},
                    }
                }
            },
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "name": "Check memory as preflight does",
            "hosts": "sparks",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the memory tasks of vllm_serve",
                    "ansible.builtin.include_role": {
                        "name": "dgx_spark.cluster.vllm_serve",
                        "tasks_from": "memory",
                    },
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "PATH": f"{stubs}:{BIN}:{os.environ.get('PATH', '')}",
    }
    command = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml")]
    with docker_api(_containers(running)) as docker_host:
        proc = subprocess.run(
            [*command, str(tmp_path / "play.yml")],
            cwd=ROOT, env={**env, "DOCKER_HOST": docker_host}, text=True, capture_output=True,
            check=False, timeout=300,
        )  # fmt: skip
    report = json.loads(proc.stdout)
    # Role tasks are named "<role> : <name>".
    tasks = report["plays"][0]["tasks"]
    results = {task["task"]["name"].split(" : ", 1)[-1]: task["hosts"] for task in tasks}
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "results": results}


MEMORY = "Refuse a start that a node's memory cannot hold"
CMA = "Refuse a Spark whose free CMA pageblocks lie outside every CMA area"


def test_a_running_group_is_not_refused_for_the_memory_it_holds(tmp_path):
    samples = {"spark-1": "meminfo_spark_idle.txt", "spark-2": "meminfo_spark_llama_loaded.txt"}
    got = run(tmp_path, samples, running=["dgx-spark-vllm"])
    assert got["rc"] == 0, got["out"]
    assert got["results"][CMA]["spark-1"]["msg"] == [
        "spark-1: CmaTotal 0 MiB, CmaFree 0 MiB",
        "spark-2: a kernel without CMA",
    ]
    spark2 = got["results"][MEMORY]["spark-1"]["msg"][1]
    assert spark2 == (
        "spark-2: memory holds the start: total 121.69 GiB, available 75.12 GiB + 37.65 GiB "
        "held by the running ranks (GPU processes 4242, freed by the restart), needed 93.18 GiB "
        "(gpu_memory_utilization 0.7 x total + vllm_serve_memory_margin_gib 8)"
    )


def test_memory_that_another_program_holds_refuses_the_pair(tmp_path):
    samples = {"spark-1": "meminfo_spark_idle.txt", "spark-2": "meminfo_spark_llama_loaded.txt"}
    got = run(tmp_path, samples)
    assert got["rc"] != 0
    result = got["results"][MEMORY]["spark-1"]
    assert result["failed"] is True
    assert result["msg"] == [
        "spark-2: memory cannot hold the start: total 121.69 GiB, available 75.12 GiB + 0.00 GiB "
        "held by the running ranks, needed 93.18 GiB (gpu_memory_utilization 0.7 x total + "
        "vllm_serve_memory_margin_gib 8). A start that does not fit hard-resets a GB10 host "
        "(NV_ERR_NO_MEMORY), so nothing was stopped. Stop what else holds memory on this node, "
        "or lower vllm_serve_gpu_memory_utilization (at most 0.55 fits now) or "
        "vllm_serve_memory_margin_gib"
    ]


def test_kho_scratch_is_refused_before_the_memory_is_looked_at(tmp_path):
    samples = {"spark-1": "meminfo_spark_idle.txt", "spark-2": "meminfo_spark_kho_1019.txt"}
    got = run(tmp_path, samples)
    assert got["rc"] != 0
    (message,) = got["results"][CMA]["spark-1"]["msg"]
    assert message.startswith("spark-2: CmaTotal 0 MiB, CmaFree 919 MiB: 919 MiB of free CMA")
    assert "kho=off" in message
    assert MEMORY not in got["results"]


def test_settings_out_of_range_are_refused_by_name(tmp_path):
    samples = {"spark-1": "meminfo_spark_idle.txt", "spark-2": "meminfo_spark_idle.txt"}
    got = run(tmp_path, samples, vllm_serve_memory_margin_gib=100)
    assert got["rc"] != 0
    result = got["results"]["Refuse memory check settings out of range"]["spark-1"]
    assert (
        result["msg"]
        == "vllm_serve_memory_margin_gib is 100; allowed: a number of GiB from 0 to 64"
    )


def test_the_simulated_pair_says_it_skipped(tmp_path):
    samples = {"spark-1": "meminfo_build_machine.txt", "spark-2": "meminfo_build_machine.txt"}
    got = run(tmp_path, samples, spark_hardware=False, vllm_serve_gpu_memory_utilization="")
    assert got["rc"] == 0, got["out"]
    said = got["results"]["Say that the memory and CMA checks run on Sparks only"]["spark-1"]
    assert said["msg"].startswith("hardware-only: skipped the memory check before the ranks start")
    assert got["results"][MEMORY]["spark-1"].get("skipped") is True


def _tasks(name: str) -> list[dict]:
    return yaml.safe_load((ROOT / "roles/vllm_serve/tasks" / name).read_text(encoding="utf-8"))


def _flat(tasks: list[dict]) -> list[dict]:
    out = []
    for task in tasks:
        out.append(task)
        out.extend(_flat(task.get("block") or []))
    return out


def test_vllms_figure_is_measured_before_anything_serving_stops():
    """In preflight where every node holds the serving image, else at the serve stage before
    the collective and the restart, on Sparks only and once per image; the probe's container
    takes the GPU request, as the ranks' do."""
    memory = {t["name"]: t for t in _flat(_tasks("memory.yml"))}
    included = memory["Measure vLLM's own memory figure where every node holds the serving image"]
    assert included["ansible.builtin.include_tasks"]["file"] == "vllm_memory.yml"
    assert "_vllm_serve_memory_alias.images[0].Id" in included["vars"]["_vllm_serve_memory_image"]
    run = _tasks("run.yml")
    names = [t["name"] for t in run]
    measure = names.index("Measure vLLM's own memory figure before anything serving is touched")
    assert measure < names.index(
        "Prove the ranks' collective in the serving image before anything serving is touched"
    )
    assert measure < names.index("Restart the serving group")
    assert "spark_hardware | default(false) | bool" in run[measure]["when"]
    assert (
        "_vllm_serve_vllm_memory_image | default('') != _vllm_serve_image_id"
        in run[measure]["when"]
    )
    probe = {t["name"]: t for t in _tasks("vllm_memory.yml")}[
        "Measure the memory vLLM will see, in the serving image with the GPU"
    ]["community.docker.docker_container"]
    assert probe["device_requests"] == "{{ spark_container_device_requests | default(omit) }}"
    assert probe["network_mode"] == "none" and probe["cleanup"] is True


def test_the_probe_says_plainly_where_no_cuda_device_answers():
    """files/memory_probe.py in this test's Python (no torch here): no device, no figure, the
    reason, and MemAvailable beside it; the decision leaves such a node unmeasured."""
    probe = ROOT / "roles/vllm_serve/files/memory_probe.py"
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, check=True)
    answer = json.loads(out.stdout)
    assert answer["source"] == "no CUDA device"
    assert answer["free"] is None and answer["total"] is None
    assert answer["mem_available"] > 0
    if answer["error"]:
        assert answer["error"].startswith("torch: ")
