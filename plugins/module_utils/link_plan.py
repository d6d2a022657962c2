# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""When host_prep runs the link benchmarks.

The RDMA and NCCL benchmarks load the link and the GPUs for minutes. host_prep runs them on
the first deploy, when the link or its settings changed since the last passed run (each
node's stamp ``link-check``, dgx_spark.cluster.stamp), or when asked
(host_prep_link_check=always); never automatically while a serving container holds the GPUs.

The benchmarks' output and their pass/fail thresholds are ``link_checks.py``'s; this file only
plans the run. Pure standard library, no I/O.
"""

from __future__ import annotations

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


def plan_link_check(mode: str, hardware: bool, nodes: dict[str, dict]) -> dict:
    """Whether the link benchmarks run this time, for all nodes at once.

    ``nodes`` maps each node to ``{"stamp": the stamp module's check answer ({valid, reason}),
    "serving": [container names]}``. Returns ``{run, reason, stale, serving}``: ``stale`` names
    each node whose stamp does not hold, with the stamp's reason.
    """
    if mode not in LINK_CHECK_MODES:
        raise ValueError(
            f"host_prep_link_check is {mode!r}; allowed: {', '.join(LINK_CHECK_MODES)}"
        )
    stale: dict[str, str] = {}
    skips = []
    for name in sorted(nodes):
        answer = nodes[name].get("stamp") or {}
        if answer.get("valid"):
            skips.append(f"{name}: {answer.get('reason', '')}")
        else:
            stale[name] = answer.get("reason") or "runs: no stamp"
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
        return plan(False, "; ".join(skips))
    why = "; ".join(f"{n}: {r}" for n, r in stale.items())
    if serving:
        return plan(
            False,
            f"due ({why}), but {holding} holds the GPUs: the link is not measured "
            "automatically while serving. Stop serving (playbooks/teardown.yml) and rerun, "
            "or set host_prep_link_check=always to measure beside it",
        )
    return plan(True, why)
