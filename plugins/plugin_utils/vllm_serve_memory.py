# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters exposing plugins/module_utils/spark_memory.py to the vllm_serve role: the memory
and CMA checks that run before the serving group is stopped (the vllm_serve filter's operations)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import spark_memory


def vllm_serve_memory_setting_errors(gpu_memory_utilization, margin_gib):
    """What the memory check refuses in its settings, as messages naming the variables."""
    return spark_memory.setting_errors(gpu_memory_utilization, margin_gib)


def vllm_serve_memory_check(
    meminfo, gpu_memory_utilization, margin_gib, compute_apps="", rank_pids=None, host=""
):
    """Whether the node's memory holds the ranks, counting back what the running ranks hold."""
    try:
        held = spark_memory.held_by(
            spark_memory.parse_compute_apps(str(compute_apps or "")),
            spark_memory.parse_pids(" ".join(str(p) for p in rank_pids or [])),
        )
        return spark_memory.check_memory(
            str(meminfo), gpu_memory_utilization, margin_gib, held, str(host)
        )
    except ValueError as exc:
        raise AnsibleFilterError(f"{host}: memory check: {exc}") from exc


def vllm_serve_vllm_memory_check(nodes, hostvars, gpu_memory_utilization):
    """Whether vLLM's own start-up check will pass on every node, from each node's memory probe
    (``_vllm_serve_memory_probe``: the probe container's output) and what its running ranks
    hold (``_vllm_serve_memory_held``, bytes)."""
    probes, held = {}, {}
    try:
        for host in nodes or []:
            facts = hostvars[host]
            probes[host] = spark_memory.parse_vllm_probe(
                str(facts.get("_vllm_serve_memory_probe") or "")
            )
            held[host] = int(facts.get("_vllm_serve_memory_held") or 0)
        return spark_memory.check_vllm_memory(probes, gpu_memory_utilization, held)
    except ValueError as exc:
        raise AnsibleFilterError(f"vLLM's memory figure: {exc}") from exc


def vllm_serve_cma_check(meminfo, host=""):
    """Whether free CMA pageblocks lie outside every CMA area (KHO scratch)."""
    try:
        return spark_memory.check_cma(str(meminfo), str(host))
    except ValueError as exc:
        raise AnsibleFilterError(f"{host}: CMA check: {exc}") from exc
