"""plugins/module_utils/ray_status.py on `ray status` output captured on the simulated pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import ray_status
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"


@pytest.mark.parametrize(
    ("fixture", "alive", "gpus_used", "gpus_total"),
    [
        # vLLM's Ray executor holds both GPUs in its placement group.
        ("ray_status_placement_group.txt", 2, 2.0, 2.0),
        # `ray status -v` (the logs archive): per-node sections must not replace the totals.
        ("ray_status_verbose.txt", 2, 0.0, 2.0),
        # The worker's Ray container stopped: one node left.
        ("ray_status_one_node.txt", 1, None, 1.0),
    ],
)
def test_alive_nodes_and_gpus(fixture, alive, gpus_used, gpus_total):
    parsed = ray_status.parse(tool_output(FIXTURES / fixture))
    assert parsed["parsed"]
    assert parsed["alive_nodes"] == alive
    assert len(parsed["node_ids"]) == alive
    assert parsed["pending_nodes"] == 0
    assert parsed["gpus_total"] == gpus_total
    if gpus_used is not None:
        assert parsed["gpus_used"] == gpus_used
    assert parsed["resources"]["CPU"]["total"] > 0
    assert parsed["resources"]["memory"]["unit"] == "GiB"


@pytest.mark.parametrize(
    "text",
    ["", "ConnectionError: Could not find any running Ray instance.\n", "Error: token missing"],
)
def test_text_without_node_status_is_not_parsed(text):
    parsed = ray_status.parse(text)
    assert not parsed["parsed"]
    assert parsed["alive_nodes"] == 0


def test_a_placement_group_left_waiting_is_a_demand():
    # The worker's Ray container stopped while vLLM's group asked for both GPUs.
    text = tool_output(FIXTURES / "ray_status_one_node.txt")
    assert ray_status.parse(text)["demands"] == [
        "{'GPU': 1.0} * 2 (PACK): 1+ pending placement groups"
    ]
    assert ray_status.failed_start_view(text, 2) == (
        "Ray then: 1 of 2 nodes alive, 0 of 1 GPUs in use; waiting for resources: "
        "{'GPU': 1.0} * 2 (PACK): 1+ pending placement groups"
    )


def test_a_group_that_holds_its_gpus_waits_for_nothing():
    text = tool_output(FIXTURES / "ray_status_placement_group.txt")
    assert ray_status.parse(text)["demands"] == []
    assert ray_status.failed_start_view(text, 2) == (
        "Ray then: 2 of 2 nodes alive, 2 of 2 GPUs in use"
    )


def test_an_unreadable_status_is_said_so_with_its_last_line():
    said = ray_status.failed_start_view("boom\nConnectionError: no Ray here\n", 2)
    assert said == "Ray then: its status was not readable (ConnectionError: no Ray here)"
    assert ray_status.failed_start_view("", 2).endswith("(no output)")
