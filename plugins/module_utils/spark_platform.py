# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Known-bad platform checks for a DGX Spark, decided on captured text.

* ``nvidia-smi --query-gpu=name,driver_version --format=csv,noheader`` (or ``name`` alone):
  every GPU a GB10, and as many as ``spark_gpus`` says.
* The kernel release (``uname -r``) and the NVIDIA driver release against a small table of
  releases with public reports of breaking RDMA or NCCL (or the GPU driver, or vLLM's CUDA
  graphs) on Sparks. A match is a warning with its reason and source, never a failure: the
  reports describe symptoms on some setups, and the link checks decide.

Pure standard library, no Ansible imports.
"""

from __future__ import annotations

import re

GPU_NAME = "NVIDIA GB10"

# Releases with public reports of breaking RDMA/NCCL (or, where ``breaks`` says so, something
# else serving needs) on GB10 machines. ``match`` is a regular expression over the whole
# release string. Add an entry only with its public source. The memory check of vllm_serve
# (module_utils/spark_memory.py) measures the KHO fault below instead of trusting this table.
KNOWN_BAD = (
    {
        "component": "kernel",
        "match": r"7\.0\.0-1019-nvidia",
        "reason": (
            "NCCL fails at init with 'ibv_reg_mr_iova2 failed ... Cannot allocate memory' "
            "(ENOMEM) over RoCE on GB10 pairs. Cause: kexec handover (KHO), on by default in "
            "this kernel, leaves ~9.3 GiB of CMA pageblocks outside any CMA area (CmaFree "
            "above CmaTotal in /proc/meminfo) that long-term RDMA pins cannot use; booting "
            "with kho=off cured it, as did booting 6.17.0-1031-nvidia or 6.17.0-1032-nvidia "
            "(same driver 580.173.02). Also reported: whole-host wedges right after NCCL "
            "rendezvous"
        ),
        "sources": (
            "github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14",
            "github.com/eugr/spark-vllm-docker/issues/389",
            "github.com/luxingcom/aicad-nccl-optimization/issues/1",
            "github.com/NVIDIA/open-gpu-kernel-modules/issues/1358",
            "github.com/NVIDIA/NV-Kernels/pull/590",
            "github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/issues/259",
        ),
    },
    {
        "component": "kernel",
        "match": r"7\.0\.0-3[01]-generic",
        "reason": (
            "NCCL init failed with ibv_reg_mr_iova2 ENOMEM on a GB10 pair with the HWE kernel "
            "7.0.0-31, then also on 7.0.0-30; the reporter traced it to the scratch area of "
            "kexec handover (KHO, CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y): 9.3 GiB of CMA "
            "pageblocks while CmaTotal showed 32 MiB. kho=off on the kernel command line cured "
            "it on that pair and on a second one"
        ),
        "sources": ("github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/issues/259",),
    },
    {
        "component": "kernel",
        "match": r"6\.17\.0-1008-nvidia",
        "breaks": "the GPU driver",
        "reason": (
            "after the DGX OS 7.4.0 update (February 2026) one Spark failed every boot with "
            "'Failed to query NVIDIA devices' and PCI DOE mailbox timeouts; EFI pstore held "
            "aarch64 kernel panics of this kernel. A community analysis of that user's "
            "sosreport, not a reproduction by an owner"
        ),
        "sources": (
            "forums.developer.nvidia.com/t/root-cause-analysis-dgx-spark-driver-failure-"
            "kernel-6-17-0-1008-nvidia-aarch64-panics-cause-doe-mailbox-failure-pstore-"
            "evidence/366026",
        ),
    },
    {
        # The 590 branch as nvidia-smi's driver_version prints it (590.44.01, 590.48.01, ...).
        "component": "driver",
        "match": r"590\.\d+(?:\.\d+)*",
        "breaks": "vLLM's CUDA graphs",
        "reason": (
            "a two-Spark vLLM write-up (vLLM 0.19.0 in NGC's vllm 26.04 container, driver "
            "580.142) says to stay on the 580 branch because driver 590.x has a confirmed "
            "CUDA-graph deadlock on GB10. One write-up, no reproduction posted: if the start "
            "stalls while vLLM captures CUDA graphs, this driver is the first suspect; the 580 "
            "branch is the one reported working"
        ),
        "sources": ("conselara.dev/notes/dgx-spark-gb10-hardware-reference/",),
    },
)

_COMPONENTS = ("kernel", "driver")


class PlatformOutputError(ValueError):
    """The text is not what the tool prints."""


def parse_gpus(text: str) -> list[dict]:
    """nvidia-smi's ``--query-gpu=name[,driver_version] --format=csv,noheader`` lines as
    ``[{name, driver}]``."""
    gpus = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.lower().startswith("name"):
            raise PlatformOutputError("a CSV header: ask nvidia-smi with --format=csv,noheader")
        if "NVIDIA-SMI has failed" in line or "No devices were found" in line:
            raise PlatformOutputError(line)
        cells = [c.strip() for c in line.split(",")]
        gpus.append({"name": cells[0], "driver": cells[1] if len(cells) > 1 else ""})
    return gpus


def check_gpus(text: str, expected: int, host: str = "") -> dict:
    """Every GPU is a GB10, and there are ``expected`` of them (``spark_gpus``)."""
    where = f"{host}: " if host else ""
    try:
        gpus = parse_gpus(text)
    except PlatformOutputError as exc:
        return {"passed": False, "gpus": [], "message": f"{where}nvidia-smi: {exc}"}
    names = [g["name"] for g in gpus]
    others = sorted({n for n in names if n != GPU_NAME})
    problems = []
    if not gpus:
        problems.append("nvidia-smi lists no GPU")
    if others:
        problems.append(f"not a GB10: {', '.join(others)}")
    if gpus and len(gpus) != int(expected):
        problems.append(f"{len(gpus)} GPUs, spark_gpus says {expected}")
    drivers = sorted({g["driver"] for g in gpus if g["driver"]})
    seen = f"{len(gpus)} x {', '.join(sorted(set(names))) or 'none'}"
    if drivers:
        seen += f", driver {', '.join(drivers)}"
    if problems:
        message = f"{where}{seen}: " + "; ".join(problems)
        if others or not gpus:
            message += " (this collection serves on DGX Spark's GB10; spark_hardware: true)"
        return {"passed": False, "gpus": gpus, "message": message}
    return {"passed": True, "gpus": gpus, "message": f"{where}{seen}"}


def known_bad(component: str, release: str, table=KNOWN_BAD) -> list[dict]:
    """The table's entries that match ``release`` of ``component`` (kernel or driver)."""
    if component not in _COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(_COMPONENTS)}, not {component!r}")
    release = (release or "").strip()
    return [
        entry
        for entry in table
        if entry["component"] == component and release and re.fullmatch(entry["match"], release)
    ]


def platform_warnings(kernel: str, drivers: list[str] | str, host: str = "", table=KNOWN_BAD):
    """One warning per table entry the node's kernel or driver release matches."""
    where = f"{host}: " if host else ""
    if isinstance(drivers, str):
        drivers = [drivers]
    found = [("kernel", kernel, e) for e in known_bad("kernel", kernel, table)]
    for driver in sorted({d for d in drivers if d}):
        found += [("driver", driver, e) for e in known_bad("driver", driver, table)]
    return [
        f"{where}{component} {release} has public reports of breaking "
        f"{entry.get('breaks', 'RDMA/NCCL')} on Sparks: "
        f"{entry['reason']} (see {', '.join(entry['sources'])})"
        for component, release, entry in found
    ]
