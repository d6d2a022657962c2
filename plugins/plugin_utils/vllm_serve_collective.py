# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of vllm_serve's two-rank collective; thin wrappers over
plugins/module_utils/rank_collective.py (the vllm_serve filter's operations)."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils import rank_collective


def vllm_serve_collective_plan(nodes, hostvars, enabled=True):
    """Whether the collective runs: {run, reason, stale}."""
    table = {}
    for node in [str(n) for n in nodes]:
        answer = hostvars[node].get("_vllm_serve_collective_stamp") or {}
        table[node] = {
            "image_id": str((answer.get("inputs") or {}).get("image_id") or ""),
            "stamp": dict(answer),
        }
    return rank_collective.plan(bool(enabled), table)


def vllm_serve_collective_check(
    nodes, hostvars, require_ib=False, nccl_library="image", image="", backend=""
):
    """Every node's rank output -> {passed, message, failed, nodes: {node: parsed}}."""
    outputs, hcas = {}, {}
    for node in [str(n) for n in nodes]:
        run = hostvars[node].get("_vllm_serve_collective_out") or {}
        outputs[node] = {
            "output": str(run.get("output") or ""),
            "rc": run.get("rc"),
            "timed_out": bool(run.get("timed_out")),
        }
        hcas[node] = str(hostvars[node].get("_vllm_serve_collective_ib_hca") or "")
    return rank_collective.decide(
        outputs, bool(require_ib), str(nccl_library), hcas, str(image), str(backend)
    )


def vllm_serve_collective_result(parsed):
    """What a node's stamp keeps as its result after the collective passed."""
    return rank_collective.stamp_result(dict(parsed))
