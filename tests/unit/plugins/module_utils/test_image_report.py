"""Tests for plugins/module_utils/image_report.py: what a serving image holds, read from the
probe's answer in the simulated pair's serving image (tests/unit/fixtures/hybrid_image), and
the refusal of an image without libibverbs where the node's comm.env puts NCCL on RoCE.

The NCCL file names and versions are the ones public reports show: 2.28.9 in the pip wheel
and DGX OS's libnccl2 (vLLM issues 42354 and 41725); the comm.env lines are the ones
host_prep writes (fast_link.comm_env) with NVIDIA's two-Spark device names (SIM.md)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import image_report as ir
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    PROBE_SOURCE,
    build_info,
    classify,
    probe_request,
)
from support.captures import load_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hybrid_image"
WANTED = ["Qwen3MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"]
ROCE_ENV = (
    "# Communication environment of spark-1\n"
    "VLLM_HOST_IP=192.168.100.10\n"
    "NCCL_SOCKET_IFNAME=enp1s0f0np0\n"
    "NCCL_IGNORE_CPU_AFFINITY=1\n"
    "NCCL_NVLS_ENABLE=0\n"
    "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0\n"
    "NCCL_IB_DISABLE=0\n"
)
SIM_ENV = (
    "VLLM_HOST_IP=172.28.0.11\nNCCL_SOCKET_IFNAME=eth1\nNCCL_IGNORE_CPU_AFFINITY=1\n"
    "NCCL_NVLS_ENABLE=0\nNCCL_IB_DISABLE=1\n"
)


def probe(name="probe_report_sim_serving.json"):
    return load_json(FIXTURES / name)


def report_of(doc, image="dgx-spark/vllm-serving:current"):
    info = build_info(doc)
    checked = classify(WANTED, info["architectures"])
    return ir.build_report(doc, list(info["architectures"]), checked, image, "sha256:23f2")


def test_the_probe_asks_for_a_report_only_when_told():
    assert '"report": true' in probe_request("static", [], report=True)
    assert "report" not in probe_request("static", [])
    assert "REPORT_DPKG" in PROBE_SOURCE and "__REPORT" not in PROBE_SOURCE


def test_the_sim_serving_image_holds_vllm_torch_and_ray_and_nothing_else():
    report = report_of(probe())
    assert report["vllm"] == "0.32.0+cpu"
    assert report["torch"] == "2.13.0+cpu"
    assert report["ray"] == "2.60.0"
    assert report["absent"] == ["cuda", "nccl", "flashinfer", "fastsafetensors", "libibverbs"]
    assert report["files"] == {"libnccl": [], "libibverbs": []}
    # A CPU torch has no NCCL: reported as a note, not an error.
    assert "_nccl_version" in report["notes"]["torch_nccl_error"]
    assert report["wanted"] == {
        "Qwen3MoeForCausalLM": "present",
        "Qwen3_5MoeForConditionalGeneration": "present",
    }
    assert "Qwen3_5MoeForConditionalGeneration" in report["architectures"]
    assert len(report["architectures"]) > 100


def test_the_line_names_every_item_and_the_registry():
    report = report_of(probe())
    line = report["summary"]
    assert line == ir.report_line(report)
    assert line.startswith(
        "vLLM 0.32.0+cpu, torch 2.13.0+cpu, CUDA absent, NCCL absent, Ray 2.60.0"
    )
    assert "libibverbs absent" in line
    assert "Qwen3_5MoeForConditionalGeneration present" in line


def test_libibverbs_comes_from_the_dpkg_status_and_its_files():
    report = report_of(probe("probe_report_sim_serving_libibverbs.json"))
    assert report["libibverbs"] == {"version": "44.0-2", "source": "the libibverbs1 package"}
    assert report["files"]["libibverbs"] == ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"]
    assert "libibverbs" not in report["absent"]


def test_libibverbs_without_a_package_comes_from_its_file():
    found = copy.deepcopy(probe("probe_report_sim_serving_libibverbs.json")["report"])
    found["dpkg"] = []
    assert ir.libibverbs_of(found) == {
        "version": "1.14.44.0",
        "source": "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0",
    }


def test_a_removed_package_is_not_installed():
    stanza = "Package: libibverbs1\nStatus: deinstall ok config-files\nVersion: 44.0-2\n"
    assert ir.dpkg_versions([stanza]) == {}
    assert ir.dpkg_versions(
        [stanza.replace("deinstall ok config-files", "install ok installed")]
    ) == {"libibverbs1": "44.0-2"}


@pytest.mark.parametrize(
    ("found", "nccl"),
    [
        # torch's own answer wins: it is the library torch runs.
        ({"torch_nccl": "2.28.9", "distributions": {"nvidia-nccl-cu13": "2.30.7"}},
         {"version": "2.28.9", "source": "torch.cuda.nccl.version()"}),
        # The pip wheel's libnccl.so.2 carries no version in its name: the wheel's metadata does.
        ({"distributions": {"nvidia-nccl-cu13": "2.28.9"},
          "library_files": {"/v/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2":
                            "/v/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"}},
         {"version": "2.28.9", "source": "the nvidia-nccl-cu13 package"}),
        ({"library_files": {"/usr/lib/aarch64-linux-gnu/libnccl.so.2":
                            "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"}},
         {"version": "2.28.9", "source": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"}),
        ({"dpkg": ["Package: libnccl2\nStatus: install ok installed\nVersion: 2.28.9-1+cuda13.0"]},
         {"version": "2.28.9-1+cuda13.0", "source": "the libnccl2 package"}),
        ({"torch_nccl_error": "AttributeError: module 'torch._C' has no attribute '_nccl_version'"},
         None),
    ],
)  # fmt: skip
def test_the_images_nccl_is_what_torch_says_else_the_wheel_file_or_package(found, nccl):
    assert ir.nccl_of(found) == nccl


def test_the_build_the_ranks_map_stands_beside_the_version():
    """Status adds the build of the image's libnccl the ranks map (read where they run): the
    report's line names it in eight hex digits, or the file's sha256 where it has no build ID."""
    found = {"distributions": {"nvidia-nccl-cu13": "2.28.9"}}
    report = report_of({**probe(), "report": {**probe()["report"], **found}})
    wheel = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
    build = {"path": wheel, "real_path": wheel, "size": 219_000_000,
             "build_id": "a7f420a1" + "5e" * 16, "sha256": None, "error": None}  # fmt: skip
    shown = ir.with_nccl_build(report, build)
    assert shown["nccl"] == {
        "version": "2.28.9",
        "source": "the nvidia-nccl-cu13 package",
        "build": {k: build[k] for k in ("path", "real_path", "size", "build_id", "sha256")},
    }
    assert "NCCL 2.28.9 (build a7f420a1), Ray 2.60.0" in shown["summary"]
    assert "build" not in report["nccl"] and "NCCL 2.28.9, Ray" in report["summary"]
    hashed = ir.with_nccl_build(report, {**build, "build_id": None, "sha256": "ab" * 32})
    assert "NCCL 2.28.9 (build sha256:abababab)" in hashed["summary"]
    # No NCCL in the image (the sim's CPU build) or no build read: the report as it was.
    sim = report_of(probe())
    assert ir.with_nccl_build(sim, build) is sim
    assert ir.with_nccl_build(report, None) is report


def test_a_report_needs_the_probes_report():
    doc = probe()
    del doc["report"]
    with pytest.raises(ValueError, match="report=true"):
        ir.build_report(doc, [])


@pytest.mark.parametrize(
    ("text", "roce"),
    [
        (ROCE_ENV, True),
        (SIM_ENV, False),
        (ROCE_ENV.replace("NCCL_IB_DISABLE=0", "NCCL_IB_DISABLE=1"), False),
        ("", False),
    ],
)
def test_the_roce_path_is_what_comm_env_configures(text, roce):
    assert ir.roce_configured(ir.parse_env_file(text)) is roce


def test_an_image_without_libibverbs_is_refused_on_the_roce_path_naming_the_library():
    report = report_of(probe())
    (message,) = ir.refusals(report, ir.parse_env_file(ROCE_ENV), "spark-1")
    assert message.startswith(
        "spark-1: the serving image dgx-spark/vllm-serving:current has no libibverbs"
    )
    assert "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0" in message
    assert "libibverbs1" in message


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("probe_report_sim_serving_libibverbs.json", ROCE_ENV),  # it has the library
        ("probe_report_sim_serving.json", SIM_ENV),  # sockets only: nothing loads it
        ("probe_report_sim_serving.json", None),  # no comm.env yet: nothing to judge
    ],
)
def test_an_image_is_not_refused_where_the_library_is_there_or_not_needed(name, env):
    comm_env = None if env is None else ir.parse_env_file(env)
    assert ir.refusals(report_of(probe(name)), comm_env, "spark-1") == []
