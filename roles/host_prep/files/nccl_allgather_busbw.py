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
``--all-ranks``): ``nccl`` holds every rank's transport, ``nccl_local`` this rank's own record
(the devices its NCCL opened and ran channels on). ``--check`` exits 1 when the decision fails:
busbw below ``--floor`` (what only a broken link measures) or, where NET/IB is required, a
transport other than NET/IB or devices other than the ones NCCL_IB_HCA names; below
``--healthy`` the decision passes with a warning (its ``warnings`` in the JSON line).
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
    p.add_argument("--floor", type=float, default=None,
                   help="GB/s below which the decision fails, what only a broken link measures "
                        "(default: link_checks' 6)")  # fmt: skip
    p.add_argument("--healthy", type=float, default=None,
                   help="GB/s from which the link counts as healthy; below it the decision "
                        "passes with a warning (default: link_checks' 21.875)")  # fmt: skip
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


def buffer_layout(size: int, world: int, elem: int, dtype: str) -> tuple[int, int, str]:
    """Elements per rank and the bytes gathered (``size`` rounded down), or an error."""
    count = size // (world * elem)
    if count < 1:
        return 0, 0, f"--size {size} is too small for {world} ranks of {dtype}"
    return count, count * world * elem, ""


def memory_refusal(rank: int, size: int, world: int, free: int) -> str:
    """Why the buffers (the gathered bytes and one rank's share) may not take the memory."""
    need = size + size // world
    if need > free // 2:
        return (
            f"rank {rank}: the buffers need {need} bytes but only {free} are free; "
            "refusing to take more than half (choose a smaller --size)"
        )
    return ""


def gloo_transport() -> dict:
    """The transport record of a Gloo run, which has no NCCL log to read."""
    return {
        "transport": "gloo",
        "ib_devices": [],
        "channel_devices": [],
        "socket_ifaces": [],
        "networks": [],
        "channels": {},
        "gdr": False,
    }


def merge_rank_transports(transport: dict, gathered: list[dict]) -> tuple[list, list, dict]:
    """Hosts, each rank's transport, and this rank's record with every rank's devices."""
    hosts = sorted({g["host"] for g in gathered})
    per_rank = [g["transport"]["transport"] for g in gathered]
    merged = dict(transport)
    merged["transport"] = combine_transports(per_rank)
    for key in ("ib_devices", "channel_devices"):
        for g in gathered:
            for dev in g["transport"].get(key) or []:
                if dev not in merged.get(key, []):
                    merged[key] = merged.get(key, []) + [dev]
    return hosts, per_rank, merged


def bandwidths(size: int, elapsed: float, world: int) -> tuple[float, float]:
    """algbw and busbw in GB/s, as nccl-tests all_gather_perf defines them."""
    algbw = size / elapsed / 1e9
    return algbw, algbw * (world - 1) / world


def needs_ib(mode: str, hosts: list, backend: str) -> bool:
    """Whether the decision requires NET/IB: ``auto`` when the ranks span hosts, never on Gloo."""
    if backend != "nccl":
        return False
    return len(hosts) > 1 if mode == "auto" else mode == "yes"


def decide(checks, args, busbw: float, run: dict, require_ib: bool, ib_hca: str | None) -> dict:
    """link_checks' decision on the bandwidth, every rank's transport and this rank's devices
    (against ``ib_hca``, the NCCL_IB_HCA the rank was given), failed by any wrong value."""
    transport = dict(run["merged"])
    for key in ("ib_devices", "channel_devices"):
        transport[key] = list(run["local"].get(key) or [])
    wrong = run["wrong"]
    return checks.decide_nccl(
        busbw,
        transport,
        args.floor if args.floor is not None else checks.DEFAULT_BUSBW_FLOOR_GBPS,
        args.healthy if args.healthy is not None else checks.DEFAULT_HEALTHY_BUSBW_GBPS,
        args.reference if args.reference is not None else checks.REFERENCE_BUSBW_GBPS,
        require_ib=require_ib,
        ib_hca=ib_hca,
        extra_reasons=[f"{wrong} wrong values after all_gather (data corruption)"] if wrong else [],
    )


def report_line(args, run: dict, decision: dict, versions: dict, environ) -> dict:
    """The JSON line: the run's measurements (``run``), the decision and what ran it."""
    merged = run["merged"]
    return {
        "check": "nccl_all_gather",
        "rank": run["rank"],
        "world_size": run["world"],
        "hosts": run["hosts"],
        "backend": run["backend"],
        "dtype": args.dtype,
        "size_bytes": run["size"],
        "count_per_rank": run["count"],
        "iters": args.iters,
        "warmup": args.warmup,
        "time_us": round(run["elapsed"] * 1e6, 1),
        "algbw_gbps": round(run["algbw"], 3),
        "busbw_gbps": round(run["busbw"], 3),
        "percent_of_reference": decision["percent_of_reference"],
        "wrong": run["wrong"],
        "transport": merged["transport"],
        "transports_by_rank": run["per_rank"],
        "nccl": merged,
        "nccl_local": run["local"],
        "nccl_version": versions["nccl"],
        "torch": versions["torch"],
        "env": {k: environ[k] for k in _ENV_SHOWN if k in environ},
        "decision": {
            k: decision[k]
            for k in ("passed", "message", "reasons", "band", "warnings")
            if k in decision
        },
    }


def init_ranks(torch, dist, device_kind: str) -> tuple[int, object, str]:
    """Join the process group: this process's local rank, its device and the backend."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible; use --device cpu for a Gloo smoke test")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return local_rank, device, backend


def buffers(torch, args, device, rank: int, world: int) -> tuple[object, int, int]:
    """The dtype, the elements per rank and the bytes gathered; exits when they do not fit."""
    dtype = getattr(torch, args.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    count, size, error = buffer_layout(args.size, world, elem, args.dtype)
    if error:
        sys.exit(error)
    if args.device == "cuda":
        refusal = memory_refusal(rank, size, world, torch.cuda.mem_get_info(device)[0])
        if refusal:
            sys.exit(refusal)
    return dtype, count, size


def time_all_gather(torch, dist, args: argparse.Namespace, run: dict, device, dtype) -> None:
    """Gather once and count the wrong values, warm up, then time ``--iters`` gathers; the
    slowest rank's mean time goes into ``run`` as ``elapsed``, the wrong count as ``wrong``."""
    rank, world, backend = run["rank"], run["world"], run["backend"]
    send = torch.full((run["count"],), float(rank), dtype=dtype, device=device)
    recv = torch.empty((run["count"] * world,), dtype=dtype, device=device)

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
    run["wrong"] = sum(int((chunk != float(r)).sum().item()) for r, chunk in enumerate(chunks))
    for _step in range(args.warmup):
        gather()
    sync()
    if backend == "nccl":
        dist.barrier(device_ids=[run["local_rank"]])
    else:
        dist.barrier()
    started = time.perf_counter()
    for _step in range(args.iters):
        gather()
    sync()
    elapsed = (time.perf_counter() - started) / args.iters
    slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    run["elapsed"] = float(slowest.item())


def nccl_version(torch, backend: str) -> str | None:
    if backend != "nccl":
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    checks = load_link_checks()
    debug_dir = nccl_debug_to_file() if args.device == "cuda" else None

    import torch  # noqa: PLC0415 - after NCCL_DEBUG is set, before NCCL initialises
    import torch.distributed as dist  # noqa: PLC0415

    local_rank, device, backend = init_ranks(torch, dist, args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        sys.exit("all_gather needs at least 2 ranks (torchrun --nproc-per-node / --nnodes)")
    dtype, count, size = buffers(torch, args, device, rank, world)
    run = {
        "rank": rank,
        "world": world,
        "local_rank": local_rank,
        "backend": backend,
        "count": count,
        "size": size,
    }
    time_all_gather(torch, dist, args, run, device, dtype)

    transport = (
        checks.nccl_transport(read_debug(debug_dir)) if backend == "nccl" else gloo_transport()
    )
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"host": socket.gethostname(), "transport": transport})
    run["local"] = transport
    run["hosts"], run["per_rank"], run["merged"] = merge_rank_transports(transport, gathered)
    run["algbw"], run["busbw"] = bandwidths(size, run["elapsed"], world)
    require_ib = needs_ib(args.require_ib, run["hosts"], backend)
    ib_hca = os.environ.get("NCCL_IB_HCA") if backend == "nccl" else None
    decision = decide(checks, args, run["busbw"], run, require_ib, ib_hca)
    versions = {"nccl": nccl_version(torch, backend), "torch": torch.__version__}
    line = report_line(args, run, decision, versions, os.environ)
    if rank == 0 or args.all_ranks:
        print(json.dumps(line, sort_keys=True), flush=True)
    dist.destroy_process_group()
    return 1 if args.check and not decision["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
