# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters exposing plugins/module_utils/vllm_command.py to the vllm_serve role."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (
    ray_status,
    spark_memory,
    vllm_command,
    vllm_start,
)
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.vllm_serve_collective import (
    vllm_serve_collective_check,
    vllm_serve_collective_plan,
    vllm_serve_collective_result,
)
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.vllm_serve_memory import (
    vllm_serve_cma_check,
    vllm_serve_memory_check,
    vllm_serve_memory_setting_errors,
    vllm_serve_vllm_memory_check,
)


def vllm_serve_args(settings, backend, node_rank, nnodes, master_addr):
    try:
        return vllm_command.serve_args(
            dict(settings), backend=str(backend), node_rank=int(node_rank),
            nnodes=int(nnodes), master_addr=str(master_addr),
        )  # fmt: skip
    except vllm_command.ServeConfigError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_serve_env(settings, backend, ray_address, token_path, rpc_dir):
    return vllm_command.serve_env(
        dict(settings),
        backend=str(backend),
        ray_address=str(ray_address),
        token_path=str(token_path),
        rpc_dir=str(rpc_dir),
    )


def vllm_serve_parallel_error(gpus, tensor_parallel_size, pipeline_parallel_size=1):
    """The reason the sizes do not fit the GPUs, or an empty string."""
    try:
        vllm_command.check_parallel_sizes(tensor_parallel_size, pipeline_parallel_size, dict(gpus))
    except vllm_command.ServeConfigError as exc:
        return str(exc)
    return ""


def vllm_serve_setting_errors(settings):
    """What vLLM would refuse at start, as messages naming the variables."""
    return vllm_command.setting_errors(dict(settings))


def vllm_serve_start_setting_errors(stall_timeout, health_timeout, load_format="auto"):
    """What the start's deadlines and loader refuse, as messages naming the variables."""
    return vllm_start.setting_errors(stall_timeout, health_timeout, load_format)


def vllm_serve_watchdog_setting_errors(interval, failures, max_restarts, window, busy_limit=0):
    """What the watchdog's settings refuse, as messages naming the variables."""
    return vllm_start.watchdog_setting_errors(interval, failures, max_restarts, window, busy_limit)


def vllm_serve_auth_errors(key_set, hardware, allow_unauthenticated, port):
    """The key rule on real Sparks, as messages naming the variables (never the key)."""
    return vllm_command.auth_errors(key_set, hardware, allow_unauthenticated, port)


def vllm_serve_load_format(setting, modules=None):
    """[the --load-format to use ('' for vLLM's default), why], from the image's modules."""
    return list(vllm_start.choose_load_format(str(setting), dict(modules or {})))


# A failed start whose wait never ran: a node failed before it (its own error comes first).
NO_WAIT = "its wait did not run, as a node failed before it (that node's error is above)"


def vllm_serve_failed_start(wait, image, image_id, restart_reason, rolled_back, back=None,
                            previous_image="", rollback_enabled=True, ray=None):  # fmt: skip
    """The failed start's message: what vLLM refused, and which rollback branch followed.
    ``ray``: under the Ray executor, {text, nodes}: `ray status` on the head when the wait
    ended, and how many nodes the group has (None: not read)."""
    wait, back = dict(wait or {}), dict(back or {})
    said = f"{wait.get('reason') or ''}\n{wait.get('excerpt') or ''}\n{wait.get('text') or ''}"
    causes = [spark_memory.refusal_advice(said)]
    if ray:
        causes.append(ray_status.failed_start_view(str(ray["text"]), int(ray["nodes"])))
    return vllm_start.failed_start_message(
        image=str(image), image_id=str(image_id), restart_reason=str(restart_reason),
        reason=str(wait.get("reason") or NO_WAIT), excerpt=str(wait.get("excerpt") or ""),
        cause=". ".join(c for c in causes if c),
        rolled_back=bool(rolled_back), back_healthy=bool(back.get("healthy")),
        back_reason=str(back.get("reason") or ""), previous_image=str(previous_image or ""),
        rollback_enabled=bool(rollback_enabled),
    )  # fmt: skip


def vllm_serve_rollback_watch_limits(previous_args, stall, grace):
    """{stall, grace} for the watchdog of a rolled-back group: the larger of each."""
    return vllm_start.rollback_watch_limits(list(previous_args or []), stall, grace)


# The operations of the one filter this role uses, dgx_spark.cluster.vllm_serve:
# ``value | dgx_spark.cluster.vllm_serve('<operation>', ...)``.
OPERATIONS = {
    "args": vllm_serve_args,
    "env": vllm_serve_env,
    "parallel_error": vllm_serve_parallel_error,
    "setting_errors": vllm_serve_setting_errors,
    "watchdog_setting_errors": vllm_serve_watchdog_setting_errors,
    "auth_errors": vllm_serve_auth_errors,
    "start_setting_errors": vllm_serve_start_setting_errors,
    "load_format": vllm_serve_load_format,
    "failed_start": vllm_serve_failed_start,
    "rollback_watch_limits": vllm_serve_rollback_watch_limits,
    "collective_check": vllm_serve_collective_check,
    "collective_plan": vllm_serve_collective_plan,
    "collective_result": vllm_serve_collective_result,
    "memory_setting_errors": vllm_serve_memory_setting_errors,
    "memory_check": vllm_serve_memory_check,
    "vllm_memory_check": vllm_serve_vllm_memory_check,
    "cma_check": vllm_serve_cma_check,
}


class FilterModule:
    def filters(self):
        return {"vllm_serve": role_filter("vllm_serve", OPERATIONS)}
