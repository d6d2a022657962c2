"""plugins/module_utils/vllm_metrics.py on /metrics captured from vLLM 0.32 on the pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_metrics

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"


def _summary(name, model="tiny-qwen3-moe"):
    return vllm_metrics.summarize((FIXTURES / name).read_text(), model)


def test_idle_server():
    summary = _summary("metrics_vllm_0.32_idle.txt")
    assert summary["running"] == 0
    assert summary["waiting"] == 0
    assert summary["kv_cache_usage"] == 0.0
    assert summary["kv_cache_usage_pct"] == 0.0
    assert summary["prompt_tokens"] == 0.0
    assert summary["generation_tokens"] == 0.0
    assert summary["requests_finished"] == 0


def test_server_after_a_benchmark():
    summary = _summary("metrics_vllm_0.32_after_bench.txt")
    assert summary["prompt_tokens"] > 0
    assert summary["generation_tokens"] > 0
    assert summary["requests_finished"] > 0
    # Every finished request generated at least one token.
    assert summary["generation_tokens"] >= summary["requests_finished"]


def test_throughput_between_two_scrapes_excludes_the_probe():
    idle = _summary("metrics_vllm_0.32_idle.txt")
    loaded = _summary("metrics_vllm_0.32_after_bench.txt")
    rates = vllm_metrics.throughput(
        idle, loaded, 10.0, {"prompt_tokens": 2, "completion_tokens": 1}
    )
    assert rates["prompt_tokens_per_s"] == pytest.approx(
        (loaded["prompt_tokens"] - 2) / 10, abs=0.01
    )
    assert rates["generation_tokens_per_s"] == pytest.approx(
        (loaded["generation_tokens"] - 1) / 10, abs=0.01
    )
    # A counter that went down is a restarted server: no rate.
    assert vllm_metrics.throughput(loaded, idle, 10.0)["generation_tokens_per_s"] == 0.0


def test_other_model_and_missing_metrics():
    assert _summary("metrics_vllm_0.32_idle.txt", model="another")["running"] is None
    summary = vllm_metrics.summarize("# HELP x y\nprocess_open_fds 12.0\n")
    assert summary["running"] is None and summary["kv_cache_usage_pct"] is None
    rates = vllm_metrics.throughput(summary, summary, 1.0)
    assert rates["prompt_tokens_per_s"] is None


@pytest.mark.parametrize(
    "text", ['vllm:num_requests_running{engine="0"\n', "metric not_a_number\n"]
)
def test_garbage_is_refused(text):
    with pytest.raises(vllm_metrics.MetricsError):
        vllm_metrics.parse_samples(text)


def test_labels_with_escaped_quotes():
    samples = vllm_metrics.parse_samples('m{a="x\\"y",b="z"} 1.5 1700000000\n')
    assert samples == [("m", {"a": 'x\\"y', "b": "z"}, 1.5)]
