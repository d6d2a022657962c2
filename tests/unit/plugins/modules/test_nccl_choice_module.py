"""Tests for plugins/modules/nccl_choice.py, run as Ansible runs it: what preflight registers
and the failure that stops the run."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.modules import nccl_choice as mod
from support.modules import run_module

PAIR_IMAGE = {"spark-1": "2.28.9", "spark-2": "2.28.9"}


@pytest.mark.parametrize("check_mode", [False, True])
def test_auto_takes_the_nodes_newer_nccl(capsys, check_mode):
    args = {
        "image_versions": PAIR_IMAGE,
        "host_versions": {"spark-1": "2.30.7", "spark-2": "2.30.7"},
    }
    code, out = run_module(mod, args, capsys, check_mode)
    assert code == 0 and out["changed"] is False
    assert out["library"] == "host" and out["pending"] is False
    assert out["message"].startswith("spark_nccl_library: auto chose the nodes' NCCL 2.30.7")


def test_auto_refusal_fails_the_task_citing_the_reports(capsys):
    args = {
        "image_versions": PAIR_IMAGE,
        "host_versions": {"spark-1": "2.28.9", "spark-2": "2.28.9"},
    }
    code, out = run_module(mod, args, capsys)
    assert code == 1 and out["failed"] is True and out["library"] is None
    assert "https://github.com/vllm-project/vllm/issues/42354" in out["msg"]


def test_an_explicit_image_in_the_range_warns_and_goes_on(capsys):
    args = {"mode": "image", "image_versions": PAIR_IMAGE, "host_versions": {"spark-1": ""}}
    code, out = run_module(mod, args, capsys)
    assert code == 0 and out["library"] == "image"
    assert out["warned"][0].startswith("the ranks load the image's NCCL 2.28.9: NCCL 2.28.x")
