# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of vllm_serve's two-rank collective; thin wrappers over
plugins/module_utils/rank_collective.py (the vllm_serve filter's operations)."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils import rank_collective
from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import digest


def vllm_serve_collective_digest(settings):
    """A short digest of the ranks' comm settings (the collective record's ``comm`` input)."""
    return digest(dict(settings), 16)


def vllm_serve_collective_plan(nodes, hostvars, enabled=True):
    """Whether the collective runs: {run, reason, stale}."""
    table = {}
    for node in [str(n) for n in nodes]:
        facts = hostvars[node].get("_vllm_serve_collective_node") or {}
        inputs = facts.get("inputs") or {}
        table[node] = {
            "inputs": {"image_id": str(inputs.get("image_id") or ""), "comm": inputs.get("comm")},
            "record": rank_collective.read_record(facts.get("record_text")),
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


def vllm_serve_collective_kept(parsed, checked_at):
    """What a node's record keeps beside its inputs after the collective passed."""
    return rank_collective.kept(dict(parsed), str(checked_at))
