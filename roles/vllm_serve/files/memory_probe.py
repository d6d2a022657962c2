# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""What vLLM's start-up memory check will read on this node, printed as one JSON line.

Run by vllm_serve in the serving image, in a one-off container with the ranks' settings (the
GPU, the comm environment: ray_cluster's probe entry point), before anything serving stops.
vLLM refuses to start when the free memory it measures is below gpu_memory_utilization x the
device's total ("Free memory on device ... on startup"); on a GB10 that free figure is not
MemAvailable (owners report it 8-9 GiB below an idle one), so it is measured here the way the
image's own vLLM measures it: its MemorySnapshot where the image has one, else torch's
device query and, for an integrated GPU, psutil's available memory, as vLLM 0.11.1 and later do.

Printed: {"source", "free", "total", "device", "integrated", "mem_available", "vllm",
"error"} (bytes). Standard library, torch and vLLM only; no network.
"""

from __future__ import annotations

import json


def meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def vllm_snapshot():
    """vLLM's own measurement: (free, total, device name) or None where the image lacks it."""
    try:
        from vllm.utils.mem_utils import MemorySnapshot
    except ImportError:
        try:
            from vllm.utils import MemorySnapshot
        except ImportError:
            return None
    snapshot = MemorySnapshot()
    if hasattr(snapshot, "measure") and not snapshot.total_memory:
        snapshot.measure()
    return (
        int(snapshot.free_memory),
        int(snapshot.total_memory),
        str(getattr(snapshot, "device_", "")),
    )


def torch_query():
    """(free, total, device name, integrated) from torch, None without a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(free), int(total), props.name, bool(getattr(props, "is_integrated", False))


def main() -> None:
    out = {"source": None, "free": None, "total": None, "device": None, "integrated": None,
           "mem_available": meminfo_available(), "vllm": None, "error": None}  # fmt: skip
    try:
        from importlib import metadata

        out["vllm"] = metadata.version("vllm")
    except Exception:  # noqa: BLE001 - no vLLM metadata: the version stays unknown
        pass
    try:
        queried = torch_query()
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the role judges it
        queried, out["error"] = None, f"torch: {type(exc).__name__}: {exc}"
    if queried is None:
        out["source"] = "no CUDA device"
        print(json.dumps(out))
        return
    out["free"], out["total"], out["device"], out["integrated"] = queried
    out["source"] = "torch.cuda.mem_get_info"
    try:
        measured = vllm_snapshot()
    except Exception as exc:  # noqa: BLE001 - fall back to torch's figure, saying why
        measured, out["error"] = None, f"vLLM MemorySnapshot: {type(exc).__name__}: {exc}"
    if measured is not None:
        out["free"], out["total"] = measured[0], measured[1]
        out["source"] = "vLLM MemorySnapshot"
    elif out["integrated"]:
        import psutil

        out["free"] = int(psutil.virtual_memory().available)
        out["source"] = "torch.cuda.mem_get_info total, psutil available (integrated GPU)"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
