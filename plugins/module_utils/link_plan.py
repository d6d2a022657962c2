# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""When host_prep runs the link benchmarks, and the record each node keeps of its last pass.

The RDMA and NCCL benchmarks load the link and the GPUs for minutes. host_prep runs them on
the first deploy, when the link or its settings changed since the last passed run, or when
asked (host_prep_link_check=always); never automatically while a serving container holds
the GPUs. Each node keeps a record of the settings its last passed run measured.

The benchmarks' output and their pass/fail thresholds are ``link_checks.py``'s; this file only
plans the run. Pure standard library, no I/O.
"""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import (
    inputs_changed,
    read_stage_record,
)

LINK_CHECK_MODES = ("auto", "always", "never")
SERVING_LABEL = ("dgx_spark.cluster.component", "vllm")


def serving_containers(containers: list[dict] | None, name: str) -> list[str]:
    """Names of the running serving containers in docker_host_info's (verbose) container list.

    A container counts when it is named ``name`` (the serving container's name,
    spark_serving_container_name) or carries the label ``dgx_spark.cluster.component=vllm``.
    """
    found = []
    for entry in containers or []:
        names = [str(n).lstrip("/") for n in entry.get("Names") or []]
        labels = entry.get("Labels") or {}
        state = str(entry.get("State", "running")).lower()
        if state != "running":
            continue
        if name in names or labels.get(SERVING_LABEL[0]) == SERVING_LABEL[1]:
            found.append(names[0] if names else str(entry.get("Id", "?"))[:12])
    return sorted(found)


def read_link_record(text: str | None) -> dict | None:
    """A node's record of its last passed link check (deployment_record's shape, the
    settings it measured as inputs, written by deployment_state with state=kept), or None
    when absent or unreadable."""
    return read_stage_record(text, required=("inputs", "checked_at"))


def plan_link_check(mode: str, hardware: bool, nodes: dict[str, dict]) -> dict:
    """Whether the link benchmarks run this time, for all nodes at once.

    ``nodes`` maps each node to ``{"settings": dict, "record": dict | None, "serving":
    [container names]}``. Returns ``{run, reason, stale}``: ``stale`` names each node whose
    settings have no passed check yet, with why.
    """
    if mode not in LINK_CHECK_MODES:
        raise ValueError(
            f"host_prep_link_check is {mode!r}; allowed: {', '.join(LINK_CHECK_MODES)}"
        )
    stale: dict[str, str] = {}
    dates = set()
    for name in sorted(nodes):
        node = nodes[name]
        record = node.get("record")
        changed = inputs_changed(record, node["settings"])
        if changed is None:
            stale[name] = "no passed link check recorded (first deploy)"
        elif changed:
            stale[name] = "changed since the last passed check: " + ", ".join(changed)
        else:
            dates.add(str(record.get("checked_at", "?")))
    serving = {n: nodes[n]["serving"] for n in sorted(nodes) if nodes[n].get("serving")}
    holding = "; ".join(f"{', '.join(c)} on {n}" for n, c in serving.items())

    def plan(run: bool, reason: str) -> dict:
        return {"run": run, "reason": reason, "stale": stale, "serving": serving}

    if not hardware:
        return plan(False, "hardware-only: the benchmarks need the ConnectX-7 link and GPUs")
    if mode == "never":
        return plan(False, "host_prep_link_check=never")
    if mode == "always":
        extra = f"; while {holding} holds the GPUs (asked for)" if serving else ""
        return plan(True, "host_prep_link_check=always" + extra)
    if not stale:
        when = ", ".join(sorted(dates))
        return plan(False, f"unchanged since the passed link check of {when} on every node")
    why = "; ".join(f"{n}: {r}" for n, r in stale.items())
    if serving:
        return plan(
            False,
            f"due ({why}), but {holding} holds the GPUs: the link is not measured "
            "automatically while serving. Stop serving (playbooks/teardown.yml) and rerun, "
            "or set host_prep_link_check=always to measure beside it",
        )
    return plan(True, why)
