"""Stand-in for the NCCL check's rank (torchrun ... nccl_allgather_busbw.py) on the pair.

It writes NCCL_DEBUG=INFO lines in NCCL's own formats (tests/unit/fixtures/host_prep/README.md)
for NET/IB on every device of the NCCL_IB_HCA the container got from comm.env, reads them
with the collection's link_checks.py (mounted at /checks, as for the real script) and prints
the JSON line the real script prints. A container without comm.env gets no devices, and the
role's check fails.
"""

import json
import os
import socket
import sys

sys.path.insert(0, "/checks")
import link_checks  # noqa: E402

hca = os.environ.get("NCCL_IB_HCA", "")
names = link_checks.configured_hcas(hca)
rank = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--node-rank=")), 0)
prefix = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO"
devices = " ".join(f"[{i}]{name}:1/RoCE" for i, name in enumerate(names))
log = [f"{prefix} NET/IB : Using {devices} [RO]; OOB eth0:0.0.0.0<0>", f"{prefix} Using network IB"]
log += [
    f"{prefix} Channel {c:02d}/0 : {rank}[0] -> {1 - rank}[0] [send] via NET/IB/{c % len(names)}"
    for c in range(2 * len(names))
]
transport = link_checks.nccl_transport("\n".join(log))
busbw = 23.412
decision = link_checks.decide_nccl(busbw, transport, ib_hca=hca)
line = {
    "check": "nccl_all_gather",
    "rank": rank,
    "world_size": 2,
    "backend": "nccl",
    "size_bytes": 4294967296,
    "busbw_gbps": busbw,
    "percent_of_reference": decision["percent_of_reference"],
    "wrong": 0,
    "transport": transport["transport"],
    "nccl": transport,
    "nccl_local": transport,
    "env": {"NCCL_IB_HCA": hca},
    "decision": {k: decision[k] for k in ("passed", "message", "reasons")},
}
print(json.dumps(line, sort_keys=True), flush=True)
