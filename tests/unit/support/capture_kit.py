"""What each file of the capture kit's archive (playbooks/capture.yml, the operate role's
tasks/capture*.yml) replaces: the fixture under tests/unit/fixtures that stands in for it today,
the parser in plugins/module_utils that the unit tests hand that fixture to, and the test.

An archive holds one folder per node; in it, one file per capture named as ``name`` (a shell
pattern where the file names a netdev, a RoCE device or a peer), each starting with its ``#|``
header, and two files that replace no fixture: ``images.json`` (with ``images.json.source``)
and ``captures.json`` (what was captured, absent or held back, and why).

``shows`` says what a parsed capture of a working tool must hold (None: parsing it is the check).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODULE_UTILS = "ansible_collections.dgx_spark.cluster.plugins.module_utils"
# The archive's files that replace no fixture.
CONTEXT = ("captures.json", "images.json", "images.json.source")


@dataclass(frozen=True)
class Capture:
    name: str
    command: str
    runs_in: str
    fixture: str
    parser: str
    test: str
    shows: Callable[[Any], bool] | None = None


CAPTURES = (
    Capture(
        "ibdev2netdev.txt", "ibdev2netdev", "roles/host_prep/tasks/validate.yml",
        "host_prep/ibdev2netdev_port1.txt", "link_checks.parse_ibdev2netdev",
        "tests/unit/plugins/module_utils/test_cx7_ports.py", lambda entries: len(entries) > 0,
    ),
    Capture(
        "ethtool_*.txt", "ethtool <netdev>", "roles/host_prep/tasks/verify.yml",
        "host_prep/ethtool_spark_200g_speed.txt", "link_checks.parse_ethtool",
        "tests/unit/plugins/module_utils/test_link_checks.py",
    ),
    Capture(
        "nvidia_smi_gpus.txt", "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader",
        "roles/host_prep/tasks/validate.yml", "host_prep/nvidia_smi_gb10.txt",
        "spark_platform.parse_gpus", "tests/unit/plugins/module_utils/test_spark_platform.py",
        lambda gpus: len(gpus) > 0 and all(gpu["driver"] for gpu in gpus),
    ),
    Capture(
        "nvidia_smi_compute_apps.txt",
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits",
        "roles/vllm_serve/tasks/memory.yml", "vllm_serve/nvidia_smi_compute_apps_llama.txt",
        "spark_memory.parse_compute_apps", "tests/unit/plugins/module_utils/test_spark_memory.py",
    ),
    Capture(
        "meminfo.txt", "/proc/meminfo", "roles/vllm_serve/tasks/memory.yml",
        "vllm_serve/meminfo_spark_idle.txt", "spark_memory.parse_meminfo",
        "tests/unit/plugins/module_utils/test_spark_memory.py",
        lambda fields: "MemTotal" in fields and "MemAvailable" in fields,
    ),
    Capture(
        "ib_write_bw_*_to_*.txt", "ib_write_bw -d <roce> ... <peer twin>",
        "roles/host_prep/tasks/verify_rdma.yml", "host_prep/ib_write_bw_spark_rocep1s0f1.txt",
        "link_checks.parse_ib_write_bw", "tests/unit/plugins/module_utils/test_link_checks.py",
        lambda parsed: parsed["bw_average_gbps"] > 0,
    ),
    Capture(
        "ib_write_bw_server_*.txt", "ib_write_bw -d <roce> ... (the peer's server)",
        "roles/host_prep/tasks/verify_rdma.yml", "host_prep/ib_read_bw_memlock_64k.txt",
        "link_checks.ib_write_bw_refusal", "tests/unit/plugins/module_utils/test_link_checks.py",
    ),
    Capture(
        "nccl_check_torch.txt", "torchrun ... nccl_allgather_busbw.py --all-ranks",
        "roles/host_prep/tasks/verify_nccl_torch.yml",
        "host_prep/busbw_json_h200x2_socket_twins.txt", "link_checks.parse_busbw_json",
        "tests/unit/plugins/module_utils/test_link_checks.py",
        lambda parsed: parsed["nccl"]["transport"] != "unknown",
    ),
    Capture(
        "all_gather_perf.txt", "mpirun ... all_gather_perf",
        "roles/host_prep/tasks/verify_nccl_nccl_tests.yml",
        "host_prep/all_gather_perf_spark_ib.txt", "link_checks.parse_all_gather_perf",
        "tests/unit/plugins/module_utils/test_link_checks.py",
        lambda parsed: len(parsed["rows"]) > 0,
    ),
    Capture(
        "vllm_start.log", "docker logs --timestamps --until <created + health timeout> <serving>",
        "plugins/modules/vllm_endpoint.py", "vllm_serve/start_spark_gpu_reconstructed.log",
        "vllm_start.StartProgress", "tests/unit/plugins/module_utils/test_vllm_start.py",
        lambda progress: progress.phase != "starting",
    ),
    # The same log, where the ranks ran with NCCL_DEBUG=INFO: NCCL's lines of a vLLM worker.
    Capture(
        "vllm_start.log", "docker logs --timestamps --until <created + health timeout> <serving>",
        "plugins/modules/vllm_endpoint.py", "host_prep/nccl_debug_spark_ibext.txt",
        "link_checks.nccl_transport", "tests/unit/plugins/module_utils/test_link_checks.py",
    ),
)  # fmt: skip


def parser(capture: Capture):
    """The module_utils function (or class) ``capture.parser`` names."""
    module, name = capture.parser.rsplit(".", 1)
    return getattr(importlib.import_module(f"{MODULE_UTILS}.{module}"), name)


def parse(capture: Capture, text: str):
    """``text`` through the capture's parser, as the tests hand it a fixture; a start log is
    fed line by line to a ``StartProgress`` (the start wait's reader)."""
    read = parser(capture)
    if isinstance(read, type):
        progress = read(started=0.0)
        for index, line in enumerate(text.splitlines()):
            progress.feed([line], now=float(index))
        return progress
    return read(text)
