"""Stand-in for the NCCL check's rank (torchrun ... nccl_allgather_busbw.py) on the pair.

It writes the NCCL_DEBUG=INFO lines real NCCL would for the network the node has, in NCCL's
own formats (tests/unit/fixtures/host_prep/README.md), reads them back with the collection's
``link_checks.nccl_transport`` (mounted at /checks, as the real script does) and prints the
JSON line the real script prints; the role then decides on that line itself.

NCCL's devices are the NCCL_IB_HCA names (from comm.env) whose interface (``roce_<if>`` backs
``<if>``, as the ``ibdev2netdev`` stand-in says) is in this container's ``/sys/class/net`` with
operstate ``up``: real NCCL opens only the listed devices it finds, and only ports that are
active. With none usable, or with NCCL_IB_DISABLE=1, the log is NCCL's fall-back to NET/Socket
(the lines of the captured ``all_gather_perf_h200x2_socket.txt``), so the check sees a Socket
transport. The NCCL check runs its container with ``network_mode: host``, so the tree is the
node's. ``STANDIN_SYS_CLASS_NET`` points it at another tree (the unit tests' fake sysfs).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, "/checks")
import link_checks  # noqa: E402

# What the stand-in reports as measured: near the 23.74 GB/s of a healthy pair over NET/IB
# (NVIDIA/dgx-spark-playbooks pull 103), and the 4.06 GB/s of the captured socket fall-back
# (tests/unit/fixtures/host_prep/busbw_json_h200x2_socket_roce_eth0.txt).
BUSBW_IB_GBPS = 23.412
BUSBW_SOCKET_GBPS = 4.06


def usable_devices(names: list[str], sysfs: Path) -> list[str]:
    """The names whose interface (roce_<if> -> <if>) exists under ``sysfs`` and is up."""
    usable = []
    for name in names:
        iface = name.removeprefix("roce_")
        try:
            state = (sysfs / iface / "operstate").read_text().strip()
        except OSError:
            continue
        if name.startswith("roce_") and state == "up":
            usable.append(name)
    return usable


def nccl_log(env: dict, rank: int, sysfs: Path) -> list[str]:
    """This rank's NCCL_DEBUG=INFO lines for the network the node has."""
    prefix = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO"
    hca = env.get("NCCL_IB_HCA", "")
    ifname = env.get("NCCL_SOCKET_IFNAME") or "eth0"
    oob = f"{ifname}:{env.get('VLLM_HOST_IP') or '0.0.0.0'}<0>"
    send = f"{prefix} Channel {{:02d}}/0 : {rank}[0] -> {1 - rank}[0] [send] via NET/{{}}"
    log = [f"{prefix} NCCL_IB_HCA set to {hca}"] if hca else []
    disabled = env.get("NCCL_IB_DISABLE") == "1"
    names = [] if disabled else usable_devices(link_checks.configured_hcas(hca), sysfs)
    if names:
        devices = " ".join(f"[{i}]{name}:1/RoCE" for i, name in enumerate(names))
        log += [f"{prefix} NET/IB : Using {devices} [RO]; OOB {oob}", f"{prefix} Using network IB"]
        return log + [send.format(c, f"IB/{c % len(names)}") for c in range(2 * len(names))]
    if not disabled:
        log += [
            f"{prefix} NET/IB : No device found.",
            f"{prefix} NET/IB : Using [RO]; OOB {oob}",
            f"{prefix} Failed to initialize NET plugin IB",
        ]
    log += [
        f"{prefix} NET/Socket : Using [0]{oob}",
        f"{prefix} Initialized NET plugin Socket",
        f"{prefix} Using network Socket",
    ]
    return log + [send.format(c, "Socket/0") for c in range(2)]


def main(argv: list[str]) -> dict:
    rank = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--node-rank=")), 0)
    sysfs = Path(os.environ.get("STANDIN_SYS_CLASS_NET", "/sys/class/net"))
    hca = os.environ.get("NCCL_IB_HCA", "")
    log = nccl_log(dict(os.environ), rank, sysfs)
    print("\n".join(log), flush=True)
    transport = link_checks.nccl_transport("\n".join(log))
    busbw = BUSBW_IB_GBPS if transport["transport"] == "IB" else BUSBW_SOCKET_GBPS
    decision = link_checks.decide_nccl(busbw, transport, ib_hca=hca)
    return {
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


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), sort_keys=True), flush=True)
