# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""all_gather bus bandwidth with torch.distributed, one process per GPU, one JSON line out.

This is the NCCL check the host_prep role runs on a Spark pair (inside a CUDA PyTorch image,
with the node's /etc/dgx-spark/comm.env). It also runs standalone:

  one host, two GPUs:
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 nccl_allgather_busbw.py --size 1G
  two hosts, one GPU each (run on both, --node-rank 0 on the head):
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr <head fast IP> \
      --master-port 29511 nccl_allgather_busbw.py --size 4G --check

Measurement (as nccl-tests all_gather_perf defines it): ``size`` is the bytes each rank holds
after the gather, ``algbw = size / time`` and ``busbw = algbw * (n - 1) / n``; time is the
mean of ``--iters`` timed iterations after ``--warmup``, the slowest rank's. The buffer is
bounded: ``--size`` above ``--max-size`` (8 GiB) is refused, and so is a size that needs more
than half of the free device memory; a 16 GB test buffer has frozen a Spark through
unified-memory OOM.

Transport: unless NCCL_DEBUG is already set, NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET
goes to a per-rank file that this script reads back through ``link_checks.nccl_transport``
(plugins/module_utils/link_checks.py of the collection; the role copies it next to this file,
and from a checkout it is found by path). Rank 0 prints the JSON line (every rank with
``--all-ranks``); ``--check`` exits 1 when the decision fails (busbw below ``--min-busbw`` or,
across hosts, a transport other than NET/IB).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

MAX_SIZE_DEFAULT = 8 << 30
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_ENV_SHOWN = (
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_NVLS_ENABLE",
    "NCCL_NET_PLUGIN",
    "NCCL_IB_GID_INDEX",
    "GLOO_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "VLLM_HOST_IP",
)


def parse_size(text: str) -> int:
    """``4G``, ``512M``, ``1024K``, ``1073741824`` -> bytes (binary units)."""
    s = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = s[-1] if s and s[-1] in _UNITS else ""
    number = s[:-1] if unit else s
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4G, 512M)") from None
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return size


def load_link_checks():
    """Import link_checks.py from beside this file, else from the collection checkout."""
    here = Path(__file__).resolve().parent
    candidates = [here / "link_checks.py"]
    if len(here.parents) > 2:  # roles/host_prep/files/ of a checkout
        candidates.append(here.parents[2] / "plugins" / "module_utils" / "link_checks.py")
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location("dgx_spark_link_checks", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    sys.exit(f"link_checks.py not found (looked in: {', '.join(map(str, candidates))})")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=parse_size, default=parse_size("1G"),
                   help="bytes each rank holds after the gather (default 1G)")  # fmt: skip
    p.add_argument("--max-size", type=parse_size, default=MAX_SIZE_DEFAULT,
                   help="refuse larger buffers (default 8G)")  # fmt: skip
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu runs Gloo instead of NCCL (a smoke test without GPUs)")  # fmt: skip
    p.add_argument("--min-busbw", type=float, default=None,
                   help="GB/s the decision requires (default: link_checks' 21.875)")  # fmt: skip
    p.add_argument("--reference", type=float, default=None,
                   help="GB/s that is 100%% (default 25, the 200 Gb/s link)")  # fmt: skip
    p.add_argument("--require-ib", choices=("auto", "yes", "no"), default="auto",
                   help="require NET/IB (auto: when the ranks span hosts)")  # fmt: skip
    p.add_argument("--check", action="store_true", help="exit 1 when the decision fails")
    p.add_argument("--all-ranks", action="store_true", help="every rank prints its line")
    args = p.parse_args(argv)
    if args.size > args.max_size:
        p.error(
            f"--size {args.size} bytes is above --max-size {args.max_size}: a 16 GB test "
            "buffer has frozen a Spark (unified-memory OOM); keep the check bounded"
        )
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be at least 1 and --warmup at least 0")
    return args


def nccl_debug_to_file() -> str | None:
    """Send NCCL_DEBUG=INFO to a private file unless the caller configured NCCL_DEBUG."""
    if os.environ.get("NCCL_DEBUG"):
        return None
    directory = tempfile.mkdtemp(prefix="nccl-check-")
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(directory, "nccl.%h.%p.log")
    return directory


def read_debug(directory: str | None) -> str:
    if not directory:
        return ""
    text = []
    for path in sorted(glob.glob(os.path.join(directory, "nccl.*.log"))):
        with open(path, errors="replace") as handle:
            text.append(handle.read())
    return "".join(text)


def combine_transports(per_rank: list[str]) -> str:
    kinds = set(per_rank)
    if "Socket" in kinds:
        return "Socket"
    if kinds == {"IB"}:
        return "IB"
    if len(kinds) == 1:
        return per_rank[0]
    return "mixed:" + ",".join(sorted(kinds))


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    checks = load_link_checks()
    debug_dir = nccl_debug_to_file() if args.device == "cuda" else None

    import torch  # noqa: PLC0415 - after NCCL_DEBUG is set, before NCCL initialises
    import torch.distributed as dist  # noqa: PLC0415

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible; use --device cpu for a Gloo smoke test")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        sys.exit("all_gather needs at least 2 ranks (torchrun --nproc-per-node / --nnodes)")

    dtype = getattr(torch, args.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    count = args.size // (world * elem)
    if count < 1:
        sys.exit(f"--size {args.size} is too small for {world} ranks of {args.dtype}")
    size = count * world * elem
    if args.device == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        need = size + size // world
        if need > free // 2:
            sys.exit(
                f"rank {rank}: the buffers need {need} bytes but only {free} are free; "
                "refusing to take more than half (choose a smaller --size)"
            )

    send = torch.full((count,), float(rank), dtype=dtype, device=device)
    recv = torch.empty((count * world,), dtype=dtype, device=device)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize(device)

    chunks = list(recv.chunk(world))

    def gather():
        if backend == "nccl":
            dist.all_gather_into_tensor(recv, send)
        else:  # Gloo lacks all_gather_into_tensor in older torch; the chunks are views of recv
            dist.all_gather(chunks, send)

    gather()
    sync()
    # Rank r's block must hold r everywhere (checked block by block: no second full buffer).
    wrong = sum(int((chunk != float(r)).sum().item()) for r, chunk in enumerate(chunks))
    for _step in range(args.warmup):
        gather()
    sync()
    if backend == "nccl":
        dist.barrier(device_ids=[local_rank])
    else:
        dist.barrier()
    started = time.perf_counter()
    for _step in range(args.iters):
        gather()
    sync()
    elapsed = (time.perf_counter() - started) / args.iters
    slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    elapsed = float(slowest.item())

    transport = checks.nccl_transport(read_debug(debug_dir)) if backend == "nccl" else {
        "transport": "gloo", "ib_devices": [], "socket_ifaces": [], "networks": [],
        "channels": {}, "gdr": False,
    }  # fmt: skip
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"host": socket.gethostname(), "transport": transport})
    hosts = sorted({g["host"] for g in gathered})
    per_rank = [g["transport"]["transport"] for g in gathered]
    merged = dict(transport)
    merged["transport"] = combine_transports(per_rank)
    for g in gathered:
        for dev in g["transport"]["ib_devices"]:
            if dev not in merged["ib_devices"]:
                merged["ib_devices"] = merged["ib_devices"] + [dev]

    algbw = size / elapsed / 1e9
    busbw = algbw * (world - 1) / world
    require_ib = len(hosts) > 1 if args.require_ib == "auto" else args.require_ib == "yes"
    if backend != "nccl":
        require_ib = False
    decision = checks.decide_nccl(
        busbw,
        merged,
        args.min_busbw if args.min_busbw is not None else checks.DEFAULT_MIN_BUSBW_GBPS,
        args.reference if args.reference is not None else checks.REFERENCE_BUSBW_GBPS,
        require_ib=require_ib,
    )
    if wrong:
        decision["passed"] = False
        decision["reasons"].append(f"{wrong} wrong values after all_gather (data corruption)")
        decision["message"] += f"; FAIL: {wrong} wrong values"
    nccl_version = None
    if backend == "nccl":
        version = torch.cuda.nccl.version()
        nccl_version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    line = {
        "check": "nccl_all_gather",
        "rank": rank,
        "world_size": world,
        "hosts": hosts,
        "backend": backend,
        "dtype": args.dtype,
        "size_bytes": size,
        "count_per_rank": count,
        "iters": args.iters,
        "warmup": args.warmup,
        "time_us": round(elapsed * 1e6, 1),
        "algbw_gbps": round(algbw, 3),
        "busbw_gbps": round(busbw, 3),
        "percent_of_reference": decision["percent_of_reference"],
        "wrong": wrong,
        "transport": merged["transport"],
        "transports_by_rank": per_rank,
        "nccl": merged,
        "nccl_version": nccl_version,
        "torch": torch.__version__,
        "env": {k: os.environ[k] for k in _ENV_SHOWN if k in os.environ},
        "decision": {k: decision[k] for k in ("passed", "message", "reasons")},
    }
    if rank == 0 or args.all_ranks:
        print(json.dumps(line, sort_keys=True), flush=True)
    dist.destroy_process_group()
    return 1 if args.check and not decision["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
