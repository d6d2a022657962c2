"""The image probes' answers captured on a lent GPU machine (an H100 with a CUDA 13 PyTorch,
tools/gpu_probes.py; each fixture's header says where and how), read by the same code that
reads them from a Spark: what vLLM's memory check will see, the image report, and the NCCL
probe's versions and builds. An x86-64 machine: its NCCL builds are not the Sparks' aarch64
ones, so the known-build table does not name them."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.dgx_spark.cluster.plugins.module_utils import image_report as ir
from ansible_collections.dgx_spark.cluster.plugins.module_utils import nccl_choice as nc
from ansible_collections.dgx_spark.cluster.plugins.module_utils import spark_memory as sm
from support.captures import load_json, tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
WHEEL = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"


def test_the_memory_probe_reads_the_device_torch_sees():
    probe = sm.parse_vllm_probe(tool_output(FIXTURES / "vllm_serve/memory_probe_h100.txt"))
    # No vLLM in that Python: torch's figure, the device's own (not an integrated GPU).
    assert probe["source"] == "torch.cuda.mem_get_info" and probe["integrated"] is False
    assert probe["device"] == "NVIDIA H100 80GB HBM3"
    checked = sm.check_vllm_memory({"h100": probe}, 0.7)
    assert checked["passed"] and checked["measured"]
    assert checked["nodes"]["h100"]["fits"] == 0.99
    assert (
        "h100: vLLM sees 78.66 GiB free of 79.18 GiB (torch.cuda.mem_get_info"
        in (checked["message"])
    )


def test_the_image_report_reads_torchs_cuda_and_nccl_and_finds_the_library_files():
    doc = load_json(FIXTURES / "hybrid_image/probe_report_h100_torch.json")
    report = ir.build_report(doc, [], {}, "torch-h100", "sha256:0")
    assert (report["torch"], report["cuda"]) == ("2.11.0", "13.0")
    assert report["nccl"] == {"version": "2.28.9", "source": "torch.cuda.nccl.version()"}
    assert report["files"]["libnccl"] == [WHEEL, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"]
    assert report["vllm"] is None and "vllm" in report["absent"]


def _nccl_answer() -> dict:
    text = tool_output(FIXTURES / "hybrid_image/nccl_probe_h100_torch.txt")
    line = [x for x in text.splitlines() if x.startswith("dgx-spark-nccl: ")][-1]
    return json.loads(line.removeprefix("dgx-spark-nccl: "))


def test_the_nccl_probe_names_the_file_torch_maps_and_both_builds():
    answer = _nccl_answer()
    assert answer["version"] == "2.28.9"
    image = nc.normal_build(answer["library"])
    assert answer["library"]["how"] == "mapped by torch" and image["path"] == WHEEL
    assert nc.from_wheel(image) and image["size"] == 217995896
    assert image["build_id"].startswith("9fcf74d9")
    node = nc.normal_build(answer["node"])
    assert node["real_path"].endswith("libnccl.so.2.28.3")
    assert nc.identity(node) != nc.identity(image)


def test_auto_refuses_the_wheels_build_against_an_older_system_nccl():
    """The machine's pair of libraries as auto weighs them: the wheel's 2.28.9 in the range with
    hang reports, a system 2.28.3 (older, also in the range): nothing known good on offer."""
    answer = _nccl_answer()
    decided = nc.choose(
        answer["version"], {"h100": "2.28.3"}, "auto", answer["library"], {"h100": answer["node"]}
    )
    assert decided["passed"] is False and decided["library"] is None
    assert "9fcf74d9" in decided["message"], decided["message"]
