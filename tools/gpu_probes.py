#!/usr/bin/env python3
"""Run the collection's image probes in this machine's Python, as they run in a serving image,
and write each answer as a captured fixture with its provenance header.

For a machine with a GPU and a CUDA PyTorch (the device tool's lent machine, or a Spark outside
Docker): the probes are the collection's own programs, read from the checkout, not copies:

* ``memory``: roles/vllm_serve/files/memory_probe.py (the memory vLLM will see);
* ``report``: the image report of vllm_registry_info (plugins/module_utils/vllm_image_probe.py
  with a report request: torch's CUDA and NCCL, the NCCL and libibverbs files);
* ``nccl``: ray_cluster's NCCL probe (roles/ray_cluster/files/nccl_probe.py with
  plugins/module_utils/elf_notes.py, as tasks/nccl_choice.yml runs it), with the machine's
  system libnccl standing in for a node's.

Usage: gpu_probes.py OUT_DIR "WHERE" [NODE_LIBNCCL] (WHERE: the machine, for the header).
Standard library; the probes import what they import (torch, vLLM where present).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The checkout as the collection dgx_spark.cluster (collections/ holds the link).
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    vllm_image_probe,
)


def nccl_probe() -> list[str]:
    return [
        sys.executable, "-c", (ROOT / "roles/ray_cluster/files/nccl_probe.py").read_text(),
        (ROOT / "plugins/module_utils/elf_notes.py").read_text(),
        *sys.argv[3:4],
    ]  # fmt: skip


PROBES = {
    "memory": lambda: [sys.executable, str(ROOT / "roles/vllm_serve/files/memory_probe.py")],
    "report": lambda: [
        *vllm_image_probe.probe_entrypoint(sys.executable),
        vllm_image_probe.probe_request("static", [], report=True),
    ],
    "nccl": nccl_probe,
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
