#!/usr/bin/env python3
"""Run the collection's image probes in this machine's Python, as they run in a serving image,
and write each answer as a captured fixture with its provenance header.

For a machine with a GPU and a CUDA PyTorch (the device tool's lent machine, or a Spark outside
Docker): the probes are the collection's own programs, read from the checkout, not copies:

* ``memory``: roles/vllm_serve/files/memory_probe.py (the memory vLLM will see);
* ``report``: the image report of vllm_registry_info (plugins/module_utils/vllm_image_probe.py
  with a report request: torch's CUDA and NCCL, the NCCL and libibverbs files);
* ``nccl``: ray_cluster's NCCL-version probe (the program in roles/ray_cluster/tasks/
  nccl_choice.yml).

Usage: gpu_probes.py OUT_DIR "WHERE" (WHERE: the machine, for the header). Standard library
and PyYAML; the probes import what they import (torch, vLLM where present).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import vllm_image_probe  # noqa: E402


def nccl_probe_source() -> str:
    tasks = yaml.safe_load((ROOT / "roles/ray_cluster/tasks/nccl_choice.yml").read_text())
    for task in tasks:
        for key in ("vars",):
            source = (task.get(key) or {}).get("_ray_cluster_image_nccl_probe")
            if source:
                return source
    raise SystemExit("no NCCL probe program in roles/ray_cluster/tasks/nccl_choice.yml")


PROBES = {
    "memory": lambda: [sys.executable, str(ROOT / "roles/vllm_serve/files/memory_probe.py")],
    "report": lambda: [
        *vllm_image_probe.probe_entrypoint(sys.executable),
        vllm_image_probe.probe_request("static", [], report=True),
    ],
    "nccl": lambda: [sys.executable, "-c", nccl_probe_source()],
}


def main() -> int:
    out, where = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    failed = 0
    for name, argv in PROBES.items():
        started = time.monotonic()
        proc = subprocess.run(argv(), capture_output=True, text=True, check=False, timeout=600)
        seconds = time.monotonic() - started
        header = (
            f"#| captured {when} on {where}: the collection's {name} probe run in the machine's "
            f"Python ({sys.version.split()[0]}), as tools/gpu_probes.py runs it; exit "
            f"{proc.returncode} in {seconds:.1f} s.\n"
        )
        (out / f"probe_{name}.txt").write_text(header + proc.stdout)
        if proc.stderr.strip():
            (out / f"probe_{name}.stderr.txt").write_text(proc.stderr[-20000:])
        print(json.dumps({"probe": name, "rc": proc.returncode, "seconds": round(seconds, 1)}))
        print(proc.stdout[-3000:])
        failed += proc.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
