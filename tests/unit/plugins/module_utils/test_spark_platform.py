"""Tests for plugins/module_utils/spark_platform.py on nvidia-smi output captured on an H200
machine or published from DGX Sparks (tests/unit/fixtures/host_prep/nvidia_smi_*.txt, described
in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import spark_platform as sp
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"


def fixture(name: str) -> str:
    return tool_output(FIXTURES / name)


def test_parse_gb10():
    assert sp.parse_gpus(fixture("nvidia_smi_gb10.txt")) == [
        {"name": "NVIDIA GB10", "driver": "580.173.02"}
    ]
    assert sp.parse_gpus("NVIDIA GB10\n") == [{"name": "NVIDIA GB10", "driver": ""}]


@pytest.mark.parametrize(
    ("name", "expected", "passed", "words"),
    [
        ("nvidia_smi_gb10.txt", 1, True, "spark-1: 1 x NVIDIA GB10, driver 580.173.02"),
        ("nvidia_smi_gb10.txt", 2, False, "1 GPUs, spark_gpus says 2"),
        ("nvidia_smi_h200x2.txt", 2, False, "2 x NVIDIA H200, driver 580.159.04: not a GB10"),
        ("nvidia_smi_h200x2.txt", 1, False, "2 GPUs, spark_gpus says 1"),
    ],
)
def test_check_gpus(name, expected, passed, words):
    result = sp.check_gpus(fixture(name), expected, "spark-1")
    assert result["passed"] is passed
    assert words in result["message"], result["message"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "nvidia-smi lists no GPU"),
        (fixture("nvidia_smi_gb10_header.txt"), "a CSV header"),
        (fixture("nvidia_smi_h200x2_header.txt"), "a CSV header"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "NVIDIA-SMI has failed",
        ),
    ],
)
def test_check_gpus_without_gpus(text, words):
    result = sp.check_gpus(text, 1)
    assert result["passed"] is False and words in result["message"]


@pytest.mark.parametrize(
    ("kernel", "count"),
    [
        ("7.0.0-1019-nvidia", 1),
        ("7.0.0-31-generic", 1),
        ("7.0.0-30-generic", 1),
        ("7.0.0-29-generic", 0),
        ("7.0.0-310-generic", 0),
        ("6.17.0-1008-nvidia", 1),
        ("6.17.0-1008-nvidia-64k", 0),
        ("6.17.0-1032-nvidia", 0),
        ("6.17.0-1031-nvidia", 0),
        ("7.0.0-10190-nvidia", 0),
        ("6.18.44-fc-v657-gpu", 0),
        ("", 0),
    ],
)
def test_known_bad_kernels(kernel, count):
    assert len(sp.known_bad("kernel", kernel)) == count


def test_every_table_entry_has_a_reason_and_a_source():
    for entry in sp.KNOWN_BAD:
        assert entry["component"] in ("kernel", "driver")
        assert len(entry["reason"]) > 40 and entry["sources"]
        assert all(
            s.startswith(("github.com/", "forums.developer.nvidia.com/", "conselara.dev/"))
            for s in entry["sources"]
        )
        assert set(entry) <= {"component", "match", "reason", "sources", "breaks"}


def test_the_kho_entries_name_the_cause_and_the_fix():
    for kernel in ("7.0.0-1019-nvidia", "7.0.0-30-generic"):
        (entry,) = sp.known_bad("kernel", kernel)
        assert "kho=off" in entry["reason"] and "KHO" in entry["reason"]
        assert (
            "github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/issues/259"
            in (entry["sources"])
        )
    (entry,) = sp.known_bad("kernel", "7.0.0-1019-nvidia")
    assert "github.com/NVIDIA/NV-Kernels/pull/590" in entry["sources"]


def test_an_entry_that_breaks_something_else_says_what():
    (warning,) = sp.platform_warnings("6.17.0-1008-nvidia", ["580.126.09"], "spark-1")
    assert warning.startswith(
        "spark-1: kernel 6.17.0-1008-nvidia has public reports of breaking the GPU driver on "
        "Sparks: after the DGX OS 7.4.0 update"
    )
    assert "forums.developer.nvidia.com/t/root-cause-analysis" in warning
    (warning,) = sp.platform_warnings("7.0.0-30-generic", [], "spark-1")
    assert "has public reports of breaking RDMA/NCCL on Sparks" in warning


def test_platform_warnings_name_the_node_the_release_and_the_reason():
    (warning,) = sp.platform_warnings("7.0.0-1019-nvidia", ["580.173.02"], "spark-2")
    assert warning.startswith("spark-2: kernel 7.0.0-1019-nvidia has public reports")
    assert "ibv_reg_mr_iova2" in warning and "6.17.0-1032-nvidia" in warning
    assert sp.platform_warnings("6.17.0-1032-nvidia", "580.173.02") == []
    table = ({"component": "driver", "match": r"580\.142", "reason": "r" * 41, "sources": ("x",)},)
    assert sp.platform_warnings("6.17.0-1032-nvidia", ["580.142"], table=table)[0].startswith(
        "driver 580.142"
    )


@pytest.mark.parametrize(
    ("driver", "count"),
    [
        # 590.44.01 and 590.48.01: 590-branch releases as nvidia-smi prints driver_version.
        ("590.44.01", 1),
        ("590.48.01", 1),
        ("590.12", 1),
        ("580.173.02", 0),
        ("580.142", 0),
        ("595.71.05", 0),
        ("5900.1", 0),
        ("1590.48.01", 0),
        ("590", 0),
        ("", 0),
    ],
)
def test_known_bad_drivers(driver, count):
    assert len(sp.known_bad("driver", driver)) == count


def test_a_590_driver_read_from_nvidia_smi_warns_about_cuda_graphs():
    # The line nvidia-smi --query-gpu=name,driver_version --format=csv,noheader prints, with
    # the 580.173.02 of nvidia_smi_gb10.txt swapped for a 590-branch release.
    text = fixture("nvidia_smi_gb10.txt").replace("580.173.02", "590.48.01")
    result = sp.check_gpus(text, 1, "spark-1")
    assert result["passed"] is True and "driver 590.48.01" in result["message"]
    drivers = [g["driver"] for g in result["gpus"]]
    (warning,) = sp.platform_warnings("6.17.0-1032-nvidia", drivers, "spark-1")
    assert warning.startswith(
        "spark-1: driver 590.48.01 has public reports of breaking vLLM's CUDA graphs on Sparks:"
    )
    assert "deadlock" in warning and "580 branch" in warning
    assert "(see conselara.dev/notes/dgx-spark-gb10-hardware-reference/)" in warning
    # The same Spark on the 580 driver it was captured with: nothing to warn about.
    gpus = sp.parse_gpus(fixture("nvidia_smi_gb10.txt"))
    assert sp.platform_warnings("6.17.0-1032-nvidia", [g["driver"] for g in gpus]) == []


def test_known_bad_refuses_an_unknown_component():
    with pytest.raises(ValueError, match="kernel or driver|one of kernel, driver"):
        sp.known_bad("firmware", "1")
