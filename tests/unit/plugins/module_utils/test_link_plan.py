"""Tests for plugins/module_utils/link_plan.py: when host_prep runs the link benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_plan as lp
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"
TWINS = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.11/24"},
]


def test_serving_containers_from_docker_host_info():
    containers = json.loads(tool_output(FIXTURES / "docker_host_info_containers.json"))
    # Running and named dgx-spark-vllm, or running and labelled; not Ray, not a created one.
    assert lp.serving_containers(containers, "dgx-spark-vllm") == [
        "capture-serving-standin", "dgx-spark-vllm",
    ]  # fmt: skip
    # The name given is what counts besides the label: an unlabelled container of that name.
    assert lp.serving_containers(containers, "capture-other") == [
        "capture-other", "capture-serving-standin", "dgx-spark-vllm",
    ]  # fmt: skip
    assert lp.serving_containers([], "x") == [] and lp.serving_containers(None, "x") == []


SKIP = {"valid": True, "reason": "skipped: link-check passed 2026-11-30T06:00:00Z (3 h ago)"}


def nodes(stamped=True, serving=(), reason="runs: no stamp"):
    first = SKIP if stamped else {"valid": False, "reason": reason}
    return {
        "spark-1": {"stamp": first, "serving": list(serving)},
        "spark-2": {"stamp": SKIP, "serving": []},
    }


@pytest.mark.parametrize(
    ("mode", "hardware", "state", "run", "words"),
    [
        ("auto", True, nodes(stamped=False), True, "spark-1: runs: no stamp"),
        ("auto", True, nodes(), False, "spark-1: skipped: link-check passed 2026-11-30"),
        ("auto", True, nodes(stamped=False, reason="runs: mtu changed from 9000 to 1500"), True,
         "spark-1: runs: mtu changed from 9000 to 1500"),
        ("auto", True, nodes(stamped=False, serving=["dgx-spark-vllm"]), False,
         "but dgx-spark-vllm on spark-1 holds the GPUs"),
        ("auto", True, nodes(serving=["dgx-spark-vllm"]), False, "skipped: link-check passed"),
        ("always", True, nodes(), True, "host_prep_link_check=always"),
        ("always", True, nodes(serving=["dgx-spark-vllm"]), True,
         "while dgx-spark-vllm on spark-1 holds the GPUs (asked for)"),
        ("never", True, nodes(stamped=False), False, "host_prep_link_check=never"),
        ("auto", False, nodes(stamped=False), False, "hardware-only"),
    ],
)  # fmt: skip
def test_plan_link_check(mode, hardware, state, run, words):
    plan = lp.plan_link_check(mode, hardware, state)
    assert plan["run"] is run
    assert words in plan["reason"], plan["reason"]


def test_plan_link_check_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="host_prep_link_check"):
        lp.plan_link_check("sometimes", True, nodes())
