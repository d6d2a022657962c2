"""plugins/filter/vllm_serve_memory.py: the memory and CMA checks as the vllm_serve role calls
them, on the samples of tests/unit/fixtures/vllm_serve/."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils import vllm_serve_memory as f
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_serve"


def fixture(name: str) -> str:
    return tool_output(FIXTURES / name)


def test_the_ranks_pids_come_from_docker_top_outputs():
    meminfo = fixture("meminfo_spark_llama_loaded.txt")
    apps = fixture("nvidia_smi_compute_apps_llama.txt")
    # One `docker top NAME -eo pid` output per running rank container, as the role registers.
    tops = ["PID\n4100\n4242\n", "PID\n5000\n"]
    result = f.vllm_serve_memory_check(meminfo, 0.8, 8, apps, tops, "spark-2")
    assert result["passed"] is True
    assert result["held"] == 38554 * (1 << 20)
    nothing_runs = f.vllm_serve_memory_check(meminfo, 0.8, 8, "", [], "spark-2")
    assert nothing_runs["passed"] is False and nothing_runs["held"] == 0
    assert f.vllm_serve_memory_check(meminfo, 0.8, 8, apps, [4242])["passed"] is True


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("MemTotal: 1 kB\n", 0.8, 8), "spark-1: memory check: no MemAvailable"),
        ((fixture("meminfo_spark_idle.txt"), 2, 8), "vllm_serve_gpu_memory_utilization is 2"),
        ((fixture("meminfo_spark_idle.txt"), 0.8, 8, "garbage"), "pid, used_memory"),
    ],
)
def test_unreadable_input_is_a_filter_error_naming_the_node(args, words):
    with pytest.raises(AnsibleFilterError, match=words):
        f.vllm_serve_memory_check(*args, host="spark-1")


def test_cma_check_and_its_errors():
    assert f.vllm_serve_cma_check(fixture("meminfo_spark_idle.txt"), "spark-1")["passed"]
    refused = f.vllm_serve_cma_check(fixture("meminfo_spark_kho_1019.txt"), "spark-1")
    assert refused["passed"] is False and "kho=off" in refused["message"]
    with pytest.raises(AnsibleFilterError, match="spark-1: CMA check: no MemTotal"):
        f.vllm_serve_cma_check("", "spark-1")


def test_setting_errors():
    assert f.vllm_serve_memory_setting_errors("", 8) == []
    assert f.vllm_serve_memory_setting_errors(0.8, 100) == [
        "vllm_serve_memory_margin_gib is 100; allowed: a number of GiB from 0 to 64"
    ]


def test_vllms_figure_is_judged_from_each_nodes_probe_output_and_held_memory():
    check = f.vllm_serve_vllm_memory_check
    gib = 1 << 30
    line = '{"source": "vLLM MemorySnapshot", "free": %d, "total": %d, "mem_available": %d}'
    hostvars = {
        "spark-1": {
            "_vllm_serve_memory_probe": "INFO noise\n" + line % (80 * gib, 120 * gib, 89 * gib),
            "_vllm_serve_memory_held": 10 * gib,
        },
        "spark-2": {"_vllm_serve_memory_probe": line % (70 * gib, 120 * gib, 79 * gib)},
    }
    decided = check(["spark-1", "spark-2"], hostvars, 0.7)
    # 0.7 x 120 = 84 GiB: spark-1 sees 80 + 10 held, spark-2 only 70 (at most 0.58).
    assert not decided["passed"]
    assert decided["nodes"]["spark-1"]["fits"] == 0.75
    assert "would refuse the start on spark-2 " in decided["message"]
    assert "set vllm_serve_gpu_memory_utilization to 0.58 or lower" in decided["message"]
    with pytest.raises(AnsibleFilterError, match="printed no answer"):
        check(["spark-1"], {"spark-1": {"_vllm_serve_memory_probe": "Traceback"}}, 0.7)
