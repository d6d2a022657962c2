# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Memory checks before the serving ranks start on a DGX Spark, decided on captured text.

A GB10's memory is unified: the GPU allocates from the same pool as the host, and a start
that does not fit hard-resets the host (NV_ERR_NO_MEMORY) instead of failing one process.
So before the serving group is stopped, each node must be able to hold the new ranks:

* **memory**: ``MemAvailable + held >= gpu_memory_utilization x MemTotal + margin``.
  ``MemAvailable`` is the kernel's estimate of what new allocations get without swapping;
  it already counts the reclaimable page cache (``Active(file)`` + ``Inactive(file)``) and
  reclaimable slab, which the role drops right before the ranks start, and leaves out
  ``Shmem``, which a cache drop does not free. ``MemFree`` alone would refuse every start
  right after the weights were read. ``held`` is the GPU memory of the processes in this
  collection's running rank containers (``nvidia-smi --query-compute-apps``): a restart
  stops them, so it comes back. GB10's driver memory is not page cache and not in
  ``MemAvailable``, and nvidia-smi reports it per process even though its device totals
  read ``[N/A]``.
* **CMA**: free pageblocks of migrate type CMA beyond every CMA area (``CmaFree`` greater
  than ``CmaTotal``) are the scratch area of kexec handover (KHO), which the 7.0 kernels
  enable by default. RDMA memory registration cannot pin pages there: NCCL's
  ``ibv_reg_mr`` fails with ENOMEM. ``CmaTotal`` 0 alone is no fault: kernels built
  without a default CMA pool, and a node booted with ``kho=off``, show 0 and 0.

Pure standard library, no Ansible imports. /proc/meminfo text may start with ``#`` lines
(the test fixtures' headers), which are skipped.
"""

from __future__ import annotations

import json
import math
import re

GIB = 1 << 30
MIB = 1 << 20
# vLLM's own default for --gpu-memory-utilization, used when the setting is left empty.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# The largest margin accepted: a margin as large as a Spark's memory leaves nothing to serve.
MAX_MARGIN_GIB = 64

KHO_FIX = (
    "Fix: add kho=off to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in "
    "/etc/default/grub, then update-grub and a reboot), or boot 6.17.0-1032-nvidia; "
    "afterwards CmaFree reads 0. Reports: "
    "github.com/NVIDIA/NV-Kernels/pull/590, "
    "github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/issues/259, "
    "github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14"
)

_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s+(\d+)(?:\s+(kB))?\s*$")


class MeminfoError(ValueError):
    """The text is not /proc/meminfo."""


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as ``{field: value}``: bytes for ``kB`` fields, counts otherwise."""
    fields: dict[str, int] = {}
    for number, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            raise MeminfoError(f"line {number} is not a /proc/meminfo field: {line[:60]!r}")
        name, value, unit = match.groups()
        fields[name] = int(value) * (1024 if unit else 1)
    if "MemTotal" not in fields:
        raise MeminfoError("no MemTotal line: not /proc/meminfo")
    return fields


def parse_compute_apps(text: str) -> dict[int, int | None]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` as
    ``{pid: bytes}``; ``None`` where the driver reports no number (``[N/A]``)."""
    apps: dict[int, int | None] = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.lower().startswith("no running"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2 or not cells[0].isdigit():
            raise MeminfoError(
                f"not a 'pid, used_memory' line of nvidia-smi --query-compute-apps "
                f"(--format=csv,noheader,nounits): {line[:60]!r}"
            )
        used = (cells[1].split() or [""])[0]
        apps[int(cells[0])] = int(used) * MIB if used.isdigit() else None
    return apps


def parse_pids(text: str) -> list[int]:
    """The PIDs of ``docker top NAME -eo pid`` (a ``PID`` header, then one a line)."""
    return [int(t) for t in (text or "").split() if t.isdigit()]


def held_by(apps: dict[int, int | None], pids) -> dict:
    """GPU memory of the processes among ``pids``: {bytes, processes, unknown}."""
    wanted = {int(p) for p in pids or ()}
    mine = {pid: used for pid, used in apps.items() if pid in wanted}
    return {
        "bytes": sum(u for u in mine.values() if u is not None),
        "processes": sorted(mine),
        "unknown": sorted(pid for pid, used in mine.items() if used is None),
    }


def _number(value):
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError("not finite")
    return number


def setting_errors(gpu_memory_utilization, margin_gib) -> list[str]:
    """The memory check's own settings; each message names its variable."""
    errors = []
    if gpu_memory_utilization not in (None, ""):
        try:
            good = 0 < _number(gpu_memory_utilization) <= 1
        except (TypeError, ValueError):
            good = False
        if not good:
            errors.append(
                f"vllm_serve_gpu_memory_utilization is {gpu_memory_utilization!r}; "
                "allowed: a number in (0, 1], or empty"
            )
    try:
        good = 0 <= _number(margin_gib) <= MAX_MARGIN_GIB
    except (TypeError, ValueError):
        good = False
    if not good:
        errors.append(
            f"vllm_serve_memory_margin_gib is {margin_gib!r}; "
            f"allowed: a number of GiB from 0 to {MAX_MARGIN_GIB}"
        )
    return errors


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _mib(value: float) -> str:
    return f"{value / MIB:.0f} MiB"


def check_memory(
    meminfo: str, gpu_memory_utilization, margin_gib, held: dict | None = None, host: str = ""
) -> dict:
    """Whether the node can hold the ranks: {passed, message, total, available, held, needed,
    utilization, margin} (bytes). ``held`` is :func:`held_by`'s answer for the running ranks."""
    where = f"{host}: " if host else ""
    errors = setting_errors(gpu_memory_utilization, margin_gib)
    if errors:
        raise ValueError("; ".join(errors))
    fields = parse_meminfo(meminfo)
    if "MemAvailable" not in fields:
        raise MeminfoError("no MemAvailable line (a kernel older than 3.14 does not report it)")
    default = gpu_memory_utilization in (None, "")
    fraction = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if default else _number(gpu_memory_utilization)
    margin = _number(margin_gib) * GIB
    held = held or {"bytes": 0, "processes": [], "unknown": []}
    total, available = fields["MemTotal"], fields["MemAvailable"]
    needed = fraction * total + margin
    usable = available + held["bytes"]
    util = f"{fraction:g}" + (" (vLLM's default)" if default else "")
    result = {
        "total": total,
        "available": available,
        "held": held["bytes"],
        "needed": needed,
        "utilization": fraction,
        "margin": margin,
    }
    notes = []
    if held["processes"]:
        notes.append(
            f"GPU processes {', '.join(map(str, held['processes']))}, freed by the restart"
        )
    if held["unknown"]:
        notes.append(f"nvidia-smi gave no memory for {', '.join(map(str, held['unknown']))}")
    running = f"{_gib(held['bytes'])} held by the running ranks"
    if notes:
        running += f" ({'; '.join(notes)})"
    numbers = (
        f"total {_gib(total)}, available {_gib(available)} + {running}, "
        f"needed {_gib(needed)} (gpu_memory_utilization {util} x total "
        f"+ vllm_serve_memory_margin_gib {_number(margin_gib):g})"
    )
    if usable >= needed:
        return {**result, "passed": True, "message": f"{where}memory holds the start: {numbers}"}
    fits = math.floor(max(usable - margin, 0) / total * 100) / 100
    advice = f"at most {fits:.2f} fits now" if fits > 0 else "no fraction fits now"
    message = (
        f"{where}memory cannot hold the start: {numbers}. A start that does not fit "
        f"hard-resets a GB10 host (NV_ERR_NO_MEMORY), so nothing was stopped. Stop what else "
        f"holds memory on this node, or lower vllm_serve_gpu_memory_utilization ({advice}) "
        "or vllm_serve_memory_margin_gib"
    )
    return {**result, "passed": False, "message": message}


def check_cma(meminfo: str, host: str = "") -> dict:
    """Refuse free CMA pageblocks outside every CMA area (KHO scratch): {passed, message,
    cma_total, cma_free} (bytes; ``None`` when the kernel has no CMA)."""
    where = f"{host}: " if host else ""
    fields = parse_meminfo(meminfo)
    total, free = fields.get("CmaTotal"), fields.get("CmaFree")
    result = {"cma_total": total, "cma_free": free}
    if total is None or free is None:
        return {**result, "passed": True, "message": f"{where}a kernel without CMA"}
    numbers = f"CmaTotal {_mib(total)}, CmaFree {_mib(free)}"
    if free <= total:
        return {**result, "passed": True, "message": f"{where}{numbers}"}
    message = (
        f"{where}{numbers}: {_mib(free - total)} of free CMA pageblocks belong to no CMA area. "
        "They are the scratch area of kexec handover (KHO), on by default in the 7.0 kernels; "
        "RDMA cannot pin pages there, so NCCL's ibv_reg_mr fails with ENOMEM and the ranks "
        f"die at start. {KHO_FIX}"
    )
    return {**result, "passed": False, "message": message}


# --------------------------------------------------------------------------- page cache

# How vLLM's start-up memory accounting reads the free memory of a GB10 (read in the published
# source archives of each release, vllm/utils/__init__.py or vllm/utils/mem_utils.py,
# MemorySnapshot.measure):
# * up to 0.11.0 it is torch.cuda.mem_get_info(), which on an integrated GPU is the kernel's
#   MemFree: the page cache the weights' load fills counts as memory in use. The profile
#   then books it as non-torch memory the ranks took, and the KV cache budget
#   (requested - weights - activations - non-torch) shrinks by it, down to negative; public
#   reports: github.com/vllm-project/vllm/issues/35313, .../issues/48140.
# * from 0.11.1 on, compute capabilities 8.7, 11.0 and 12.1 (Orin, Thor, Spark) read
#   psutil's available memory (MemAvailable) instead, which counts the page cache as free;
#   github.com/vllm-project/vllm/pull/35356 later keys it on the device's is_integrated
#   property. Verified on 0.11.0 (absent) and 0.11.1, 0.12.0, 0.13.0, 0.14.1, 0.17.0, 0.32.0
#   (present); the pull request that first added it is not identified here.
# A pre-release or development build of 0.11.1 itself may predate the change, so it counts
# as older; so does any version that does not parse.
PAGE_CACHE_AS_FREE_SINCE = (0, 11, 1)
PAGE_CACHE_DROP_MODES = ("auto", "always", "never")

# The subset of PEP 440 vLLM's builds use: 0.14.1, v0.14.1, 0.17.1rc1, 0.11.1.post1,
# 0.1.dev16260+g388fd5153, 0.32.0+cpu. Anything else is "not a version" here.
_PEP440 = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)(?P<pre>(?:a|b|rc)\d+)?(?P<post>\.post\d+)?"
    r"(?P<dev>\.dev\d+)?(?:\+[a-z0-9]+(?:[._][a-z0-9]+)*)?$",
    re.IGNORECASE,
)


def _release_of(version) -> tuple[tuple[int, ...], bool] | None:
    """(release numbers, is a pre-release or development build) of ``version``, or None."""
    match = _PEP440.match(str(version).strip()) if isinstance(version, str) else None
    if not match:
        return None
    release = tuple(int(part) for part in match.group("release").split("."))
    return release, bool(match.group("pre") or match.group("dev"))


def _padded(release: tuple[int, ...], width: int) -> tuple[int, ...]:
    return release + (0,) * (width - len(release))


def page_cache_drop_during_load(vllm_version, mode: str = "auto") -> tuple[bool, str]:
    """Whether each node's page cache is dropped while the ranks load their weights, and why.

    ``vllm_version`` is the serving image's vLLM version as its package metadata says it
    (``vllm_registry_info``'s ``versions.vllm``); ``mode`` is vllm_serve_drop_page_cache.
    ``auto`` drops for the versions that count the page cache as used memory and for any
    version that cannot be read (the drop costs little; a negative KV budget stops the start).
    """
    if mode not in PAGE_CACHE_DROP_MODES:
        raise ValueError(page_cache_setting_errors(mode)[0])
    if mode == "always":
        return True, "vllm_serve_drop_page_cache is always"
    if mode == "never":
        return False, "vllm_serve_drop_page_cache is never"
    since = ".".join(map(str, PAGE_CACHE_AS_FREE_SINCE))
    parsed = _release_of(vllm_version)
    if parsed is None:
        shown = "unknown" if vllm_version in (None, "") else repr(vllm_version)
        return True, (
            f"the serving image's vLLM version is {shown}: dropped, as for a vLLM before "
            f"{since}, whose memory check counts the page cache as used"
        )
    release, early = parsed
    width = max(len(release), len(PAGE_CACHE_AS_FREE_SINCE))
    mine, boundary = _padded(release, width), _padded(PAGE_CACHE_AS_FREE_SINCE, width)
    if mine < boundary or (mine == boundary and early):
        return True, (
            f"vLLM {vllm_version} counts the page cache as used memory (vLLM reads "
            f"MemAvailable on GB10 from {since} on)"
        )
    return False, f"vLLM {vllm_version} reads MemAvailable on GB10: the page cache counts as free"


def page_cache_setting_errors(mode) -> list[str]:
    """vllm_serve_drop_page_cache's own check; the message names the variable."""
    if mode in PAGE_CACHE_DROP_MODES:
        return []
    shown = json.dumps(mode, default=str)
    return [f"vllm_serve_drop_page_cache is {shown}; allowed: {', '.join(PAGE_CACHE_DROP_MODES)}"]


# --------------------------------------------------------------------------- vLLM's own figure

# vLLM refuses a start whose free memory, as it measures it, is below gpu_memory_utilization x
# the device's total; its message in every release read (0.11 to 0.32: vllm/v1/worker/
# gpu_worker.py and utils.py) starts "Free memory on device [<device>] (<free>/<total> GiB) on
# startup" and names "(<utilization>, <requested> GiB)".
_VLLM_REFUSAL = re.compile(
    r"Free memory on device(?: \S+)? \((?P<free>\d+(?:\.\d+)?)/(?P<total>\d+(?:\.\d+)?) GiB\) "
    r"on startup.*?\((?P<utilization>\d*\.?\d+), (?P<requested>\d+(?:\.\d+)?) GiB\)",
    re.DOTALL,
)


def _floor2(value: float) -> float:
    return math.floor(max(value, 0) * 100) / 100


def parse_vllm_probe(text: str) -> dict:
    """The memory probe's answer (roles/vllm_serve/files/memory_probe.py): its last JSON line."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and "source" in found:
                return found
    raise MeminfoError(f"the memory probe printed no answer: {(text or '').strip()[-300:]!r}")


def check_vllm_memory(probes: dict, gpu_memory_utilization, held: dict | None = None) -> dict:
    """Whether vLLM's own start-up check will pass on every node, from each node's probe
    (``probes``: host -> parse_vllm_probe's answer) and the GPU memory the running ranks hold
    there (``held``: host -> bytes; a restart frees it). {passed, measured, message, nodes:
    {host: {free, total, held, needed, fits, source}}}; ``fits`` is the largest utilization
    (two decimals) the node's figure holds. Nodes without a CUDA device are not measured."""
    errors = setting_errors(gpu_memory_utilization, 0)
    if errors:
        raise ValueError("; ".join(errors))
    default = gpu_memory_utilization in (None, "")
    fraction = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if default else _number(gpu_memory_utilization)
    held = held or {}
    nodes, lines, short = {}, [], []
    for host in sorted(probes):
        probe = probes[host] or {}
        if not probe.get("total"):
            lines.append(f"{host}: not measured ({probe.get('source') or 'no answer'})")
            continue
        free, total = int(probe["free"]), int(probe["total"])
        back = int(held.get(host) or 0)
        needed = fraction * total
        fits = _floor2((free + back) / total)
        nodes[host] = {"free": free, "total": total, "held": back, "needed": needed,
                       "fits": fits, "source": probe.get("source")}  # fmt: skip
        gap = ""
        if probe.get("mem_available"):
            gap = f", {_gib(int(probe['mem_available']) - free)} under MemAvailable"
        line = (
            f"{host}: vLLM sees {_gib(free)} free of {_gib(total)} ({probe.get('source')}{gap})"
            + (f" + {_gib(back)} the running ranks hold" if back else "")
            + f"; utilization {fraction:g} asks {_gib(needed)}; at most {fits:.2f} fits"
        )
        lines.append(line)
        if free + back < needed:
            short.append(host)
    said = "; ".join(lines)
    if not nodes:
        message = f"vLLM's own memory figure not measured: {said}"
        return {"passed": True, "measured": False, "nodes": {}, "message": message}
    if not short:
        message = f"vLLM's own memory check will pass: {said}"
        return {"passed": True, "measured": True, "nodes": nodes, "message": message}
    lowest = min(nodes[h]["fits"] for h in short)
    advice = (
        f"set vllm_serve_gpu_memory_utilization to {lowest:.2f} or lower"
        if lowest > 0
        else "free memory on " + ", ".join(short)
    )
    message = (
        f"vLLM's own memory check would refuse the start on {', '.join(short)} "
        f'("Free memory on device ... is less than desired GPU memory utilization"), so '
        f"nothing was stopped: {'; '.join(lines)}. Stop what else holds memory there, or "
        f"{advice}"
    )
    return {"passed": False, "measured": True, "nodes": nodes, "message": message}


def vllm_memory_refusal(text: str) -> dict | None:
    """vLLM's own start-up memory refusal in a log or an excerpt: {free, total, utilization,
    requested, fits} (GiB as vLLM printed them; ``fits`` the largest utilization its free
    figure holds), or None when the text holds none."""
    found = _VLLM_REFUSAL.search(text or "")
    if not found:
        return None
    free, total = float(found.group("free")), float(found.group("total"))
    return {
        "free": free,
        "total": total,
        "utilization": float(found.group("utilization")),
        "requested": float(found.group("requested")),
        "fits": _floor2(free / total) if total else 0.0,
    }


def refusal_advice(text: str) -> str:
    """A sentence naming vLLM's memory refusal and the setting to change, or ''."""
    found = vllm_memory_refusal(text)
    if not found:
        return ""
    return (
        f"vLLM's own memory check refused the start: it saw {found['free']:g} GiB free of "
        f"{found['total']:g} GiB, and utilization {found['utilization']:g} asks "
        f"{found['requested']:g} GiB; set vllm_serve_gpu_memory_utilization to "
        f"{found['fits']:.2f} or lower, or free memory on the node"
    )
