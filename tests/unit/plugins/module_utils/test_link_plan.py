"""Tests for plugins/module_utils/link_plan.py: when host_prep runs the link benchmarks, and the
record a node keeps of its last passed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_plan as lp
from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import (
    digest,
    stage_record,
)
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


SETTINGS = {
    "links": TWINS,
    "mtu": 9000,
    "rdma_min_gbps": 90.0,
    "nccl": {"check": "torch", "size_mib": 4096, "min_busbw_gbps": 21.875},
    "kernel": "6.11.0-1016-nvidia",
}


def nodes(record=True, serving=(), settings=None, **other):
    settings = SETTINGS if settings is None else settings
    made = stage_record(SETTINGS, checked_at="2026-11-30T06:00:00Z", results=["RDMA 111.74"])
    return {
        "spark-1": {"settings": settings, "record": made if record else None,
                    "serving": list(serving)},
        "spark-2": {"settings": SETTINGS, "record": made, "serving": []},
        **other,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "hardware", "state", "run", "words"),
    [
        ("auto", True, nodes(record=False), True, "spark-1: no passed link check recorded"),
        ("auto", True, nodes(), False, "unchanged since the passed link check of 2026-11-30"),
        ("auto", True, nodes(settings={**SETTINGS, "mtu": 1500}), True,
         "spark-1: changed since the last passed check: mtu"),
        ("auto", True, nodes(settings={**SETTINGS, "kernel": "6.14.0-1015-nvidia"}), True,
         "changed since the last passed check: kernel"),
        ("auto", True, nodes(record=False, serving=["dgx-spark-vllm"]), False,
         "but dgx-spark-vllm on spark-1 holds the GPUs"),
        ("auto", True, nodes(serving=["dgx-spark-vllm"]), False, "unchanged since"),
        ("always", True, nodes(), True, "host_prep_link_check=always"),
        ("always", True, nodes(serving=["dgx-spark-vllm"]), True,
         "while dgx-spark-vllm on spark-1 holds the GPUs (asked for)"),
        ("never", True, nodes(record=False), False, "host_prep_link_check=never"),
        ("auto", False, nodes(record=False), False, "hardware-only"),
    ],
)  # fmt: skip
def test_plan_link_check(mode, hardware, state, run, words):
    plan = lp.plan_link_check(mode, hardware, state)
    assert plan["run"] is run
    assert words in plan["reason"], plan["reason"]


def test_plan_link_check_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="allowed: auto, always, never"):
        lp.plan_link_check("sometimes", True, nodes())


def test_link_record_round_trip():
    record = stage_record(SETTINGS, checked_at="2026-11-30T06:00:00Z", results=[])
    assert lp.read_link_record(json.dumps(record)) == record
    assert record["inputs"] == SETTINGS and record["checked_at"] == "2026-11-30T06:00:00Z"
    assert record["digest"] == digest(json.loads(json.dumps(SETTINGS)), 16)
    # An older collection's record (settings and fingerprint, no inputs) reads as none: the
    # check is due once, as on a first deploy.
    older = {"format": 1, "settings": SETTINGS, "fingerprint": "f" * 16, "checked_at": "x"}
    for text in ("", None, "{", "[]", '{"format": 2, "inputs": {}}', '{"format": 1}',
                 json.dumps(older)):  # fmt: skip
        assert lp.read_link_record(text) is None
