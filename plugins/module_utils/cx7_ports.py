# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which ConnectX-7 QSFP port is cabled, read from ``ibdev2netdev``, and the links it gives.

A DGX Spark's ConnectX-7 shows each QSFP port as two PCIe functions, one behind each PCIe x4
link of the GB10 ("twins"): QSFP port N is the netdevs ``enp1s0f<N>np<N>`` (PCIe domain 0)
and ``enP2p1s0f<N>np<N>`` (domain 2), backed by the RoCE devices ``rocep1s0f<N>`` and
``roceP2p1s0f<N>``. Which twins come Up depends on the port the cable is in. ``ibdev2netdev``
prints one line per RoCE device, ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)``, where ``port 1``
is the RoCE device's own port (always 1 here) and the state is the netdev's carrier.

``name_links`` fills in the ``netdev`` and ``roce`` of every ``host_prep_cx7_links`` entry
that leaves them to discovery (omitted or ``auto``): entry n takes twin n (domain order) of
the cabled port. A name the inventory pins must be Up. Every refusal names the variable, the
node, what ``ibdev2netdev`` showed and the fix, so preflight stops before any change. Where no
RoCE device's netdev is named like a Spark's ConnectX-7 function (renamed interfaces, another
host, the simulated pair's stand-in), no port can be found by name: the entries left to
discovery stay ``auto`` for ``fast_link`` (the interface that carries ``spark_fast_ip``).

Pure standard library, no I/O.
"""

from __future__ import annotations

import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.fast_link import AUTO, VAR
from ansible_collections.dgx_spark.cluster.plugins.module_utils.link_checks import (
    CheckOutputError,
    parse_ibdev2netdev,
)

UP = "Up"
# The netdev of one ConnectX PCIe function: en[P<domain>]p<bus>s<slot>f<function>np<port>.
_TWIN = re.compile(r"^en(?:P(?P<domain>\d+))?p\d+s\d+f\d+np(?P<port>\d+)$")


def qsfp_ports(entries: list[dict]) -> dict[int, list[dict]]:
    """Parsed ``ibdev2netdev`` entries -> {QSFP port: its twins in PCIe domain order}.

    Each twin is the entry plus ``qsfp`` and ``domain``; entries whose netdev is not named
    like a ConnectX function (``...np<N>``) belong to no port and are left out.
    """
    ports: dict[int, list[dict]] = {}
    for entry in entries:
        m = _TWIN.match(entry["netdev"])
        if m:
            twin = {**entry, "qsfp": int(m["port"]), "domain": int(m["domain"] or 0)}
            ports.setdefault(twin["qsfp"], []).append(twin)
    for twins in ports.values():
        twins.sort(key=lambda t: (t["domain"], t["netdev"]))
    return dict(sorted(ports.items()))


def _pair(entry: dict) -> str:
    return f"{entry['netdev']} ({entry['roce']})"


def _port_states(ports: dict[int, list[dict]]) -> str:
    return "; ".join(
        f"QSFP port {p}: " + ", ".join(f"{_pair(t)} {t['state']}" for t in twins)
        for p, twins in ports.items()
    )


def _no_cable(host: str, entries: list[dict], ports: dict[int, list[dict]]) -> str:
    if not entries:
        return (
            f"{host}: ibdev2netdev lists no RoCE device, so {VAR} has no ConnectX-7 port to "
            "use: no Mellanox netdev is visible (spark_hardware is true only on Sparks; the "
            "simulated pair sets it false)"
        )
    grouped = {t["netdev"] for twins in ports.values() for t in twins}
    other = [f"{_pair(e)} {e['state']}" for e in entries if e["netdev"] not in grouped]
    parts = [_port_states(ports)] if ports else []
    if other:
        parts.append("other: " + ", ".join(other))
    seen = "; ".join(parts)
    return (
        f"{host}: no ConnectX-7 port is Up, so {VAR} has no cabled port to use "
        f"(ibdev2netdev: {seen}). Seat the QSFP cable firmly at both ends (NVIDIA's two-Spark "
        "guide uses the same port on both Sparks) and make sure the peer is powered on; if no "
        "port comes Up, reboot both Sparks and run again"
    )


def _pinned_refusal(
    where: str, kind: str, name: str, entry: dict | None, ports: dict, up: list[dict]
) -> str:
    """Why a name pinned in the inventory cannot be used (it is not Up), with the Up one."""
    state = f"shows {entry['state']}" if entry else "does not list"
    head = f"{where}.{kind} is pinned to {name}, which ibdev2netdev {state}"
    twin = next(
        (t for twins in ports.values() for t in twins if entry and t["netdev"] == entry["netdev"]),
        None,
    )
    if twin is not None and any(t["state"] == UP for t in ports[twin["qsfp"]]):
        alive = [t for t in ports[twin["qsfp"]] if t["state"] == UP]
        return (
            f"{head}, while its twin {', '.join(_pair(t) for t in alive)} on the same QSFP port "
            f"{twin['qsfp']} is Up: the cable is in, but this PCIe half of the port has no "
            "carrier. Reseat the QSFP cable at both ends and reboot both Sparks if it stays "
            f"Down, or remove this entry from {VAR} (one twin carries about half the bandwidth)"
        )
    cabled = [t for twins in ports.values() for t in twins if t["state"] == UP]
    if not cabled:
        shown = ", ".join(_pair(e) for e in up) or "none"
        return f"{head}; Up: {shown}. Set {kind} to an Up one"
    # The Up twin on the same PCIe domain is the one this entry was meant to be.
    domain = twin["domain"] if twin else 0
    same = [t for t in cabled if t["domain"] == domain] or cabled
    suggestion = same[0][kind]
    return (
        f"{head}; the Up one is {suggestion} (QSFP port {same[0]['qsfp']} is the cabled one; "
        f"Up: {', '.join(_pair(t) for t in cabled)}). Set {kind} to {suggestion}, or leave it "
        "out (auto) so host_prep uses the cabled port's twins"
    )


def _pin(index: int, link: dict, host: str, entries: list[dict], ports: dict):
    """An entry that names its netdev or RoCE device: (the ibdev2netdev entry or None, errors)."""
    where = f"{host}: {VAR}[{index}]"
    by_netdev = {e["netdev"]: e for e in entries}
    by_roce = {e["roce"]: e for e in entries}
    up = [e for e in entries if e["state"] == UP]
    netdev = str(link.get("netdev") or AUTO)
    roce = str(link.get("roce") or AUTO)
    chosen, errors = None, []
    if netdev != AUTO:
        chosen = by_netdev.get(netdev)
        if chosen is None or chosen["state"] != UP:
            errors.append(_pinned_refusal(where, "netdev", netdev, chosen, ports, up))
    if roce != AUTO:
        entry = by_roce.get(roce)
        refused_already = errors and entry is not None and entry is chosen
        if (entry is None or entry["state"] != UP) and not refused_already:
            errors.append(_pinned_refusal(where, "roce", roce, entry, ports, up))
        elif chosen is None and netdev == AUTO:
            chosen = entry
    return chosen, errors


def _candidates(host: str, ports: dict, taken: set[str], wanted: list[int]) -> tuple[list, list]:
    """The twins the entries left to discovery take, in order, or why there are none."""
    up_ports = [p for p, twins in ports.items() if any(t["state"] == UP for t in twins)]
    free = [t for p in up_ports for t in ports[p] if t["netdev"] not in taken]
    named = ", ".join(f"{VAR}[{i}]" for i in wanted)
    if len(up_ports) > 1 and len(wanted) < len(free):
        return [], [
            f"{host}: both QSFP ports are Up ({_port_states(ports)}), so which one is cabled to "
            f"the peer is ambiguous for {named}: pin their netdev to the twins of the port that "
            f"reaches the peer, or list one link per Up twin ({len(free)}) when both ports are "
            "cabled to it"
        ]
    if len(wanted) > len(free):
        have = ", ".join(_pair(t) for t in free) or "none"
        return [], [
            f"{host}: {VAR} leaves {len(wanted)} entries ({named}) to discovery, but the cabled "
            f"port has {len(free)} twin(s) left for them ({have}); a QSFP port has two twins: "
            f"list at most {len(free)} there, or pin the others' netdev"
        ]
    return free[: len(wanted)], []


def _twin_down(host: str, index: int, twin: dict, ports: dict) -> str:
    up = [t for t in ports[twin["qsfp"]] if t["state"] == UP]
    return (
        f"{host}: {VAR}[{index}] takes twin {_pair(twin)} of the cabled QSFP port "
        f"{twin['qsfp']}, which ibdev2netdev shows {twin['state']} while "
        f"{', '.join(_pair(t) for t in up)} is Up: the cable is in, but one PCIe half of the "
        "port has no carrier. Reseat the QSFP cable at both ends and reboot both Sparks if it "
        f"stays Down, or keep in {VAR} only the Up twin(s) (one twin carries about half the "
        "bandwidth)"
    )


def _named(link: object, entry: dict | None) -> object:
    """The inventory's entry with the netdev and RoCE device it was given (a pinned one stays)."""
    if entry is None or not isinstance(link, dict):
        return link
    roce = str(link.get("roce") or AUTO)
    return {**link, "netdev": entry["netdev"], "roce": entry["roce"] if roce == AUTO else roce}


def name_links(links: object, text: str, host: str, rc: int = 0, error: str = "") -> dict:
    """Name every link's netdev and RoCE device from ``ibdev2netdev`` output (``text``).

    Returns ``{"links", "ports", "errors", "warnings", "message"}``: ``links`` is the
    inventory's list with discovered ``netdev`` and ``roce`` filled in (entries that are not
    dicts are passed on unchanged for ``fast_link.resolve_links`` to refuse), ``ports`` the
    QSFP ports that are Up. ``rc``/``error`` are the command's exit status and error text.
    """
    out = {"links": links, "ports": [], "errors": [], "warnings": [], "message": ""}
    if rc:
        out["errors"].append(
            f"{host}: ibdev2netdev failed (rc {rc}{': ' + error.strip() if error.strip() else ''})"
            "; it maps the RoCE devices to the ConnectX-7 netdevs on a Spark (DGX OS ships it "
            "with DOCA-OFED, and it needs the mlx5 RDMA driver loaded)"
        )
        return out
    try:
        entries = parse_ibdev2netdev(str(text))
    except CheckOutputError as exc:
        out["errors"].append(f"{host}: cannot read the ibdev2netdev output: {exc}")
        return out
    if not isinstance(links, list):
        return out
    ports = qsfp_ports(entries)
    out["ports"] = [p for p, twins in ports.items() if any(t["state"] == UP for t in twins)]
    if not entries or (ports and not out["ports"]):
        out["errors"].append(_no_cable(host, entries, ports))
        return out
    chosen: dict[int, dict] = {}
    wanted = []
    for index, link in enumerate(links):
        if not isinstance(link, dict):
            continue
        if str(link.get("netdev") or AUTO) == AUTO and str(link.get("roce") or AUTO) == AUTO:
            wanted.append(index)
            continue
        entry, errors = _pin(index, link, host, entries, ports)
        out["errors"].extend(errors)
        if entry is not None:
            chosen[index] = entry
    # RoCE devices not named like a Spark's ConnectX-7 functions (another host, or renamed
    # netdevs): no port to find by name, so the entries left to discovery stay auto.
    if wanted and ports:
        taken = {e["netdev"] for e in chosen.values()}
        twins, errors = _candidates(host, ports, taken, wanted)
        out["errors"].extend(errors)
        for pos, twin in enumerate(twins):
            index = wanted[pos]
            if twin["state"] != UP:
                out["errors"].append(_twin_down(host, index, twin, ports))
            chosen[index] = twin
    out["links"] = [_named(link, chosen.get(i)) for i, link in enumerate(links)]
    if out["errors"]:
        return out
    if not ports:
        up = ", ".join(_pair(e) for e in entries if e["state"] == UP) or "none"
        out["message"] = (
            f"{host}: ibdev2netdev names no ConnectX-7 function the Spark way (en...np<N>), so "
            f"no QSFP port is found by name: {VAR} is used as given, auto being the interface "
            f"that carries spark_fast_ip (Up: {up})"
        )
        return out
    used = {e["netdev"] for e in chosen.values()}
    for port in out["ports"]:
        idle = [t for t in ports[port] if t["state"] == UP and t["netdev"] not in used]
        if idle and used & {t["netdev"] for t in ports[port]}:
            out["warnings"].append(
                f"{host}: {', '.join(_pair(t) for t in idle)} of the cabled QSFP port {port} is "
                f"Up but no entry of {VAR} uses it, so NCCL_IB_HCA leaves it out and RDMA gets "
                "about half the port's bandwidth; add a link (its own subnet) for it"
            )
    shown = ", ".join(
        f"{VAR}[{i}] = {_pair(chosen[i])}" for i in sorted(chosen) if chosen[i]["state"] == UP
    )
    cabled = (
        f"QSFP port {out['ports'][0]} is"
        if len(out["ports"]) == 1
        else f"QSFP ports {' and '.join(str(p) for p in out['ports'])} are"
    )
    out["message"] = f"{host}: {cabled} cabled (Up): {shown}"
    return out


# NVIDIA's "Connect Two Sparks" playbook, step 2: "Make sure to use the same physical port on
# each device to prevent issues with NCCL tests."
# https://github.com/NVIDIA/dgx-spark-playbooks/blob/main/nvidia/connect-two-sparks/README.md
SAME_PORT_GUIDE = "github.com/NVIDIA/dgx-spark-playbooks/blob/main/nvidia/connect-two-sparks"


def _one_port(ports: object) -> int | None:
    """A node's cabled QSFP port (``name_links``'s ``ports``, or a bare number), or None when
    it is not known: no port Up, both Up, or not a port number."""
    if isinstance(ports, (list, tuple)):
        if len(ports) != 1:
            return None
        ports = ports[0]
    if isinstance(ports, bool):
        return None
    if isinstance(ports, int):
        return ports
    if isinstance(ports, str) and ports.strip().isdigit():
        return int(ports)
    return None


def port_mismatch(ports_by_node: dict) -> list[str]:
    """A warning when the nodes' cables sit in different QSFP ports, else ``[]``.

    ``ports_by_node`` maps each node to its cabled port as ``name_links`` found it (its
    ``ports``: ``[0]`` or ``[1]``). A node whose port is not known (no port or both ports Up,
    or no ConnectX-7 named the Spark way) is left out; with fewer than two known, or all the
    same, there is nothing to say.
    """
    known = {str(host): _one_port(ports) for host, ports in (ports_by_node or {}).items()}
    known = {host: port for host, port in sorted(known.items()) if port is not None}
    if len(known) < 2 or len(set(known.values())) == 1:
        return []
    each = ", ".join(f"{host} QSFP port {port}" for host, port in known.items())
    return [
        f"the nodes' cables sit in different QSFP ports ({each}): NVIDIA's two-Spark guide "
        "puts the cable in the same physical port on both Sparks, its step 2 says to avoid "
        f"NCCL test problems ({SAME_PORT_GUIDE}). Move one end so both use the same port "
        "number, then run again"
    ]
