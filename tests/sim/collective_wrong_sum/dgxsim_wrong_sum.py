"""A rank that sums wrong, for test_collective.py (never in the collection's own images).

A test derives an image from the serving alias with this module and a .pth file that imports
it in every Python process. Only in the process whose command line carries
``--rank=$DGXSIM_WRONG_SUM_RANK`` (the collective's rank, run as ``python3 -c PROGRAM --rank=R
...``) it wraps ``torch.distributed.all_reduce`` so that the first call adds 1 to every element
of the reduced tensor: the rank's own value check must then see its sum wrong. Every other
process (vLLM, the probes) returns at once without importing torch.
"""

import os
import sys


def _install() -> None:
    target = os.environ.get("DGXSIM_WRONG_SUM_RANK")
    if target is None or f"--rank={target}" not in sys.argv:
        return
    import torch.distributed as dist

    real = dist.all_reduce
    calls = []

    def all_reduce(tensor, *args, **kwargs):
        work = real(tensor, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            tensor.add_(1.0)
        return work

    dist.all_reduce = all_reduce


_install()
