"""vllm_health: when a serving group serves, stopped, or was refused, on real vLLM logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_health
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_serve"
RUN = {"running": True, "restarts": 0, "started_at": "2026-11-30T06:00:00.1Z"}


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ({"vllm": RUN}, ""),
        ({}, "vllm is gone"),
        ({"vllm": {**RUN, "running": False}}, "vllm exited"),
        ({"vllm": {**RUN, "restarts": 1}}, "vllm restarted"),
        ({"vllm": {**RUN, "started_at": "2026-11-30T06:00:09.5Z"}}, "vllm restarted"),
    ],
)
def test_container_failure(now, expected):
    assert vllm_health.container_failure({"vllm": RUN}, now) == expected


def test_container_failure_names_every_container():
    before = {"a": RUN, "b": RUN}
    now = {"a": {**RUN, "running": False}}
    assert vllm_health.container_failure(before, now) == "a exited; b is gone"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        # `vllm serve ... --max-model-len -5` in the sim's donor image (vLLM 0.32.0 CPU).
        (
            "refusal_max_model_len.log",
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
            " | max_model_len | Input should be greater than or equal to -1"
            " [type=greater_than_equal, input_value=-5, input_type=int]",
        ),
        # A model path that does not exist in the container.
        (
            "refusal_missing_model.log",
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name'"
            " or 'namespace/repo_name': '/m/tiny-qwen3-moe'. Use `repo_type` argument if needed.",
        ),
    ],
)
def test_error_excerpt_on_real_refusals(log, expected):
    assert vllm_health.error_excerpt(tool_output(FIXTURES / log)) == expected


def test_error_excerpt_skips_warnings_and_keeps_error_lines():
    text = (
        "(APIServer pid=1) WARNING 11-30 06:07:10 [x.py:1] Found ulimit of 20000, error maybe\n"
        "(APIServer pid=1) ERROR 11-30 06:07:11 [core.py:9] EngineCore failed to start.\n"
        "(APIServer pid=1) INFO 11-30 06:07:12 [x.py:2] shutting down\n"
    )
    assert vllm_health.error_excerpt(text) == "EngineCore failed to start."


def test_error_excerpt_is_trimmed():
    text = "Traceback (most recent call last):\n" + "ValueError: " + "x" * 2000 + "\n"
    excerpt = vllm_health.error_excerpt(text, max_chars=100)
    assert len(excerpt) == 100 and excerpt.startswith("ValueError: x") and excerpt.endswith("...")


def test_error_excerpt_of_a_clean_log_is_empty():
    assert vllm_health.error_excerpt("(APIServer pid=1) INFO 11-30 06:07:12 [x.py:2] ok\n") == ""


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, {"usage": {"completion_tokens": 1}, "choices": [{"text": "a"}]}, True),
        (200, {"usage": {"completion_tokens": 0}, "choices": [{"text": ""}]}, False),
        (200, {"usage": {"completion_tokens": 1}, "choices": []}, False),
        (401, {"error": "unauthorized"}, False),
        (200, None, False),
    ],
)
def test_completion_ok(status, body, ok):
    assert vllm_health.completion_ok(status, body) is ok


def test_a_ranks_own_exception_comes_first_with_its_node():
    # A real failed start on the sim's pair (Ray backend, TP 2): the worker's shard had a
    # broken safetensors header. The driver then raised while shutting the group down.
    excerpt = vllm_health.error_excerpt(tool_output(FIXTURES / "loader_error_ray_worker.log"))
    first, *rest = excerpt.split(" | ")
    assert first == (
        "the rank on 172.30.241.12: safetensors._safetensors_rust.SafetensorError:"
        " Error while deserializing header: header too large"
    )
    assert rest[-1].startswith("RuntimeError: Engine core initialization failed.")
    assert not any("\x1b" in part or "RayWorkerProc pid" in part for part in rest)


def test_a_rank_on_the_head_has_no_address():
    text = (
        "(EngineCore pid=9) ERROR 12-01 04:19:16 [core.py:1] ray.exceptions.RayTaskError(OSError):"
        " ray::RayWorkerProc.initialize_worker() (pid=187, actor_id=4aeb)\n"
        "(EngineCore pid=9) ERROR 12-01 04:19:16 [core.py:1] OSError: [Errno 5] I/O error\n"
        "RuntimeError: Engine core initialization failed.\n"
    )
    assert vllm_health.error_excerpt(text).startswith("a rank: OSError: [Errno 5] I/O error")


def test_rays_own_info_lines_are_not_part_of_an_exception():
    text = (
        "OSError: [Errno 5] I/O error\n"
        "2026-12-01 04:27:01,479\tINFO worker.py:1691 -- Using address 172.30.241.11:6379\n"
        "2026-12-01 04:27:01,488\tINFO worker.py:2038 -- Connected to Ray cluster.\n"
    )
    assert vllm_health.error_excerpt(text) == "OSError: [Errno 5] I/O error"
