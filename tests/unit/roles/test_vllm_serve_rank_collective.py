"""The value check of roles/vllm_serve/files/rank_collective.py, without torch.

The script counts the elements that differ from the expected sum with torch; what it decides
from that count is :func:`value_check`, a pure function tested here with a right sum and a
wrong one, and carried to the controller's verdict (module_utils/rank_collective.decide)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import rank_collective as rc

SCRIPT = Path(__file__).resolve().parents[3] / "roles/vllm_serve/files/rank_collective.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("rank_collective_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("world", "expected"), [(2, 3.0), (3, 6.0), (4, 10.0)])
def test_the_expected_sum_is_one_plus_two_up_to_the_world(script, world, expected):
    assert script.expected_sum(world) == expected


def test_a_right_sum_passes_with_no_message(script):
    assert script.value_check(1, 2, 0) == {"expected": 3.0, "wrong": 0, "got": None, "message": ""}


def test_a_wrong_sum_names_the_rank_what_it_read_and_what_it_should_have(script):
    verdict = script.value_check(1, 2, 16777216, 2.0)
    assert verdict["wrong"] == 16777216
    assert verdict["got"] == 2.0
    assert verdict["message"] == (
        "rank 1 of 2: 16777216 values after the all_reduce read 2.0 instead of 3"
    )


def result_line(script, rank: int, wrong: int, got: float | None) -> str:
    """The line main() prints, with the fields decide() reads (made here: torch is absent)."""
    verdict = script.value_check(rank, 2, wrong, got)
    line = {"check": "rank_collective", "op": "all_reduce", "rank": rank, "world_size": 2,
            "backend": "gloo", "nccl_version": None, "nccl_library": "",
            "wrong": verdict["wrong"], "wrong_message": verdict["message"],
            "busbw_gbps": 0.4, "elapsed_s": 3.1}  # fmt: skip
    return script.MARK + json.dumps(line, sort_keys=True) + "\n"


def test_the_controller_refuses_the_rank_that_summed_wrong_and_only_it(script):
    nodes = {
        "spark-head": {"output": result_line(script, 0, 0, None), "rc": 0},
        "spark-worker": {"output": result_line(script, 1, 5, 2.0), "rc": 0},
    }
    verdict = rc.decide(nodes, image="img", backend="gloo")
    assert verdict["passed"] is False
    assert verdict["failed"] == ["spark-worker"]
    refused = [line for line in verdict["message"].splitlines() if "wrong values" in line]
    assert len(refused) == 1
    assert refused[0].startswith("spark-worker: the two-rank collective in img: 5 wrong values")


def test_the_controller_passes_when_every_rank_summed_right(script):
    nodes = {
        "spark-head": {"output": result_line(script, 0, 0, None), "rc": 0},
        "spark-worker": {"output": result_line(script, 1, 0, None), "rc": 0},
    }
    verdict = rc.decide(nodes, image="img", backend="gloo")
    assert verdict["passed"] is True and verdict["failed"] == []


def test_main_uses_the_value_check_on_the_expected_sum(script):
    # main() needs torch and a peer; what it must not do is compute its own sum or verdict.
    source = SCRIPT.read_text()
    body = source[source.index("def main(") :]
    assert "expected = expected_sum(world)" in body
    assert "value_check(args.rank, world, wrong, first_wrong)" in body
    assert '"wrong": verdict["wrong"]' in body
