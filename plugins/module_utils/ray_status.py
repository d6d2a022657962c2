# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Alive nodes and GPUs from the text ``ray status`` prints (Ray 2.x autoscaler summary)."""

from __future__ import annotations

import re

_SECTION = re.compile(
    r"^(Active|Idle|Pending|Recent failures|(?:Total )?Usage|Total Constraints|Total Demands"
    r"|From request_resources|Pending Demands):\s*$"
)
_NODE = re.compile(r"^\s*(\d+)\s+(\S+)")
# " 2.0/2.0 GPU (2.0 used of 2.0 reserved in placement groups)", " 0B/32.73GiB memory"
_RESOURCE = re.compile(r"^\s*([0-9.]+)([A-Za-z]*)/([0-9.]+)([A-Za-z]*)\s+(\S+)(?:\s+\(.*\))?\s*$")


def parse(text: str) -> dict:
    """``alive_nodes`` (active and idle), ``pending_nodes``, and every resource's use.

    ``resources`` maps a resource name (``GPU``, ``CPU``, ...) to ``{used, total}``; memory
    figures keep their unit in ``unit``. ``parsed`` is false when the text holds no node
    section at all (Ray not reachable, or not ``ray status`` output).
    """
    section = None
    alive = pending = 0
    node_ids: list[str] = []
    resources: dict[str, dict] = {}
    demands: list[str] = []
    seen_nodes = False
    for line in text.splitlines():
        header = _SECTION.match(line.strip())
        if header:
            section = header.group(1)
            seen_nodes = seen_nodes or section in ("Active", "Idle", "Pending")
            continue
        if line.startswith("---") or line.startswith("==="):
            continue
        if not line.strip():
            continue
        if line.startswith("Node: "):
            break  # `ray status -v` goes on per node; the totals above are the cluster's
        if section in ("Active", "Idle", "Pending"):
            match = _NODE.match(line)
            if not match:
                continue
            if section == "Pending":
                pending += int(match.group(1))
            else:
                alive += int(match.group(1))
                node_ids.append(match.group(2))
        elif section in ("Pending Demands", "Total Demands"):
            if not line.strip().startswith("("):  # "(no resource demands)"
                demands.append(line.strip())
        elif section in ("Usage", "Total Usage"):
            match = _RESOURCE.match(line)
            if match:
                used, used_unit, total, total_unit, name = match.groups()
                entry = {"used": float(used), "total": float(total)}
                if used_unit or total_unit:
                    entry["unit"] = total_unit or used_unit
                resources[name] = entry
    gpus = resources.get("GPU", {"used": 0.0, "total": 0.0})
    return {
        "parsed": seen_nodes,
        "alive_nodes": alive,
        "pending_nodes": pending,
        "node_ids": node_ids,
        "gpus_total": gpus["total"],
        "gpus_used": gpus["used"],
        "resources": resources,
        "demands": demands,
    }


def failed_start_view(text: str, expected_nodes: int) -> str:
    """Ray's view when a start under its executor did not serve, in one sentence: the nodes
    alive against those expected, the GPUs in use, and what waits for resources (a
    placement group that cannot be placed: a node missing, or GPUs an earlier group holds)."""
    parsed = parse(text)
    if not parsed["parsed"]:
        last = [line.strip() for line in text.strip().splitlines() if line.strip()][-1:]
        return f"Ray then: its status was not readable ({last[0] if last else 'no output'})"
    said = (
        f"Ray then: {parsed['alive_nodes']} of {expected_nodes} nodes alive, "
        f"{parsed['gpus_used']:g} of {parsed['gpus_total']:g} GPUs in use"
    )
    if parsed["demands"]:
        said += "; waiting for resources: " + "; ".join(parsed["demands"])
    return said
