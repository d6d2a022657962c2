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

import json

from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import digest

LINK_CHECK_MODES = ("auto", "always", "never")
LINK_CHECK_RECORD_FORMAT = 1
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


def settings_fingerprint(settings: dict) -> str:
    """A short digest of the settings a link check measured (canonical JSON, SHA-256)."""
    return digest(settings, 16)


def read_link_record(text: str | None) -> dict | None:
    """A node's record of its last passed link check, or None when absent or unreadable."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != LINK_CHECK_RECORD_FORMAT:
        return None
    if not isinstance(data.get("settings"), dict):
        return None
    return data


def link_record(settings: dict, checked_at: str, results: list[str] | None = None) -> dict:
    """The record a node keeps after its link check passed."""
    return {
        "format": LINK_CHECK_RECORD_FORMAT,
        "fingerprint": settings_fingerprint(settings),
        "settings": settings,
        "checked_at": checked_at,
        "results": list(results or []),
    }


def _changed_keys(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


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
        if not record:
            stale[name] = "no passed link check recorded (first deploy)"
            continue
        if record.get("fingerprint") != settings_fingerprint(node["settings"]):
            keys = _changed_keys(record.get("settings") or {}, node["settings"])
            stale[name] = "changed since the last passed check: " + (", ".join(keys) or "settings")
            continue
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
