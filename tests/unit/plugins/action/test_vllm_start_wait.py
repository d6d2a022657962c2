"""vllm_start_wait's loop on a scripted node and a fake clock: what it prints, when it ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.action import vllm_start_wait
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_serve"
# The sim's own Ray start (make demo, 2026-12-04), and its first lines up to shard 0/2.
RAY_SIM = tool_output(FIXTURES / "start_ray_sim_demo.log").splitlines()
STALLED = tool_output(FIXTURES / "start_stalled_weights_sim.log").splitlines()


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        return self.now


def _args(**extra):
    return {**{k: v.get("default") for k, v in vllm_start_wait.ARGUMENT_SPEC.items()},
            "model": "m", "watch": ["vllm"], **extra}  # fmt: skip


def _run(monkeypatch, answers, clock, step, **extra):
    """Each poll returns the next answer and advances the clock by ``step`` seconds."""
    printed: list[str] = []
    polls: list[float] = []
    monkeypatch.setattr(vllm_start_wait.time, "time", clock.time)

    def show(msg, stderr=False):
        # Progress goes to stderr, so a JSON callback's stdout stays JSON.
        assert stderr is True, msg
        printed.append(msg)

    monkeypatch.setattr(vllm_start_wait.display, "display", show)
    action = vllm_start_wait.ActionModule.__new__(vllm_start_wait.ActionModule)

    def poll(args, baseline, since, task_vars):
        polls.append(since)
        clock.now += step
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return {"healthy": False, "timed_out": True, "reason": "no answer", "states": {}, **answer}

    action._poll = poll
    return action._wait(_args(**extra), "spark-1", {}), printed, polls


def _log(lines):
    return {"logs": {"vllm": lines}}


def test_a_slow_start_that_progresses_serves_past_the_old_deadline(monkeypatch):
    """Shards 30 s apart over 40 min: with a 900 s stall it is never judged, and it serves."""
    shard = "2026-12-01T10:{:02d}:{:02d}.000000000Z Loading safetensors checkpoint shards: " \
            "{:3d}% Completed | {}/80 [00:00<00:00, 30.00s/it]"  # fmt: skip
    answers = [_log([shard.format(k // 2, 30 * (k % 2), k * 100 // 80, k)]) for k in range(81)]
    serving = (
        "2026-12-01T10:41:00.000000000Z (APIServer pid=1) INFO:     Application startup complete."
    )
    answers.append(_log([serving]) | {"healthy": True, "timed_out": False, "reason": ""})
    result, printed, _polls = _run(
        monkeypatch, answers, Clock(), step=30, stall_timeout=900, timeout=3600
    )
    assert result["healthy"] and result["reason"] == ""
    assert result["phase"] == "serving"
    assert (
        printed[0] == "[spark-1] vLLM start, 0m30s: loading weights: driver 0/80 shards, 30.00s/it"
    )
    assert printed[-2] == (
        "[spark-1] vLLM start, 40m30s: loading weights: driver 80/80 shards, 30.00s/it"
    )
    assert printed[-1] == "[spark-1] vLLM start, 41m00s: serving"
    # The result carries the same lines, without the node, for a caller to show or check.
    assert result["progress"] == [line.removeprefix("[spark-1] ") for line in printed]


def test_an_endpoint_that_answers_before_its_log_line_ends_the_progress_with_serving(monkeypatch):
    shard = "2026-12-01T10:00:10.000000000Z Loading safetensors checkpoint shards: " \
            "100% Completed | 2/2 [00:00<00:00, 5.00s/it]"  # fmt: skip
    answers = [_log([shard]), {"healthy": True, "timed_out": False, "reason": ""}]
    result, printed, _polls = _run(monkeypatch, answers, Clock(), step=10)
    assert result["healthy"] and result["phase"] == "serving"
    assert result["progress"] == [
        "vLLM start, 0m10s: loading weights: driver 2/2 shards, 5.00s/it",
        "vLLM start, 0m20s: serving",
    ]
    assert len(printed) == 2


def test_a_stalled_start_is_judged_within_the_stall_time_naming_the_phase(monkeypatch):
    answers = [_log(STALLED), _log([])]
    clock = Clock()
    start = clock.now
    result, printed, _polls = _run(
        monkeypatch, answers, clock, step=10, stall_timeout=120, timeout=3600
    )
    assert not result["healthy"] and result["stalled"] is True
    assert result["phase"] == "weights"
    assert result["reason"] == (
        "the start stalled while loading weights: driver 0/2 shards: no progress in the logs "
        "for 120 s (vllm_serve_start_stall_timeout is 120 s)"
    )
    # the last progress came with the first poll (10 s): judged 120 s after it, no later
    assert clock.now - start == 130
    assert printed[0] == "[spark-1] vLLM start, 0m10s: loading weights: driver 0/2 shards"
    # a line at least every minute while nothing happens
    assert printed[1].startswith("[spark-1] vLLM start, 1m10s: loading weights")


def test_the_ceiling_ends_a_start_that_still_progresses(monkeypatch):
    shard = "Loading safetensors checkpoint shards: 1% Completed | {}/999 [00:00<00:00, 1s/it]"
    answers = [_log([shard.format(k)]) for k in range(999)]
    result, _printed, _polls = _run(
        monkeypatch, answers, Clock(), step=10, stall_timeout=900, timeout=300
    )
    assert result["stalled"] is False
    assert result["reason"].startswith("the start did not serve within vllm_serve_health_timeout")


def test_a_container_that_exits_ends_the_wait_at_once(monkeypatch):
    answers = [{"timed_out": False, "reason": "vllm exited", "excerpt": "ValueError: bad"}]
    result, _printed, _polls = _run(monkeypatch, answers, Clock(), step=3)
    assert result["reason"] == "vllm exited" and result["excerpt"] == "ValueError: bad"


def test_lines_seen_in_an_earlier_poll_are_skipped_and_since_advances(monkeypatch):
    first = STALLED  # through shard 0/2
    done = next(i for i, line in enumerate(RAY_SIM) if "| 2/2 [" in line)
    (serving,) = [line for line in RAY_SIM if "Application startup complete" in line]
    answers = [_log(first), _log(RAY_SIM[: done + 1]), _log([serving]) | {"healthy": True}]
    result, printed, polls = _run(monkeypatch, answers, Clock(), step=5)
    assert result["healthy"]
    assert polls[0] == 0.0
    # tqdm's bar line has no timestamp: the last stamped line before it sets ``since``.
    assert first[-1].startswith("Loading safetensors checkpoint shards:   0% Completed | 0/2")
    assert polls[1] == pytest.approx(vllm_start_wait.vllm_start.split_line(first[-2])[0])
    assert printed == [
        "[spark-1] vLLM start, 0m05s: loading weights: driver 0/2 shards",
        "[spark-1] vLLM start, 0m10s: loading weights: driver 2/2 shards, 176.14it/s",
        "[spark-1] vLLM start, 0m15s: serving",
    ]


def test_a_follower_takes_the_leaders_verdict(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_start_wait.C, "DEFAULT_LOCAL_TMP", str(tmp_path))
    vllm_start_wait.write_verdict("g", 1_000_000.0, {"healthy": False, "reason": "head exited"})
    result, _printed, _polls = _run(
        monkeypatch, [_log([])], Clock(), step=5, group="g", leader=False
    )
    assert result == result | {"healthy": False, "reason": "head exited"}


def test_a_verdict_from_an_earlier_start_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_start_wait.C, "DEFAULT_LOCAL_TMP", str(tmp_path))
    vllm_start_wait.write_verdict("g", 100.0, {"healthy": True, "reason": ""})
    assert vllm_start_wait.read_verdict("g", 1000.0) is None
    assert vllm_start_wait.read_verdict("g", 200.0) == {"started": 100.0, "healthy": True,
                                                        "reason": ""}  # fmt: skip


def test_each_poll_asks_the_node_with_the_tasks_completion(monkeypatch):
    """The completion the wait asks for (the smoke prompt, its tokens) reaches every poll."""
    calls = []
    action = vllm_start_wait.ActionModule.__new__(vllm_start_wait.ActionModule)

    def execute(module_name, module_args, task_vars):
        calls.append((module_name, module_args))
        return {"healthy": True}

    action._execute_module = execute
    args = _args(prompt="The capital of France is", max_tokens=8, api_key="k", poll=7)
    action._poll(args, {"vllm": {"running": True}}, 12.0, {})
    assert calls == [("dgx_spark.cluster.vllm_endpoint", {
        "url": "http://127.0.0.1:8000", "api_key": "k", "model": "m", "completion": True,
        "prompt": "The capital of France is", "max_tokens": 8, "request_timeout": 60,
        "watch": ["vllm"], "timeout": 7, "fail_on_unhealthy": False,
        "baseline": {"vllm": {"running": True}}, "logs_since": 12.0})]  # fmt: skip


def test_the_action_takes_the_options_its_documentation_names():
    """ansible-test checks a module's argument spec against its documentation; nothing checks
    the action's, so this does: the shared options (plugins/doc_fragments/vllm_endpoint.py)
    and its own (plugins/modules/vllm_start_wait.py), with their types and defaults."""
    import yaml
    from ansible_collections.dgx_spark.cluster.plugins.doc_fragments import vllm_endpoint
    from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_start_wait as docs

    options = {
        **yaml.safe_load(vllm_endpoint.ModuleDocFragment.ADDRESS)["options"],
        **yaml.safe_load(vllm_endpoint.ModuleDocFragment.DOCUMENTATION)["options"],
        **yaml.safe_load(docs.DOCUMENTATION)["options"],
    }
    assert set(options) == set(vllm_start_wait.ARGUMENT_SPEC)
    for name, spec in vllm_start_wait.ARGUMENT_SPEC.items():
        assert spec["type"] == options[name]["type"], name
        assert spec.get("default") == options[name].get("default"), name
