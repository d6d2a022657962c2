"""plugins/module_utils/pair_status.py: the pair's report from real docker inspect output."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import pair_status, ray_status
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_report import build_report
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import build_info
from support.captures import load_json, tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"
SETTINGS = {
    "backend": "ray",
    "serving_name": "dgx-spark-vllm",
    "ray_name": "dgx-spark-ray",
    "image": "dgx-spark/vllm-serving:current",
    "served_model_name": "tiny-qwen3-moe",
    "url": "http://172.30.240.11:8000/v1",
    "expected_gpus": 2,
    "disk_paths": ["/var/lib/docker"],
    "checked_at": "2026-11-30T08:00:00.000000Z",
}


def _load(name):
    return load_json(FIXTURES / name)


@pytest.fixture
def answers():
    """Both nodes as the status tasks saw them on the healthy simulated pair (ray backend)."""
    return _load("status_answers_sim.json")


def _report(answers, endpoint=None, ray_text=None, settings=None):
    nodes = {
        name: None
        if node is None
        else pair_status.node_status(
            node["serving"],
            node["ray"],
            node["image"],
            node["facts"],
            SETTINGS["checked_at"],
            SETTINGS["disk_paths"],
        )  # fmt: skip
        for name, node in answers["nodes"].items()
    }
    ray = ray_status.parse(answers["ray_status"] if ray_text is None else ray_text)
    return pair_status.cluster_report(
        nodes, "spark-1", answers["endpoint"] if endpoint is None else endpoint, ray,
        {**SETTINGS, **(settings or {})},
    )  # fmt: skip


def test_healthy_pair_is_healthy(answers):
    report = _report(answers)
    assert report["problems"] == []
    assert report["healthy"]
    assert report["cluster"]["image_builds_match"]
    assert report["nodes"]["spark-1"]["serving"]["uptime_s"] > 0
    assert not report["nodes"]["spark-2"]["serving"]["exists"]  # ray backend: ranks in Ray
    for node in report["nodes"].values():
        assert node["ray"]["running"] and node["ray"]["restarts"] == 0
        assert node["memory"]["total_mb"] > 0
        assert node["disks"][0]["mount"]


def _multinode(answers, worker_state):
    """The pair on the multinode backend: the worker runs a serving container too."""
    multinode = copy.deepcopy(answers)
    serving = copy.deepcopy(multinode["nodes"]["spark-1"]["serving"])
    serving["State"].update(worker_state)
    serving["Image"] = multinode["nodes"]["spark-2"]["image"]["Id"]  # the worker's own build
    multinode["nodes"]["spark-2"]["serving"] = serving
    return multinode


def test_stopped_worker_serving_container_is_a_problem_on_multinode(answers):
    running = _multinode(answers, {})
    assert _report(running, settings={"backend": "multinode"})["healthy"]
    stopped = _multinode(answers, {"Running": False, "Status": "exited", "ExitCode": 137})
    report = _report(stopped, settings={"backend": "multinode"})
    assert not report["healthy"]
    assert "spark-2: serving container dgx-spark-vllm is exited" in report["problems"]
    assert "exited rc=137" in "\n".join(pair_status.render(report))


def test_worker_without_serving_container_is_fine_on_the_ray_backend(answers):
    assert answers["nodes"]["spark-2"]["serving"] is None
    assert _report(answers)["healthy"]
    report = _report(answers, settings={"backend": "multinode"})
    assert "spark-2: serving container dgx-spark-vllm is absent" in report["problems"]


def test_images_built_per_node_match_by_their_inputs(answers):
    # hybrid_image_mode each_node: every node built its own image from the same inputs.
    report = _report(answers)
    images = {n["image_id"] for n in report["nodes"].values()}
    assert len(images) == 2
    assert not report["cluster"]["image_ids_match"]
    assert report["cluster"]["image_builds_match"]
    assert report["cluster"]["image_build"].startswith("dgx-spark/vllm-serving:")


def test_image_of_other_inputs_and_unreachable_node(answers):
    other = copy.deepcopy(answers)
    other["nodes"]["spark-2"]["image"]["RepoTags"] = [
        "dgx-spark/vllm-serving:000000000000",
        "dgx-spark/vllm-serving:current",
    ]
    report = _report(other)
    assert any("differs across nodes" in p for p in report["problems"])
    assert not report["cluster"]["image_builds_match"]
    gone = copy.deepcopy(answers)
    gone["nodes"]["spark-2"] = None
    report = _report(gone)
    assert any(p.startswith("spark-2: no answer") for p in report["problems"])
    assert "UNREACHABLE" in "\n".join(pair_status.render(report))


def test_endpoint_down_and_ray_short_of_a_node(answers):
    down = {"health": {"ok": False, "status": None, "error": "Connection refused"},
            "models": [], "model": {}, "completion": {"ok": False}, "metrics": {}}  # fmt: skip
    report = _report(answers, endpoint=down)
    assert any("endpoint /health: Connection refused" in p for p in report["problems"])
    one_node = tool_output(FIXTURES / "ray_status_one_node.txt")
    report = _report(answers, ray_text=one_node)
    assert any(p.startswith("Ray: 1 of 2 nodes alive") for p in report["problems"])


def test_render_has_a_cluster_table_and_a_line_per_node(answers):
    lines = pair_status.render(_report(answers))
    text = "\n".join(lines)
    assert lines[0] == "cluster"
    assert "HEALTHY" in text and "same build inputs" in text
    node_lines = [line for line in lines if line.strip().startswith("spark-")]
    assert len(node_lines) == 2
    assert "running" in node_lines[0]


def _row(lines, name):
    (line,) = [line for line in lines if line.strip().startswith(name)]
    return line.strip()[len(name) :].strip()


def test_the_report_names_the_model_profile(answers):
    report = _report(answers, settings={**SETTINGS, "profile": "sim-tiny-qwen3"})
    assert report["cluster"]["profile"] == "sim-tiny-qwen3"
    assert _row(pair_status.render(report), "profile") == "sim-tiny-qwen3"
    assert _row(pair_status.render(_report(answers)), "profile") == "-"


def test_render_shows_aborted_and_errored_requests_apart(answers):
    # The captured answers predate the split: vllm_endpoint_info gave requests_finished only.
    assert _row(pair_status.render(_report(answers)), "requests since start") == (
        "4 finished, - aborted, - errored"
    )
    assert _row(pair_status.render(_report(answers)), "tokens since start") == (
        "prompt 27, generated 11"
    )
    endpoint = copy.deepcopy(answers["endpoint"])
    endpoint["metrics"].update(
        {"requests_finished": 41, "requests_aborted": 3, "requests_errored": 2}
    )
    lines = pair_status.render(_report(answers, endpoint=endpoint))
    assert _row(lines, "requests since start") == "41 finished, 3 aborted, 2 errored"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2026-11-30T07:59:00.123456789Z", 59), ("2026-11-30T06:00:00Z", 7200)],
)
def test_uptime_from_docker_times(value, seconds):
    inspect = {"State": {"Running": True, "Status": "running", "StartedAt": value}}
    assert pair_status.container_status(inspect, SETTINGS["checked_at"])["uptime_s"] == seconds


def test_mask_secrets_in_inspect_and_text():
    inspect = {
        "Config": {"Env": ["VLLM_API_KEY=sim-only-key", "VLLM_HOST_IP=172.30.241.11",
                           "RAY_AUTH_TOKEN_PATH=/etc/dgx-spark-ray/token"],
                   "Cmd": ["--api-key", "sim-only-key"]},
        "Labels": {"hf_token": "hf_abc"},
    }  # fmt: skip
    masked = pair_status.mask_secrets(inspect, ["sim-only-key"])
    assert masked["Config"]["Env"][0] == "VLLM_API_KEY=********"
    assert masked["Config"]["Env"][1] == "VLLM_HOST_IP=172.30.241.11"
    assert masked["Config"]["Env"][2] == "RAY_AUTH_TOKEN_PATH=/etc/dgx-spark-ray/token"
    assert masked["Config"]["Cmd"] == ["--api-key", "********"]
    assert masked["Labels"]["hf_token"] == "********"
    assert "sim-only-key" not in json.dumps(masked)
    assert (
        pair_status.mask_secrets("Bearer sim-only-key ok", ["sim-only-key"]) == "Bearer ******** ok"
    )


def test_merge_logs_orders_both_streams_by_time():
    stdout = "2026-11-30T06:00:01.5Z INFO b\n2026-11-30T06:00:03Z INFO d\n"
    stderr = "2026-11-30T06:00:01.123456789Z WARN a\n2026-11-30T06:00:02Z WARN c\n"
    merged = pair_status.merge_logs(stdout, stderr).splitlines()
    assert [line.split()[-1] for line in merged] == ["a", "b", "c", "d"]


def test_a_watchdog_that_gave_up_makes_the_pair_unhealthy(answers):
    gave_up = {"state": "gave-up", "reason": "3 restarts in 1800 s did not bring the endpoint back",
               "misses": 0, "restarts": 3}  # fmt: skip
    serving = {"state": "serving", "restarts": 0}
    report = _report(answers, settings={"watchdogs": {"spark-1": serving, "spark-2": gave_up}})
    assert report["problems"] == [
        "watchdog on spark-2 gave up: 3 restarts in 1800 s did not bring the endpoint back"
    ]
    assert any(
        "spark-1 serving, 0 restarts in its window; spark-2 gave-up, 3 restarts in its window: 3"
        in line
        for line in pair_status.render(report)
    )


def test_a_serving_watchdog_is_shown_and_fine(answers):
    # A node without a watchdog (a worker under the ray backend) has no state file.
    watchdogs = {"spark-1": {"state": "serving", "restarts": 0}, "spark-2": None}
    report = _report(answers, settings={"watchdogs": watchdogs})
    assert report["healthy"]
    assert report["cluster"]["watchdogs"] == {"spark-1": watchdogs["spark-1"]}
    shown = "spark-1 serving, 0 restarts in its window"
    assert any(line.strip().startswith("watchdog") and line.endswith(shown)
               for line in pair_status.render(report))  # fmt: skip


def test_no_watchdog_is_shown_as_a_dash(answers):
    report = _report(answers, settings={"watchdogs": {"spark-1": None, "spark-2": None}})
    assert report["healthy"]
    (line,) = [line for line in pair_status.render(report) if line.strip().startswith("watchdog")]
    assert line.split() == ["watchdog", "-"]


def test_a_rank_container_on_another_image_than_the_alias_is_a_problem(answers):
    """images.yml moved the alias on spark-2; its Ray container (the rank) still runs the old
    image: two vLLM builds in one group."""
    moved = copy.deepcopy(answers)
    old_id = moved["nodes"]["spark-2"]["image"]["Id"]
    moved["nodes"]["spark-2"]["image"]["Id"] = "sha256:" + "a63" * 21 + "a"
    report = _report(moved)
    assert not report["healthy"]
    assert report["problems"] == [
        f"spark-2: the ray container runs {old_id.split(':')[1][:12]}, but "
        "dgx-spark/vllm-serving:current is a63a63a63a63: the ranks are not on one image; run "
        "deploy.yml (its serving stage moves every rank together)"
    ]
    assert "PROBLEM: spark-2: the ray container runs" in "\n".join(pair_status.render(report))


# The image report hybrid_image keeps on each node, built from the probe's answer captured in
# the simulated pair's serving image (tests/unit/fixtures/hybrid_image).
def _image_report(name="probe_report_sim_serving.json"):
    doc = load_json(FIXTURES.parent / "hybrid_image" / name)
    return build_report(doc, list(build_info(doc)["architectures"]), {}, SETTINGS["image"])


# The pip wheel's and the node's libnccl as public reports and preflight's probe print them
# (vLLM issue 42354; spark_nccl_host_library on DGX OS); IN is spark_nccl_in_container.
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
HOST_REAL = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
IN = "/opt/dgx-spark-nccl/libnccl.so.2"


def _with_wheel(report):
    return {**report, "nccl": {"version": "2.28.3", "source": "the nvidia-nccl-cu13 package"},
            "files": {"libnccl": [WHEEL], "libibverbs": []}}  # fmt: skip


@pytest.mark.parametrize(
    ("loaded", "library", "version"),
    [
        # The sim's Ray container maps no libnccl (CPU build): nothing loaded.
        ([], None, None),
        ([WHEEL], "image", "2.28.3"),
        ([IN], "host", "2.28.9"),
        (["/opt/other/libnccl.so.2.30.7"], "other", "2.30.7"),
    ],
)
def test_the_nccl_a_rank_loaded_is_named_from_its_path(loaded, library, version):
    nccl = pair_status.rank_nccl(loaded, _with_wheel(_image_report()), HOST_REAL, IN)
    assert (nccl["library"], nccl["version"], nccl["paths"]) == (library, version, loaded)


def test_status_carries_each_nodes_image_report_and_rank_nccl(answers):
    report = _image_report()
    ranks = {
        "spark-1": {"image_report": _with_wheel(report), "nccl_loaded": [WHEEL],
                    "nccl_host_library": HOST_REAL},
        "spark-2": {"image_report": None, "nccl_loaded": [IN], "nccl_host_library": HOST_REAL},
    }  # fmt: skip
    status = _report(answers, settings={"ranks": ranks, "nccl_in_container": IN})
    one, two = status["nodes"]["spark-1"], status["nodes"]["spark-2"]
    assert one["image_report"]["vllm"] == "0.32.0+cpu"
    assert one["nccl"] == {"library": "image", "version": "2.28.3", "paths": [WHEEL], "build": None}
    assert two["nccl"]["library"] == "host" and two["image_report"] is None
    # A missing report is a warning, not a problem: the pair still serves.
    assert status["healthy"]
    assert any(w.startswith("spark-2: no image report for ") for w in status["warnings"])
    lines = pair_status.render(status)
    assert any(
        line.startswith("  spark-1 image ") and "vLLM 0.32.0+cpu, torch 2.13.0+cpu" in line
        for line in lines
    )
    assert f"  spark-1 ranks load the image's NCCL 2.28.3 ({WHEEL})" in lines
    assert f"  spark-2 ranks load the node's NCCL 2.28.9 ({IN})" in lines


def test_status_without_ranks_read_prints_no_image_lines(answers):
    lines = pair_status.render(_report(answers))
    assert not any(" ranks load " in line for line in lines)


# The builds the ranks map, as ranks.yml reads them in the Ray container (elf_notes'
# library_build): the first eight hex digits of each 2.28.9 build's ID are the public reports'
# (vLLM issues 41725 and 42354), the rest is made up.
PIP_BUILD = {"path": WHEEL, "real_path": WHEEL, "size": 219_000_000,
             "build_id": "a7f420a1" + "5e" * 16, "sha256": None, "error": None}  # fmt: skip
DGX_BUILD = {"path": IN, "real_path": IN, "size": 190_000_000,
             "build_id": "c0db9360" + "17" * 16, "sha256": None, "error": None}  # fmt: skip


@pytest.mark.parametrize(
    ("loaded", "short"),
    [([WHEEL], "a7f420a1"), ([IN], "c0db9360"), (["/opt/other/libnccl.so.2.30.7"], None)],
)
def test_the_build_a_rank_maps_is_the_one_read_for_that_path(loaded, short):
    builds = {WHEEL: PIP_BUILD, IN: DGX_BUILD}
    nccl = pair_status.rank_nccl(loaded, _with_wheel(_image_report()), HOST_REAL, IN, builds)
    assert ((nccl["build"] or {}).get("build_id") or "")[:8] == (short or "")


def test_status_names_the_build_beside_the_version_and_in_the_image_report(answers):
    report = _with_wheel(_image_report())
    ranks = {
        "spark-1": {"image_report": report, "nccl_loaded": [WHEEL], "nccl_host_library": HOST_REAL,
                    "nccl_builds": {WHEEL: PIP_BUILD}},
        "spark-2": {"image_report": report, "nccl_loaded": [IN], "nccl_host_library": HOST_REAL,
                    "nccl_builds": {IN: DGX_BUILD}},
    }  # fmt: skip
    status = _report(answers, settings={"ranks": ranks, "nccl_in_container": IN})
    one, two = status["nodes"]["spark-1"], status["nodes"]["spark-2"]
    assert one["nccl"]["build"]["size"] == 219_000_000
    # The ranks of spark-1 map the image's file: its report names the build; spark-2's ranks
    # map the node's, so its image report stays as the image made it.
    assert one["image_report"]["nccl"]["build"]["build_id"].startswith("a7f420a1")
    assert "NCCL 2.28.3 (build a7f420a1)" in one["image_report"]["summary"]
    assert "build" not in two["image_report"]["nccl"]
    lines = pair_status.render(status)
    assert f"  spark-1 ranks load the image's NCCL 2.28.3, build a7f420a1 ({WHEEL})" in lines
    assert f"  spark-2 ranks load the node's NCCL 2.28.9, build c0db9360 ({IN})" in lines
