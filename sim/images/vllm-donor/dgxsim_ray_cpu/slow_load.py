"""Sim-only: make the tiny model's weights load slowly, or stall, to test how starts are judged.

The sim's model loads in about a second, so a start cannot outlast any deadline by itself.
vLLM calls ``register`` in every process through the ``vllm.general_plugins`` entry point;
with one of these variables set (in ``vllm_serve_env``; vLLM passes ``VLLM_*`` variables on
to its Ray actors) it wraps the function vLLM opens each safetensors shard with:

``VLLM_DGXSIM_SECONDS_PER_SHARD``
    sleep this many seconds before each shard: the start keeps progressing, one shard at a
    time, as a slow disk would.
``VLLM_DGXSIM_STALL_AT_SHARD``
    before the shard with this number (1 is the first) sleep for a day: the start stalls
    while loading weights, as a rank stuck on its storage would.

Unset, nothing is patched. Never installed into a production image.
"""

import os
import time

_opened: list = []


def _slowed(original, seconds: float, stall_at: int):
    def safe_open(path, *args, **kwargs):
        if path not in _opened:
            _opened.append(path)
            if stall_at and len(_opened) >= stall_at:
                time.sleep(86400)
            if seconds:
                time.sleep(seconds)
        return original(path, *args, **kwargs)

    return safe_open


def register() -> None:
    seconds = float(os.environ.get("VLLM_DGXSIM_SECONDS_PER_SHARD") or 0)
    stall_at = int(os.environ.get("VLLM_DGXSIM_STALL_AT_SHARD") or 0)
    if not seconds and not stall_at:
        return
    from vllm.model_executor.model_loader import weight_utils

    if getattr(weight_utils.safe_open, "dgxsim_slowed", False):
        return
    slowed = _slowed(weight_utils.safe_open, seconds, stall_at)
    slowed.dgxsim_slowed = True
    weight_utils.safe_open = slowed
