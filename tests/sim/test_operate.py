"""Day 2 on the deployed pair: playbooks/status.yml, benchmark.yml and logs.yml.

Needs the pair up and serving (make demo). The last test stops one of the worker's
containers and starts it again, waiting until the pair serves once more.
"""

from __future__ import annotations

import csv
import json
import os
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import PlaybookRun, drills, node_image_id, run_playbook

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
# Fewer prompts per run than the sim's defaults: the figures' coherence is what is tested.
FEWER = ("-e", "operate_benchmark_min_prompts=4", "-e", "operate_benchmark_prompts_per_slot=2")


def playbook(name: str, *extra: str, timeout: int = 600) -> PlaybookRun:
    """Run playbooks/<name> against the sim inventory, its output the text a user reads."""
    run = run_playbook(f"playbooks/{name}", *extra, json_report=False, timeout=timeout)
    assert _secret() not in run.raw, f"{name} printed the API key"
    return run


_SETTINGS: dict = {}


def _secret() -> str:
    return _SETTINGS["vllm_serve_api_key"]


def status(tmp_path: Path, label: str) -> tuple[PlaybookRun, dict]:
    path = tmp_path / f"status-{label}.json"
    # Relative, as a user would type it: relative to the directory the playbook runs in.
    run = playbook("status.yml", "-e", f"status_json={os.path.relpath(path, ROOT)}")
    assert path.is_file(), f"status wrote no JSON (rc {run.rc}):\n{run.stdout[-3000:]}"
    return run, json.loads(path.read_text())


@pytest.fixture(scope="module")
def serving(ansible, deployed_pair):
    """The pair's settings from the inventory, once its endpoint has proven it serves."""
    # What the inventory leaves unset: the spark_defaults value vllm_serve's default derives from.
    shared = yaml.safe_load((ROOT / "roles/spark_defaults/defaults/main.yml").read_text())
    defaults = {
        "vllm_serve_backend": shared["spark_serving_backend"],
        "vllm_serve_api_key": shared["spark_serving_api_key"],
        "vllm_serve_port": shared["spark_serving_port"],
    }
    for name in ("vllm_serve_backend", "vllm_serve_api_key", "vllm_serve_port", "ansible_host"):
        value = ansible("spark-1", "ansible.builtin.debug", f"var={name}")["spark-1"][name]
        _SETTINGS[name] = defaults[name] if "is undefined" in str(value) else value
    _SETTINGS["url"] = f"http://{_SETTINGS['ansible_host']}:{_SETTINGS['vllm_serve_port']}"
    if not _completes(_SETTINGS["url"]):
        pytest.fail("the pair does not serve: run `make demo` first")
    return _SETTINGS["vllm_serve_backend"]


def _completes(url: str) -> bool:
    """Whether the endpoint answers a one-token completion (the key never leaves the test)."""
    return drills.endpoint(url, _secret(), timeout=30).complete("tiny-qwen3-moe", "Hi").ok


def test_status_reports_a_healthy_pair(serving, deployed_pair, tmp_path):
    run, report = status(tmp_path, "healthy")
    assert run.rc == 0, run.stdout[-3000:]
    assert report["healthy"], report["problems"]
    cluster = report["cluster"]
    assert cluster["backend"] == serving
    # Same image on every node: the sim's base is served as it is, one image ID on both (the
    # same base loaded on each), which the alias names.
    ids = {name: n["image_id"] for name, n in report["nodes"].items()}
    assert all(i.startswith("sha256:") for i in ids.values()), ids
    assert len(set(ids.values())) == 1 and len(ids) == 2, ids
    assert cluster["image_ids_match"] is True
    for node in deployed_pair:
        assert node_image_id(node, "vllm-node:0.32.0-ray2.60.0") == ids[node.name], node.name
    assert cluster["health"]["ok"] and cluster["completion"]["latency_ms"] > 0
    assert cluster["model"]["id"] == "tiny-qwen3-moe"
    assert cluster["ray"]["alive_nodes"] == 2 and cluster["ray"]["gpus_total"] == 2
    metrics = cluster["metrics"]
    for key in ("running", "waiting", "kv_cache_usage_pct", "prompt_tokens_per_s"):
        assert metrics[key] is not None, key
    for name, node in report["nodes"].items():
        assert node["ray"]["running"], name
        assert node["memory"]["total_mb"] > 0 and node["disks"], name
    assert report["nodes"]["spark-1"]["serving"]["running"]
    assert "HEALTHY" in run.stdout and "spark-2  worker" in run.stdout
    print(f"\nstatus wall time: {run.seconds:.1f} s")
    assert run.seconds < 30, f"status took {run.seconds:.1f} s"


def test_benchmark_results_hang_together(serving, tmp_path):
    results = tmp_path / "results"
    relative = os.path.relpath(results, ROOT)
    run = playbook("benchmark.yml", "-e", f"operate_benchmark_results_dir={relative}", *FEWER)
    assert run.rc == 0, run.stdout[-4000:]
    assert "run 1/3: concurrency 1" in run.stdout  # progress is shown run by run
    (first,) = results.iterdir()
    runs = {p.name: json.loads(p.read_text()) for p in first.glob("c*-in*-out*.json")}
    assert sorted(runs) == ["c1-in96-out24.json", "c2-in96-out24.json", "c4-in96-out24.json"]
    rows = list(csv.DictReader((first / "summary.csv").open()))
    assert [int(r["concurrency"]) for r in rows] == [1, 2, 4]
    for row in rows:
        raw = runs[f"c{row['concurrency']}-in96-out24.json"]
        assert raw["max_concurrency"] == int(row["concurrency"])
        assert raw["completed"] == raw["num_prompts"] == int(row["completed"]) > 0
        assert raw["failed"] == 0
        assert raw["total_output_tokens"] == raw["completed"] * 24
        assert float(row["output_throughput"]) == pytest.approx(raw["output_throughput"], abs=0.01)
        assert raw["output_throughput"] == pytest.approx(
            raw["total_output_tokens"] / raw["duration"], rel=0.01
        )
        for metric in ("ttft", "itl"):
            p50, p99 = float(row[f"p50_{metric}_ms"]), float(row[f"p99_{metric}_ms"])
            assert 0 < p50 <= p99
            assert p99 == pytest.approx(raw[f"p99_{metric}_ms"], abs=0.01)
    for name in ("throughput.png", "ttft.png", "itl.png"):
        assert (first / name).read_bytes().startswith(PNG), name
    print(f"\nbenchmark wall time: {run.seconds:.1f} s\n" + (first / "summary.csv").read_text())


@pytest.mark.drill
def test_a_second_sweep_is_plotted_against_the_first(serving, tmp_path):
    """benchmark_compare: two one-run sweeps, the second plotted against the first (a drill
    for time only: each sweep is a `vllm bench serve` start, and the plot is unit-tested)."""
    results = tmp_path / "results"
    one = ("-e", '{"operate_benchmark_concurrency": [1]}', *FEWER)
    run = playbook("benchmark.yml", "-e", f"operate_benchmark_results_dir={results}", *one)
    assert run.rc == 0, run.stdout[-4000:]
    (first,) = results.iterdir()
    again = playbook(
        "benchmark.yml",
        "-e", f"operate_benchmark_results_dir={results}", *one,
        "-e", f"benchmark_compare={first}",
    )  # fmt: skip
    assert again.rc == 0, again.stdout[-4000:]
    (second,) = [p for p in results.iterdir() if p != first]
    assert (second / "compare.png").read_bytes().startswith(PNG)


def test_logs_archive_holds_both_nodes(serving, tmp_path):
    run = playbook(
        "logs.yml",
        "-e",
        f"operate_logs_dir={os.path.relpath(tmp_path, ROOT)}",
        "-e",
        "operate_logs_lines=50",
    )
    assert run.rc == 0, run.stdout[-3000:]
    (archive,) = tmp_path.glob("dgx-spark-logs-*.tar.gz")
    with tarfile.open(archive) as tar:
        members = {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar if m.isfile()
        }
    for node in ("spark-1", "spark-2"):
        for name in ("dgx-spark-ray.log", "docker-inspect.json", "ray-status.txt", "comm.env"):
            assert f"{node}/{name}" in members, f"{node}/{name} missing: {sorted(members)}"
        assert "Active:" in members[f"{node}/ray-status.txt"]
        assert "VLLM_HOST_IP=" in members[f"{node}/comm.env"]
        inspect = json.loads(members[f"{node}/docker-inspect.json"])
        assert {c["Name"] for c in inspect} >= {"/dgx-spark-ray"}
    assert "spark-1/dgx-spark-vllm.log" in members
    assert not [name for name, text in members.items() if _secret() in text]


def _wait_until_serving(timeout: int) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _completes(_SETTINGS["url"]):
            return True
        time.sleep(5)
    return False


@pytest.mark.drill
def test_status_fails_when_a_worker_rank_stops(serving, hosts, tmp_path):
    # The worker's rank lives in its serving container (multinode) or its Ray container (ray).
    container = "dgx-spark-vllm" if serving == "multinode" else "dgx-spark-ray"
    worker = hosts["spark-2"]
    assert worker.run(f"sudo docker stop {container}").rc == 0
    try:
        run, report = status(tmp_path, "stopped")
        assert run.rc != 0
        assert not report["healthy"]
        assert any(p.startswith("spark-2: ") and "exited" in p for p in report["problems"])
        assert "UNHEALTHY" in run.stdout
    finally:
        worker.run_expect([0], f"sudo docker start {container}")
        if not _wait_until_serving(timeout=240):
            # The head gave up on the lost rank: start the stage again as deploy.yml would.
            for stage in ("ray.yml", "serve.yml"):
                restored = playbook(stage, timeout=600)
                assert restored.rc == 0, restored.stdout[-3000:]
    _, report = status(tmp_path, "restored")
    assert report["healthy"], report["problems"]
