"""plugins/filter/operate.py: the filters the operate role calls, on captured pair answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import operate
from support.captures import load_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"
SETTINGS = {
    "backend": "ray",
    "image": "dgx-spark/vllm-serving:current",
    "served_model_name": "tiny-qwen3-moe",
    "url": "http://172.30.240.11:8000/v1",
    "expected_gpus": 2,
    "disk_paths": ["/var/lib/docker", "/var/lib/dgx-spark"],
    "checked_at": "2026-11-30T06:21:00.000000Z",
}


def _answers(name):
    return load_json(FIXTURES / name)


def _report(name):
    answers = _answers(name)
    return operate.operate_status_report(
        answers["nodes"], "spark-1", answers["endpoint"], answers["ray_status"], SETTINGS
    )


def test_the_healthy_pair():
    report = _report("status_answers_sim.json")
    assert report["healthy"], report["problems"]
    cluster = report["cluster"]
    assert cluster["image_builds_match"]
    assert cluster["completion"]["latency_ms"] > 0
    assert cluster["ray"]["alive_nodes"] == 2
    assert cluster["model"]["id"] == "tiny-qwen3-moe"
    lines = operate.operate_status_lines(report)
    assert any("HEALTHY" in line for line in lines)
    json.dumps(report)  # what -e status_json writes


@pytest.mark.parametrize(
    ("fixture", "problem"),
    [
        ("status_answers_sim_engine_dead.json", "endpoint completion failed: HTTP Error 500"),
        ("status_answers_sim_down.json", "endpoint /health: <urlopen error [Errno 111]"),
    ],
)
def test_unhealthy_pairs_name_their_problem(fixture, problem):
    report = _report(fixture)
    assert not report["healthy"]
    assert any(p.startswith(problem) for p in report["problems"]), report["problems"]


def test_ray_not_asked():
    answers = _answers("status_answers_sim.json")
    report = operate.operate_status_report(
        answers["nodes"], "spark-1", answers["endpoint"], None, SETTINGS
    )
    assert any("ray status on spark-1: not asked" in p for p in report["problems"])


def test_bench_summary_and_a_broken_result():
    runs = [
        {"file": f.name, "result": load_json(f), "input_len": 96, "output_len": 24}
        for f in sorted(FIXTURES.glob("bench_serve_*.json"))
    ]
    summary = operate.operate_bench_summary(runs)
    assert summary["errors"] == []
    assert summary["csv"].startswith("concurrency,input_len,output_len")
    assert len(summary["rows"]) == len(runs) == len(summary["table"]) - 1
    with pytest.raises(AnsibleFilterError, match="broken.json"):
        operate.operate_bench_summary([{"file": "broken.json", "result": {}}])


def test_container_logs_and_masking():
    results = [
        {"c": "dgx-spark-vllm", "rc": 0, "stdout": "2026-11-30T06:00:02Z b\n",
         "stderr": "2026-11-30T06:00:01Z key sim-only-key\n"},
        {"c": "gone", "rc": 1, "stdout": "", "stderr": "", "msg": "No such container"},
    ]  # fmt: skip
    files = operate.operate_container_logs(results, "c")
    assert [f["name"] for f in files] == ["dgx-spark-vllm.log", "gone.log"]
    assert files[0]["content"].splitlines()[0].endswith("sim-only-key")
    assert "No such container" in files[1]["content"]
    masked = operate.operate_mask_secrets(files[0]["content"], ["sim-only-key", ""])
    assert "sim-only-key" not in masked and "********" in masked
