# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fast link of each node, from the inventory and the node's own facts.

``host_prep_cx7_links`` lists a node's ConnectX-7 twins: ``netdev`` (or ``auto``: the
interface that carries ``spark_fast_ip`` now), ``roce`` (optional; the RoCE device that backs
the netdev, from ``ibdev2netdev`` on hardware) and ``address`` (``IP/prefix``, one subnet per
twin). On a Spark, ``cx7_ports.name_links`` has already named every ``auto`` entry from the
cabled QSFP port, so ``auto`` reaches this module only off hardware. This module

* checks one node's list against its facts (``resolve_links``) and all nodes' lists against
  each other (``cross_check``), returning messages that name the variable and the node;
* derives the communication environment the serving containers use (``comm_env``): one
  interface for every socket-based library, every twin's RoCE device for NCCL;
* names the fast-link addresses for /etc/hosts and known_hosts (``host_entries``), and lists
  the peer addresses each node must reach over each twin (``peer_targets``).

Pure standard library, no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

VAR = "host_prep_cx7_links"
# IPv6's minimum link MTU up to the mlx5 driver's largest (ConnectX-7 max_mtu 9978).
MTU_MIN = 1280
MTU_MAX = 9978
AUTO = "auto"

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")  # IFNAMSIZ - 1
_ROCE = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def interfaces_from_facts(facts: dict) -> dict[str, dict]:
    """Ansible facts -> {netdev: {"ipv4": [addresses], "mtu": int|None}}."""
    out = {}
    for name in facts.get("interfaces", []) or []:
        data = facts.get(name) or facts.get(name.replace("-", "_")) or {}
        addresses = []
        primary = data.get("ipv4") or {}
        if primary.get("address"):
            addresses.append(primary["address"])
        for extra in data.get("ipv4_secondaries", []) or []:
            if extra.get("address"):
                addresses.append(extra["address"])
        out[name] = {"ipv4": addresses, "mtu": data.get("mtu")}
    return out


def _carrier(interfaces: dict[str, dict], ip: str) -> str | None:
    for name, data in interfaces.items():
        if ip in data["ipv4"]:
            return name
    return None


def check_mtu(mtu: object, host: str, var: str = "host_prep_mtu") -> list[str]:
    try:
        value = int(str(mtu))
    except ValueError:
        return [f"{host}: {var} ({mtu!r}) must be an integer"]
    if not MTU_MIN <= value <= MTU_MAX:
        return [
            f"{host}: {var} ({value}) is out of range: the fast link's MTU must be between "
            f"{MTU_MIN} and {MTU_MAX} (9000 on a Spark pair)"
        ]
    return []


class _Node(NamedTuple):
    """What every entry of one node's links is checked against."""

    host: str
    interfaces: dict[str, dict]
    fast_ip: str
    mgmt_ip: str
    mgmt_addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    mgmt_iface: str | None


def _management(interfaces: dict[str, dict], facts: dict, mgmt_ip: str) -> tuple:
    """The management address (None when ansible_host is not an IP) and its interface."""
    try:
        mgmt_addr = ipaddress.ip_address(mgmt_ip) if mgmt_ip else None
    except ValueError:
        mgmt_addr = None
    # The management interface is the one carrying ansible_host; when ansible_host is a name,
    # the interface of the default route stands in for it.
    if mgmt_addr is not None:
        return mgmt_addr, _carrier(interfaces, str(mgmt_addr))
    return None, (facts.get("default_ipv4") or {}).get("interface")


def _link_address(where: str, address: object) -> tuple[ipaddress.IPv4Interface | None, str]:
    """An entry's address as an interface of a point-to-point subnet, or why it is not one."""
    if address in (None, ""):
        return None, f"{where}.address is missing (e.g. 198.51.100.11/24)"
    if "/" not in str(address):
        return None, f"{where}.address {address!r} needs a prefix length (IP/prefix)"
    try:
        iface = ipaddress.IPv4Interface(str(address))
    except ValueError:
        return None, f"{where}.address {address!r} is not an IPv4 address with a prefix"
    if not 8 <= iface.network.prefixlen <= 30:
        return None, (f"{where}.address {address}: prefix /{iface.network.prefixlen} "
                      "leaves no room for a point-to-point link (use /8 to /30)")  # fmt: skip
    if iface.ip in (iface.network.network_address, iface.network.broadcast_address):
        return None, (f"{where}.address {address} is its subnet's network or broadcast "
                      "address")  # fmt: skip
    return iface, ""


def _link_netdev(where: str, netdev: str, ip: str, node: _Node) -> tuple[str | None, str]:
    """The entry's interface (``auto``: the one carrying spark_fast_ip), or why there is none."""
    if netdev == AUTO:
        found = _carrier(node.interfaces, node.fast_ip)
        if ip != node.fast_ip:
            return None, (
                f"{where}.netdev is auto, which finds the interface carrying spark_fast_ip "
                f"({node.fast_ip}), but this entry's address is {ip}: name its netdev"
            )
        if found is None:
            return None, (
                f"{where}.netdev is auto but no interface on {node.host} carries spark_fast_ip "
                f"({node.fast_ip}) yet: name the netdev (ibdev2netdev lists them)"
            )
        return found, ""
    if not _NAME.match(netdev):
        return None, f"{where}.netdev {netdev!r} is not an interface name"
    if netdev not in node.interfaces:
        have = ", ".join(sorted(node.interfaces)) or "none"
        return None, f"{where}.netdev {netdev} is not an interface on {node.host} (it has: {have})"
    return netdev, ""


def _management_clash(where: str, netdev: str, address: object, iface, node: _Node) -> str:
    """Why the entry would touch the management network, or ""."""
    if netdev == node.mgmt_iface:
        return (
            f"{where}.netdev {netdev} is the management interface (it carries ansible_host "
            f"{node.mgmt_ip or '(default route)'}); host_prep never touches it"
        )
    if node.mgmt_addr is not None and node.mgmt_addr in iface.network:
        return (
            f"{where}.address {address}: its subnet {iface.network} contains the management "
            f"address ansible_host {node.mgmt_ip}; give the fast link a subnet of its own"
        )
    return ""


def _resolve_link(index: int, link: object, node: _Node) -> tuple[dict | None, list[str]]:
    """One entry of ``host_prep_cx7_links``: the resolved link (None when it is unusable) and
    the errors that name it."""
    where = f"{node.host}: {VAR}[{index}]"
    if not isinstance(link, dict):
        return None, [f"{where} must be a dict with netdev and address, got {link!r}"]
    errors = []
    unknown = sorted(set(link) - {"netdev", "roce", "address"})
    if unknown:
        errors.append(f"{where} has unknown keys {unknown}; use netdev, roce, address")
    address = link.get("address")
    iface, error = _link_address(where, address)
    if iface is None:
        return None, errors + [error]
    ip = str(iface.ip)
    netdev, error = _link_netdev(where, str(link.get("netdev") or AUTO), ip, node)
    error = error or _management_clash(where, netdev, address, iface, node)
    if error:
        return None, errors + [error]
    roce = link.get("roce") or ""
    if roce == AUTO:
        roce = ""
    if roce and not _ROCE.match(str(roce)):
        return None, errors + [f"{where}.roce {roce!r} is not a RoCE device name (e.g. rocep1s0f1)"]
    resolved = {
        "index": index,
        "netdev": netdev,
        "roce": str(roce),
        "address": f"{ip}/{iface.network.prefixlen}",
        "ip": ip,
        "prefix": iface.network.prefixlen,
        "network": str(iface.network),
    }
    return resolved, errors


def _duplicates(host: str, resolved: list[dict]) -> list[str]:
    """Two entries of one node with the same netdev, address, subnet or RoCE device."""
    errors = []
    seen: dict[str, dict[str, int]] = {"netdev": {}, "ip": {}, "network": {}, "roce": {}}
    for link in resolved:
        for key, what in (
            ("netdev", "netdev"),
            ("ip", "address"),
            ("network", "subnet"),
            ("roce", "roce"),
        ):
            value = link[key]
            if not value:
                continue
            if value in seen[key]:
                first = seen[key][value]
                hint = "; each twin needs a subnet of its own" if key == "network" else ""
                errors.append(
                    f"{host}: {VAR}[{first}] and {VAR}[{link['index']}] have the same "
                    f"{what} {value}{hint}"
                )
            else:
                seen[key][value] = link["index"]
    return errors


def resolve_links(
    links: object,
    host: str,
    facts: dict,
    fast_ip: str,
    mgmt_ip: str = "",
    mtu: object = 9000,
) -> dict:
    """Check one node's ``host_prep_cx7_links`` and resolve ``netdev: auto``.

    Returns ``{"links": [...], "errors": [...]}``; each resolved link has ``index``,
    ``netdev``, ``roce`` ("" when unknown), ``address`` (IP/prefix), ``ip``, ``prefix`` and
    ``network``. Every error names the variable (with the entry's index) and the node.
    """
    errors = check_mtu(mtu, host)
    if not isinstance(links, list) or not links:
        return {
            "links": [],
            "errors": errors + [f"{host}: {VAR} must be a non-empty list of links"],
        }
    interfaces = interfaces_from_facts(facts)
    node = _Node(host, interfaces, fast_ip, mgmt_ip, *_management(interfaces, facts, mgmt_ip))
    resolved = []
    for index, link in enumerate(links):
        entry, entry_errors = _resolve_link(index, link, node)
        errors.extend(entry_errors)
        if entry is not None:
            resolved.append(entry)
    errors.extend(_duplicates(host, resolved))
    if fast_ip and not any(link["ip"] == fast_ip for link in resolved) and not errors:
        errors.append(
            f"{host}: spark_fast_ip ({fast_ip}) is not the address of any entry in {VAR}; "
            "peers reach the node at spark_fast_ip, so one twin must carry it"
        )
    return {"links": resolved, "errors": errors}


def cross_check(nodes: dict[str, list[dict]]) -> list[str]:
    """All nodes' resolved links: same twin count, twin i in one subnet, no address twice."""
    errors = []
    names = sorted(nodes)
    if not names:
        return errors
    first = names[0]
    counts = {n: len(nodes[n]) for n in names}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{n}: {c}" for n, c in counts.items())
        errors.append(f"{VAR} must list the same number of twins on every node ({shown})")
    owner: dict[str, tuple[str, int]] = {}
    for name in names:
        for pos, link in enumerate(nodes[name]):
            if link["ip"] in owner:
                other, other_index = owner[link["ip"]]
                errors.append(
                    f"{name}: {VAR}[{link['index']}].address {link['ip']} is already used by "
                    f"{other} ({VAR}[{other_index}])"
                )
            else:
                owner[link["ip"]] = (name, link["index"])
            if name == first or pos >= len(nodes[first]):
                continue
            twin = nodes[first][pos]
            if link["network"] != twin["network"]:
                errors.append(
                    f"{name}: {VAR}[{link['index']}].address {link['address']} is outside its "
                    f"twin's subnet {twin['network']} ({first}'s {VAR}[{twin['index']}])"
                )
    return errors


def attach_roce(links: list[dict], ibdev: list[dict], host: str = "") -> dict:
    """Fill each link's ``roce`` from parsed ``ibdev2netdev`` entries; check named ones match."""
    by_netdev = {e["netdev"]: e["roce"] for e in ibdev}
    out, errors = [], []
    for link in links:
        found = by_netdev.get(link["netdev"])
        where = f"{host}: {VAR}[{link['index']}]"
        if not found:
            errors.append(
                f"{where}.netdev {link['netdev']}: no RoCE device backs it (ibdev2netdev)"
            )
        elif link.get("roce") and link["roce"] != found:
            errors.append(
                f"{where}.roce is {link['roce']} but ibdev2netdev says {found} backs "
                f"{link['netdev']}"
            )
        out.append({**link, "roce": link.get("roce") or found or ""})
    return {"links": out, "errors": errors}


def comm_env(links: list[dict], fast_ip: str, extra: dict | None = None) -> dict[str, str]:
    """The environment every serving container gets, from the node's resolved links.

    Socket-based libraries (NCCL's bootstrap, Gloo, TensorPipe, UCX, Open MPI) bind the netdev
    that carries ``spark_fast_ip``; NCCL's data path uses every twin's RoCE device. Two NCCL
    settings for the GB10 itself stand on every node, RoCE or not: they concern NCCL's threads
    and the GPU, not the network, and where NCCL is not loaded (Gloo on CPU, the simulated pair)
    nothing reads them.
    """
    primary = next((link for link in links if link["ip"] == fast_ip), None)
    if primary is None:
        raise ValueError(f"spark_fast_ip {fast_ip} is not on any of the links")
    ifname = primary["netdev"]
    env = {
        "VLLM_HOST_IP": fast_ip,
        "RAY_NODE_IP_ADDRESS": fast_ip,
        "RAY_OVERRIDE_NODE_IP_ADDRESS": fast_ip,
        "NCCL_SOCKET_IFNAME": ifname,
        "GLOO_SOCKET_IFNAME": ifname,
        "TP_SOCKET_IFNAME": ifname,
        "UCX_NET_DEVICES": ifname,
        "OMPI_MCA_btl_tcp_if_include": ifname,
        # NCCL's threads follow the GPU's CPU affinity, not a mask the launcher gave the
        # process (spark-vllm-docker's launcher sets it on Sparks).
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        # No NVLink on a Spark: NCCL 2.30.4's NVLS path hangs MoE weight loading there, and
        # turning it off cures it (NVIDIA/nccl issue 2167).
        "NCCL_NVLS_ENABLE": "0",
    }
    hcas = [link["roce"] for link in links if link.get("roce")]
    if hcas:
        env["NCCL_IB_HCA"] = ",".join(hcas)
        env["NCCL_IB_DISABLE"] = "0"
    else:
        # No RoCE device known (the simulated pair): NCCL must not look for one.
        env["NCCL_IB_DISABLE"] = "1"
    for key, value in (extra or {}).items():
        if not _ENV_KEY.match(str(key)):
            raise ValueError(f"host_prep_comm_env_extra: {key!r} is not an environment name")
        text = str(value)
        if "\n" in text or "\r" in text:
            raise ValueError(f"host_prep_comm_env_extra: {key} holds a line break")
        env[str(key)] = text
    return env


def host_entries(nodes: dict[str, dict], suffix: str = "-fast") -> list[dict]:
    """Names for every fast-link address: ``<node><suffix>`` for spark_fast_ip and
    ``<node><suffix>-<n>`` (n from 1) for each twin.

    ``nodes`` maps a node to ``{"links": [...], "fast_ip": ...}``; returns
    ``[{"node", "ip", "names"}]`` in node order, then twin order.
    """
    entries = []
    for node in sorted(nodes):
        data = nodes[node]
        for pos, link in enumerate(data["links"]):
            names = []
            if link["ip"] == data["fast_ip"]:
                names.append(f"{node}{suffix}")
            names.append(f"{node}{suffix}-{pos + 1}")
            entries.append({"node": node, "ip": link["ip"], "names": names})
    return entries


def known_host_names(nodes: dict[str, dict], suffix: str = "-fast") -> dict[str, list[str]]:
    """Every name a peer may be reached by over SSH: the node, its fast names, its addresses."""
    out: dict[str, list[str]] = {node: [node] for node in sorted(nodes)}
    for entry in host_entries(nodes, suffix):
        for name in [*entry["names"], entry["ip"]]:
            if name not in out[entry["node"]]:
                out[entry["node"]].append(name)
    return out


def peer_targets(nodes: dict[str, list[dict]], me: str) -> list[dict]:
    """What ``me`` must reach over each of its twins: the same twin of every other node."""
    targets = []
    mine = nodes.get(me, [])
    for peer in sorted(nodes):
        if peer == me:
            continue
        for pos, link in enumerate(nodes[peer]):
            if pos >= len(mine):
                continue
            targets.append(
                {
                    "peer": peer,
                    "twin": pos,
                    "netdev": mine[pos]["netdev"],
                    "roce": mine[pos]["roce"],
                    "ip": link["ip"],
                    "peer_roce": link["roce"],
                }
            )
    return targets
