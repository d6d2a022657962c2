# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""One rank of a two-rank all_reduce over torch.distributed; prints one result line.

vllm_serve runs this in the serving image on every node before it stops the running ranks,
in a container made with the Ray containers' settings, so the collective meets the NCCL
(or, without a GPU, the Gloo) that the ranks will use:

  python3 rank_collective.py --rank R --world-size 2 --master-addr HEAD_FAST_IP \
      --master-port PORT --timeout 120 --size-mib 64

The backend is NCCL when a CUDA device is visible, else Gloo. Unless NCCL_DEBUG is already
set, NCCL logs its init and network choice (NCCL_DEBUG=INFO, subsystems INIT,NET) to this
process's output, which the role parses on the controller (plugins/module_utils/
rank_collective.py). The last line is ``dgx-spark-collective: {json}``: backend, NCCL version,
the libnccl file this process loaded, time and bandwidths (busbw = algbw * 2(n-1)/n, as
nccl-tests' all_reduce_perf defines it), wrong values. Past ``--timeout`` seconds the process
prints every thread's stack and exits 1, also when NCCL blocks in C code.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import sys
import time

MARK = "dgx-spark-collective: "
MAX_SIZE_MIB = 1024


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole run")
    p.add_argument("--size-mib", type=int, default=64, help="the all_reduce buffer (MiB)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    args = p.parse_args(argv)
    if not 1 <= args.size_mib <= MAX_SIZE_MIB:
        p.error(f"--size-mib must be 1 to {MAX_SIZE_MIB}: the buffer shares the GPU's memory")
    if args.world_size < 2 or not 0 <= args.rank < args.world_size:
        p.error("needs --world-size of at least 2 and 0 <= --rank < --world-size")
    return args


def loaded_nccl() -> str:
    """The libnccl file mapped into this process ('' when none is)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if "libnccl" in os.path.basename(path):
                    return path
    except OSError:
        pass
    return ""


def expected_sum(world: int) -> float:
    """What every element holds after the all_reduce: rank r contributes r + 1."""
    return float(world * (world + 1) // 2)


def value_check(rank: int, world: int, wrong: int, got: float | None = None) -> dict:
    """The verdict on this rank's buffer after the first all_reduce.

    ``wrong`` is how many elements differ from :func:`expected_sum` (counted by torch),
    ``got`` the first such element's value (None when all are right). The message names the
    rank, the sum it read and the sum it should have read; it is empty when all are right.
    """
    expected = expected_sum(world)
    if wrong <= 0:
        return {"expected": expected, "wrong": 0, "got": None, "message": ""}
    return {
        "expected": expected,
        "wrong": int(wrong),
        "got": got,
        "message": (
            f"rank {rank} of {world}: {int(wrong)} values after the all_reduce read "
            f"{got if got is not None else 'another sum'} instead of {expected:g}"
        ),
    }


def main(argv=None) -> int:
    args = arguments(argv)
    started = time.monotonic()
    # A hang inside NCCL holds the main thread in C: only faulthandler's thread still acts.
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")

    import torch  # noqa: PLC0415 - after NCCL_DEBUG is set, before NCCL initialises
    import torch.distributed as dist  # noqa: PLC0415

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    world = dist.get_world_size()
    count = args.size_mib * (1 << 20) // 4
    data = torch.full((count,), float(args.rank + 1), dtype=torch.float32, device=device)
    expected = expected_sum(world)

    def sync():
        if backend == "nccl":
            torch.cuda.synchronize(device)

    # The first all_reduce creates the communicator (NCCL's init and network choice).
    dist.all_reduce(data)
    sync()
    mismatched = data != expected
    wrong = int(mismatched.sum().item())
    first_wrong = float(data[mismatched][0].item()) if wrong else None
    verdict = value_check(args.rank, world, wrong, first_wrong)
    dist.barrier()
    begin = time.perf_counter()
    for _step in range(args.iters):
        dist.all_reduce(data)
    sync()
    elapsed = (time.perf_counter() - begin) / args.iters
    slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    elapsed = float(slowest.item())
    size = count * 4
    algbw = size / elapsed / 1e9
    version = None
    if backend == "nccl":
        raw = torch.cuda.nccl.version()
        version = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
    line = {
        "check": "rank_collective",
        "op": "all_reduce",
        "rank": args.rank,
        "world_size": world,
        "backend": backend,
        "nccl_version": version,
        "nccl_library": loaded_nccl(),
        "torch": torch.__version__,
        "size_bytes": size,
        "iters": args.iters,
        "time_us": round(elapsed * 1e6, 1),
        "algbw_gbps": round(algbw, 3),
        "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3),
        "wrong": verdict["wrong"],
        "wrong_message": verdict["message"],
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    print(MARK + json.dumps(line, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
