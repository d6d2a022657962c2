"""plugins/module_utils/vllm_metrics.py on /metrics captured from vLLM 0.32 on the pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_metrics
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"


def _summary(name, model="tiny-qwen3-moe"):
    return vllm_metrics.summarize(tool_output(FIXTURES / name), model)


def test_idle_server():
    assert _summary("metrics_vllm_0.32_idle.txt") == {
        "running": 0,
        "waiting": 0,
        "kv_cache_usage": 0.0,
        "kv_cache_usage_pct": 0.0,
        "prompt_tokens": 0.0,
        "generation_tokens": 0.0,
        "preemptions": 0,
        "spec_drafts": None,
        "spec_draft_tokens": None,
        "spec_accepted_tokens": None,
        "requests_finished": 0,
        "requests_aborted": 0,
        "requests_errored": 0,
        "requests_by_reason": {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0},
    }


def test_server_after_a_benchmark():
    # 46 requests of the sim's sweep, each cut at its max_tokens (length), none aborted.
    assert _summary("metrics_vllm_0.32_after_bench.txt") == {
        "running": 0,
        "waiting": 0,
        "kv_cache_usage": 0.0,
        "kv_cache_usage_pct": 0.0,
        "prompt_tokens": 3145.0,
        "generation_tokens": 796.0,
        "preemptions": 0,
        "spec_drafts": None,
        "spec_draft_tokens": None,
        "spec_accepted_tokens": None,
        "requests_finished": 46,
        "requests_aborted": 0,
        "requests_errored": 0,
        "requests_by_reason": {"stop": 0, "length": 46, "abort": 0, "error": 0, "repetition": 0},
    }


def test_speculative_decodings_acceptance_between_two_scrapes():
    """n-gram drafts on the sim's pair: 16 drafts of 2 tokens between the scrapes, 24 of the
    32 draft tokens accepted."""
    before = _summary("metrics_vllm_0.32_ngram_before.txt", "tiny-qwen3")
    after = _summary("metrics_vllm_0.32_ngram_after.txt", "tiny-qwen3")
    assert (before["spec_drafts"], before["spec_draft_tokens"]) == (4, 8)
    assert vllm_metrics.speculative(before, after) == {
        "drafts": 16,
        "draft_tokens": 32,
        "accepted_tokens": 24,
        "acceptance_rate": 0.75,
        "mean_acceptance_length": 2.5,
    }


def test_no_acceptance_without_speculative_decoding_or_across_a_restart():
    idle = _summary("metrics_vllm_0.32_idle.txt")
    assert vllm_metrics.speculative(idle, _summary("metrics_vllm_0.32_after_bench.txt")) is None
    after = _summary("metrics_vllm_0.32_ngram_after.txt", "tiny-qwen3")
    before = _summary("metrics_vllm_0.32_ngram_before.txt", "tiny-qwen3")
    assert vllm_metrics.speculative(after, before) is None, "counters went down: a restart"
    assert vllm_metrics.speculative(before, before)["acceptance_rate"] is None


def test_aborted_and_errored_requests_are_not_counted_as_finished():
    # No capture has an aborted or failed request: the benchmark's /metrics with 3 of its
    # length samples moved to abort and 2 to error, as vLLM would count them.
    text = tool_output(FIXTURES / "metrics_vllm_0.32_after_bench.txt")
    text = text.replace(
        'finished_reason="length",model_name="tiny-qwen3-moe"} 46.0',
        'finished_reason="length",model_name="tiny-qwen3-moe"} 41.0',
    )
    for reason, count in (("abort", 3), ("error", 2)):
        text = text.replace(
            f'request_success_total{{engine="0",finished_reason="{reason}",'
            'model_name="tiny-qwen3-moe"} 0.0',
            f'request_success_total{{engine="0",finished_reason="{reason}",'
            f'model_name="tiny-qwen3-moe"}} {count}.0',
        )
    summary = vllm_metrics.summarize(text, "tiny-qwen3-moe")
    assert (summary["requests_finished"], summary["requests_aborted"],
            summary["requests_errored"]) == (41, 3, 2)  # fmt: skip
    assert summary["requests_by_reason"]["abort"] == 3


def test_requests_of_two_engines_add_up_and_an_unlabelled_one_finished():
    text = (
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0\n'
        'vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 7.0\n'
        'vllm:request_success_total{engine="1",finished_reason="abort",model_name="m"} 1.0\n'
        'vllm:request_success_total{model_name="m"} 2.0\n'
    )
    summary = vllm_metrics.summarize(text, "m")
    assert summary["requests_by_reason"] == {"stop": 12, "abort": 1, "": 2}
    assert (summary["requests_finished"], summary["requests_aborted"],
            summary["requests_errored"]) == (14, 1, 0)  # fmt: skip


def test_throughput_between_two_scrapes_excludes_the_probe():
    idle = _summary("metrics_vllm_0.32_idle.txt")
    loaded = _summary("metrics_vllm_0.32_after_bench.txt")
    rates = vllm_metrics.throughput(
        idle, loaded, 10.0, {"prompt_tokens": 2, "completion_tokens": 1}
    )
    # (3145 - 2) / 10 and (796 - 1) / 10
    assert rates == {"prompt_tokens_per_s": 314.3, "generation_tokens_per_s": 79.5,
                     "interval_s": 10.0}  # fmt: skip
    # A counter that went down is a restarted server: no rate.
    assert vllm_metrics.throughput(loaded, idle, 10.0) == {
        "prompt_tokens_per_s": 0.0,
        "generation_tokens_per_s": 0.0,
        "interval_s": 10.0,
    }


def test_other_model_and_missing_metrics():
    assert _summary("metrics_vllm_0.32_idle.txt", model="another")["running"] is None
    summary = vllm_metrics.summarize("# HELP x y\nprocess_open_fds 12.0\n")
    assert summary["running"] is None and summary["kv_cache_usage_pct"] is None
    assert summary["requests_finished"] is None and summary["requests_by_reason"] is None
    assert summary["requests_aborted"] is None and summary["requests_errored"] is None
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


# --------------------------------------------------------------------------- busy or dead
# Three reads of the sim's /metrics around a load of six 300-token completions (README.md of
# tests/unit/fixtures/watchdog): before, 4 s in (six running), 3 s later (all done).
LOAD = Path(__file__).resolve().parents[2] / "fixtures" / "watchdog"


def _read(name):
    from support.captures import tool_output

    return vllm_metrics.summarize(
        tool_output(LOAD / f"metrics_vllm_0.32_{name}.txt"), "tiny-qwen3-moe"
    )


def test_requests_running_mean_busy_even_on_a_first_read():
    assert vllm_metrics.busy_reason(None, _read("under_load"), 0) == "6 requests running, 0 waiting"


def test_tokens_that_rose_between_two_reads_mean_busy():
    before, during, done = _read("before_load"), _read("under_load"), _read("load_done")
    assert vllm_metrics.busy_reason(before, during, 4) == (
        "986 tokens generated in 4 s; 62 tokens prefilled in 4 s; 6 requests running, 0 waiting"
    )
    # All six finished between the reads: nothing runs, but the engine generated 815 tokens.
    assert vllm_metrics.busy_reason(during, done, 3) == "815 tokens generated in 3 s"


def test_a_server_that_does_nothing_is_not_busy():
    idle = _read("load_done")
    assert vllm_metrics.busy_reason(idle, idle, 30) == ""
    assert vllm_metrics.busy_reason(None, idle, 0) == ""


def test_no_metrics_or_a_restarted_server_are_not_busy():
    assert vllm_metrics.busy_reason(_read("before_load"), None, 30) == ""
    # Counters that went down belong to a new server: no progress is read across them.
    assert vllm_metrics.busy_reason(_read("load_done"), _read("before_load"), 30) == ""
