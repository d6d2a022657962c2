# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The two-rank collective that vllm_serve runs in the serving image before the ranks start.

``roles/vllm_serve/files/rank_collective.py`` runs one rank per node, in a container made
with the Ray containers' settings (the ranks' devices, mounts, environment and network), and
prints NCCL's ``NCCL_DEBUG=INFO`` lines and one line ``dgx-spark-collective: {json}``. This
module reads that output on the controller and decides:

* :func:`parse_output`: one node's output -> its result line, the NCCL version and transport
  (``link_checks.nccl_transport``), the library the rank loaded, the last error, a hang;
* :func:`decide`: every node's output -> pass or a message that names the NCCL version, the
  transport and what to try;
* :func:`plan`: whether the check runs: only when a node's stamp ``collective``
  (dgx_spark.cluster.stamp) does not hold for the image ID and the comm settings this run
  would start the ranks with;
* :func:`stamp_result`: what each node's stamp keeps as the result of a passed check.
"""

from __future__ import annotations

import json
import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.link_checks import (
    nccl_device_mismatch,
    nccl_transport,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.nccl_choice import (
    RECOMMENDED_NCCL,
    in_hang_range,
)

MARK = "dgx-spark-collective: "
NCCL_LIBRARY_MODES = ("auto", "image", "host")
# faulthandler.dump_traceback_later prints this when the script's own deadline passes.
_HANG = re.compile(r"^Timeout \(\d+:\d\d:\d\d\)!", re.M)
_NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_ERROR = re.compile(r"^(?:[\w.]+(?:Error|Exception)|torch\.\w+\.\w+Error)\b.*$", re.M)


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``2.28.9+cuda13.0`` or ``2.28.9`` -> (2, 28, 9); () when there is no version."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", str(text or ""))
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def nccl_version(log: str) -> str:
    """The version NCCL printed at init (``NCCL version 2.28.9+cuda13.0``), '' when none."""
    found = _NCCL_VERSION.findall(log or "")
    return found[0] if found else ""


def result_line(text: str) -> dict | None:
    """The script's ``dgx-spark-collective: {json}`` line, or None."""
    for line in reversed((text or "").splitlines()):
        index = line.find(MARK)
        if index < 0:
            continue
        try:
            data = json.loads(line[index + len(MARK) :])
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def parse_output(text: str) -> dict:
    """What one rank's output says: ``result`` (the JSON line or None), ``nccl_version``,
    ``transport`` (link_checks' record; ``gloo`` for a Gloo run), ``library``, ``error``
    (the last exception line) and ``hung`` (the script's deadline passed)."""
    text = text or ""
    result = result_line(text)
    backend = (result or {}).get("backend", "")
    has_nccl = "NCCL INFO" in text
    if backend == "gloo" or (not has_nccl and backend != "nccl"):
        transport = {"transport": "gloo" if backend == "gloo" else "unknown"}
    else:
        transport = nccl_transport(text)
    version = nccl_version(text) or str((result or {}).get("nccl_version") or "")
    errors = _ERROR.findall(text)
    return {
        "result": result,
        "backend": backend,
        "nccl_version": version,
        "transport": transport,
        "library": str((result or {}).get("nccl_library") or ""),
        "error": errors[-1].strip() if errors else "",
        "hung": bool(_HANG.search(text)),
    }


def _advice(
    parsed: dict, nccl_library: str, require_ib: bool, timed_out: bool, devices: bool
) -> list[str]:
    tries = []
    version = version_tuple(parsed["nccl_version"])
    if version and version < RECOMMENDED_NCCL:
        wanted = ".".join(map(str, RECOMMENDED_NCCL))
        if nccl_library != "host":
            tries.append(
                "spark_nccl_library: host (the ranks load the node's libnccl instead of the "
                "image's, the public cure for TP=2 hangs on two Sparks)"
            )
        reported = "2.28.x has public deadlock reports on GB10 pairs"
        tries.append(
            f"NCCL >= {wanted} ({reported if in_hang_range(version[:3]) else 'recommended'})"
        )
    kind = parsed["transport"].get("transport", "unknown")
    if require_ib and (kind != "IB" or devices):
        tries.append(
            "NCCL_IB_HCA in comm.env naming the cabled port's RoCE devices (host_prep derives "
            "it from ibdev2netdev), NCCL_IB_DISABLE=0, /dev/infiniband and IPC_LOCK in "
            "spark_container_devices / spark_container_capabilities"
        )
    if parsed["result"] is None and not parsed["nccl_version"]:
        tries.append(
            "the head's fast-link address and the check's port reachable from every node "
            "(spark_fast_ip, the firewall, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in comm.env)"
        )
    if timed_out or parsed["hung"]:
        tries.append("a longer vllm_serve_collective_timeout if the pair was busy")
    if not tries:
        tries.append("NCCL_DEBUG=INFO in the output above; vllm_serve_collective: false skips it")
    return tries


def _summary(node: str, parsed: dict) -> str:
    result = parsed["result"] or {}
    kind = parsed["transport"].get("transport", "unknown")
    gdr = "/GDRDMA" if parsed["transport"].get("gdr") else ""
    parts = [f"{node}: {result.get('op', 'collective')} over {result.get('world_size', '?')} ranks"]
    parts.append(f"backend {result.get('backend', '?')}")
    if parsed["backend"] != "gloo":
        parts.append(f"NCCL {parsed['nccl_version'] or 'unknown'}")
    parts.append(f"transport {kind}{gdr}")
    if "busbw_gbps" in result:
        parts.append(f"busbw {result['busbw_gbps']} GB/s")
    if "elapsed_s" in result:
        parts.append(f"{result['elapsed_s']} s")
    return ", ".join(parts)


def decide(
    nodes: dict,
    require_ib: bool = False,
    nccl_library: str = "image",
    ib_hca: dict | None = None,
    image: str = "",
    backend: str = "",
) -> dict:
    """Pass or fail for every node's rank at once.

    ``nodes`` maps each node to ``{"output": str, "rc": int | None, "timed_out": bool}``
    (``rc`` None when the rank did not finish); ``backend`` is the one expected (``gloo`` off
    hardware), for the message of a rank that failed before it said. ``ib_hca`` maps a node
    to its NCCL_IB_HCA; with ``require_ib`` NCCL must have run NET/IB on exactly those devices.
    Returns
    ``{passed, message, nodes: {node: parsed}, failed: [nodes]}``.
    """
    parsed_nodes, failures, lines = {}, [], []
    for node in sorted(nodes):
        entry = nodes[node] or {}
        parsed = parse_output(str(entry.get("output") or ""))
        if (
            not parsed["backend"]
            and backend == "gloo"
            and "NCCL INFO" not in entry.get("output", "")
        ):
            parsed["backend"] = "gloo"
            parsed["transport"] = {"transport": "gloo"}
        parsed_nodes[node] = parsed
        timed_out = bool(entry.get("timed_out")) or parsed["hung"]
        reasons = []
        devices = False
        result = parsed["result"]
        if timed_out:
            reasons.append("did not finish within the timeout (a hang)")
        elif entry.get("rc") not in (0, None) or result is None:
            reasons.append(
                f"failed (exit {entry.get('rc')}): {parsed['error'] or 'no result line'}"
            )
        elif result.get("wrong"):
            reasons.append(f"{result['wrong']} wrong values after the collective")
        if require_ib and not reasons and parsed["backend"] == "nccl":
            mismatch = nccl_device_mismatch(parsed["transport"], (ib_hca or {}).get(node))
            if mismatch:
                devices = True
                reasons.append(mismatch)
        if reasons:
            kind = parsed["transport"].get("transport", "unknown")
            version = parsed["nccl_version"] or "unknown (no NCCL init line)"
            if parsed["backend"] == "gloo":
                seen = "backend gloo"
            else:
                seen = f"NCCL {version}, transport {kind}"
            tries = _advice(parsed, nccl_library, require_ib, timed_out, devices)
            failures.append(node)
            lines.append(
                f"{node}: the two-rank collective in {image or 'the serving image'}: "
                f"{'; '.join(reasons)}; {seen}"
                + (f", library {parsed['library']}" if parsed["library"] else "")
                + f" (spark_nccl_library: {nccl_library}). Try: {'; '.join(tries)}"
            )
        else:
            lines.append(_summary(node, parsed))
    if failures:
        lines.append("Nothing serving was touched: the running group keeps serving.")
    return {
        "passed": not failures,
        "failed": failures,
        "message": "\n".join(lines),
        "nodes": parsed_nodes,
    }


def stamp_result(parsed: dict) -> dict:
    """What a node's stamp ``collective`` keeps as its result after the collective passed
    (``parsed`` from :func:`parse_output`)."""
    result = parsed.get("result") or {}
    return {
        "backend": result.get("backend", ""),
        "op": result.get("op", ""),
        "nccl_version": parsed.get("nccl_version", ""),
        "nccl_library": parsed.get("library", ""),
        "transport": (parsed.get("transport") or {}).get("transport", ""),
        "busbw_gbps": result.get("busbw_gbps"),
        "elapsed_s": result.get("elapsed_s"),
    }


def plan(enabled: bool, nodes: dict) -> dict:
    """Whether the collective runs, for every node at once.

    ``nodes`` maps each node to ``{"image_id": the image the ranks are to run, "stamp": the
    stamp module's check answer ({valid, reason}) for it and the comm settings}``. Returns
    ``{run, reason, stale}``; ``stale`` names each node whose stamp does not hold, with why.
    """
    if not enabled:
        return {"run": False, "reason": "vllm_serve_collective is false", "stale": {}}
    missing = sorted(n for n in nodes if not (nodes[n] or {}).get("image_id"))
    if missing:
        return {
            "run": False,
            "reason": f"the serving image is not on {', '.join(missing)}",
            "stale": {},
        }
    answers = {n: (nodes[n] or {}).get("stamp") or {} for n in sorted(nodes)}
    stale = {
        n: a.get("reason") or "runs: no stamp" for n, a in answers.items() if not a.get("valid")
    }
    if stale:
        return {
            "run": True,
            "reason": "; ".join(f"{n}: {r}" for n, r in stale.items()),
            "stale": stale,
        }
    return {
        "run": False,
        "reason": "; ".join(f"{n}: {a.get('reason', '')}" for n, a in answers.items()),
        "stale": {},
    }
