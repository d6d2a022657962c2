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


WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
DGX_OS = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
# The public reports' first eight hex digits of each 2.28.9 build's ID; the rest is made up.
PIP_BUILD = {"path": WHEEL, "real_path": WHEEL, "size": 219_000_000,
             "build_id": "a7f420a1" + "5e" * 16, "sha256": None, "error": None}  # fmt: skip
DGX_BUILD = {"path": DGX_OS, "real_path": DGX_OS, "size": 190_000_000,
             "build_id": "c0db9360" + "17" * 16, "sha256": None, "error": None}  # fmt: skip


@pytest.mark.parametrize(
    ("host_build", "code", "library"),
    [(DGX_BUILD, 0, "host"), (PIP_BUILD, 1, None)],
)
def test_auto_weighs_the_builds_of_one_version(capsys, host_build, code, library):
    """The same 2.28.9 on both sides: DGX OS's build is taken, the wheel's own build refused."""
    args = {
        "image_versions": PAIR_IMAGE,
        "image_builds": {"spark-1": PIP_BUILD, "spark-2": PIP_BUILD},
        "host_versions": {"spark-1": "2.28.9", "spark-2": "2.28.9"},
        "host_builds": {"spark-1": host_build, "spark-2": host_build},
    }
    got, out = run_module(mod, args, capsys)
    assert got == code and out["library"] == library
    text = out.get("message") or out["msg"]
    assert "the image's NCCL 2.28.9 (219.0 MB, build a7f420a1" in text
    assert out["image_build"]["build_id"] == PIP_BUILD["build_id"]
    assert out["host_builds"]["spark-2"]["size"] == host_build["size"]
