# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the fast-link checks' output and decide pass or fail.

One parser and one decision per check that host_prep runs on real Sparks:

* ``ethtool <netdev>``: the link is up at the expected speed (200000Mb/s on a ConnectX-7 twin);
* ``ibdev2netdev``: which RoCE device backs which netdev, and whether its port is Up;
* ``ib_write_bw --report_gbits``: RDMA write bandwidth of one RoCE device;
* nccl-tests ``all_gather_perf`` and this collection's ``nccl_allgather_busbw.py``: the
  all_gather bus bandwidth, reported as a percentage of 25 GB/s (200 Gb/s);
* ``NCCL_DEBUG=INFO`` output: the network transport NCCL chose (``NET/IB`` or ``NET/Socket``)
  and the RoCE devices it used, compared with the twins that comm.env's NCCL_IB_HCA names.

Every ``check_*`` function returns a plain dict with ``passed`` (bool) and ``message`` (one
line a user can act on) plus what was measured, so Ansible can print and assert it.

When host_prep runs the benchmarks, and the record a node keeps of its last passed run, are
``link_plan.py``'s.

Pure standard library and no Ansible imports: ``roles/host_prep/files/nccl_allgather_busbw.py``
imports this file by path inside a container that has no Ansible.
"""

from __future__ import annotations

import ipaddress
import json
import re

# 200 Gb/s line rate of the ConnectX-7 link = 25 GB/s: the base of the reported percentage.
REFERENCE_BUSBW_GBPS = 25.0
# The all_gather busbw decides by bands: below the floor fails, below "healthy" warns.
# Healthy: NVIDIA's two-Spark NCCL script's threshold (87.5 % of 25 GB/s); a healthy pair at
# MTU 9000 measures 23.74 (https://github.com/NVIDIA/dgx-spark-playbooks/pull/103), one at MTU
# 1500 18.94-20.95 (https://github.com/NVIDIA/dgx-spark-playbooks/issues/25).
DEFAULT_HEALTHY_BUSBW_GBPS = 21.875
# Floor: broken data paths measured 2.83 (NET/IB on the other port's devices, KoyoImai/
# dgx_spark_cluster2 Step011 1.9), ~3 (https://github.com/NVIDIA/dgx-spark-playbooks/issues/102)
# and 3.04 (a development build of NCCL, pull 103); one 100 Gb/s device peaks at 12 GB/s
# (https://github.com/NVIDIA/nccl-tests/issues/119). 6 is half that peak, twice the broken ones.
DEFAULT_BUSBW_FLOOR_GBPS = 6.0
# What lowers a working link's busbw, named in the warning.
SLOW_LINK_CAUSES = (
    "an MTU below 9000 on a twin of either node (18.9-21 GB/s at MTU 1500), one twin carrying "
    "the traffic (about 12 GB/s), a cable or port that negotiated below 200000Mb/s (ethtool), "
    "a thermally throttled node, or other traffic on the link"
)
DEFAULT_LINK_SPEED_MBPS = 200000
# ib_write_bw measures ≈111.7 Gb/s on one twin of a healthy pair; 90 leaves room for noise
# while still failing a link that negotiated 50 Gb/s or runs at MTU 1500.
DEFAULT_MIN_RDMA_GBPS = 90.0


class CheckOutputError(ValueError):
    """The text is not the output of the tool it was given as."""


def _result(check: str, passed: bool, message: str, **details) -> dict:
    return {"check": check, "passed": passed, "message": message, **details}


# --------------------------------------------------------------------------- ip -j addr


def _address_problems(netdev: str, address: str, have: list[str]) -> list[str]:
    """A twin carries the inventory's IPv4 address and no other: a second one takes RoCE GID
    entries of its own, and NCCL may pick that one's GID (``nccl_gid_index``)."""
    if address not in have:
        return [f"{netdev}: {address} not configured (has {have or 'none'})"]
    extra = [a for a in have if a != address]
    if not extra:
        return []
    return [
        f"{netdev}: {', '.join(extra)} besides {address}: a twin carries only the inventory's "
        f"address. Remove it (sudo ip addr del {extra[0]} dev {netdev}) and whatever adds it "
        "(another netplan file or NetworkManager profile, a DHCP client)"
    ]


def check_addresses(ip_json: str, links: list[dict], mtu: int) -> dict:
    """``ip -j addr show``: every link's netdev is up, carries its address, no other IPv4
    address, and has ``mtu``."""
    try:
        data = json.loads(ip_json)
    except ValueError as exc:
        raise CheckOutputError(f"not the JSON of ip -j addr show: {exc}") from None
    by_name = {i.get("ifname"): i for i in data if isinstance(i, dict)}
    problems, seen = [], []
    for link in links:
        netdev = link["netdev"]
        iface = by_name.get(netdev)
        if iface is None:
            problems.append(f"{netdev}: no such interface")
            continue
        have = [
            f"{a.get('local')}/{a.get('prefixlen')}"
            for a in iface.get("addr_info", [])
            if a.get("family") == "inet"
        ]
        state = iface.get("operstate", "UNKNOWN")
        if iface.get("mtu") != int(mtu):
            problems.append(f"{netdev}: MTU {iface.get('mtu')}, expected {int(mtu)}")
        problems.extend(_address_problems(netdev, link["address"], have))
        if state not in ("UP", "UNKNOWN"):
            problems.append(f"{netdev}: {state}")
        seen.append(f"{netdev} {link['address']} MTU {iface.get('mtu')} {state}")
    if problems:
        return _result("addresses", False, "; ".join(problems))
    return _result("addresses", True, "; ".join(seen))


def check_address_facts(facts: dict, links: list[dict], mtu: int) -> dict:
    """Gathered network facts (``setup``, subset network; ``ipv4`` and ``ipv4_secondaries``
    hold every IPv4 address of an interface): as ``check_addresses``.

    ``facts`` is ``ansible_facts`` (keys with or without the ``ansible_`` prefix).
    """
    facts = {str(k).removeprefix("ansible_"): v for k, v in (facts or {}).items()}
    names = facts.get("interfaces")
    if not isinstance(names, list):
        raise CheckOutputError("no gathered network facts (setup with gather_subset network)")
    problems, seen = [], []
    for link in links:
        netdev = link["netdev"]
        iface = facts.get(netdev.replace("-", "_").replace(".", "_")) if netdev in names else None
        if not isinstance(iface, dict):
            problems.append(f"{netdev}: no such interface")
            continue
        have = [
            f"{a.get('address')}/{a.get('prefix')}"
            for a in [iface.get("ipv4") or {}, *(iface.get("ipv4_secondaries") or [])]
            if a.get("address")
        ]
        state = "UP" if iface.get("active") else "DOWN"
        if iface.get("mtu") != int(mtu):
            problems.append(f"{netdev}: MTU {iface.get('mtu')}, expected {int(mtu)}")
        problems.extend(_address_problems(netdev, link["address"], have))
        if state != "UP":
            problems.append(f"{netdev}: {state}")
        seen.append(f"{netdev} {link['address']} MTU {iface.get('mtu')} {state}")
    if problems:
        return _result("addresses", False, "; ".join(problems))
    return _result("addresses", True, "; ".join(seen))


# --------------------------------------------------------------------------- ethtool

_ETHTOOL_NAME = re.compile(r"^Settings for (\S+):\s*$", re.M)
_ETHTOOL_SPEED = re.compile(r"^\s*Speed:\s*(\S+)\s*$", re.M)
_ETHTOOL_LINK = re.compile(r"^\s*Link detected:\s*(yes|no)\s*$", re.M)
_ETHTOOL_DUPLEX = re.compile(r"^\s*Duplex:\s*(\S+)", re.M)


def parse_ethtool(text: str) -> dict:
    """``ethtool <netdev>`` -> netdev, speed_mbps (None when unknown), link_detected, duplex."""
    speed = _ETHTOOL_SPEED.search(text)
    link = _ETHTOOL_LINK.search(text)
    if not speed and not link:
        raise CheckOutputError("not ethtool output: no 'Speed:' and no 'Link detected:' line")
    name = _ETHTOOL_NAME.search(text)
    duplex = _ETHTOOL_DUPLEX.search(text)
    speed_mbps = None
    if speed:
        m = re.fullmatch(r"(\d+)Mb/s", speed.group(1))
        speed_mbps = int(m.group(1)) if m else None
    return {
        "netdev": name.group(1) if name else None,
        "speed_mbps": speed_mbps,
        "link_detected": (link.group(1) == "yes") if link else None,
        "duplex": duplex.group(1) if duplex else None,
    }


def check_link(
    text: str, expected_mbps: int = DEFAULT_LINK_SPEED_MBPS, netdev: str | None = None
) -> dict:
    """The link is detected and runs at ``expected_mbps`` or faster.

    ``netdev`` defaults to the name in ethtool's ``Settings for <netdev>:`` line.
    """
    parsed = parse_ethtool(text)
    if netdev and parsed["netdev"] not in (None, netdev):
        raise CheckOutputError(f"ethtool output is for {parsed['netdev']}, not {netdev}")
    netdev = netdev or parsed["netdev"] or "the link"
    speed = parsed["speed_mbps"]
    shown = f"{speed}Mb/s" if speed is not None else "speed unknown"
    if parsed["link_detected"] is False:
        return _result(
            "link", False, f"{netdev}: link down (Link detected: no, {shown}); check the cable",
            netdev=netdev, speed_mbps=speed, link_detected=False,
        )  # fmt: skip
    if speed is None or speed < expected_mbps:
        return _result(
            "link", False,
            f"{netdev}: link at {shown}, expected {expected_mbps}Mb/s "
            "(a ConnectX-7 twin on a QSFP cable to the peer)",
            netdev=netdev, speed_mbps=speed, link_detected=parsed["link_detected"],
        )  # fmt: skip
    return _result(
        "link", True, f"{netdev}: link up at {speed}Mb/s",
        netdev=netdev, speed_mbps=speed, link_detected=True,
    )  # fmt: skip


# --------------------------------------------------------------------------- ibdev2netdev

_IBDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)\s*$")


def parse_ibdev2netdev(text: str) -> list[dict]:
    """``ibdev2netdev`` lines ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)`` -> list of dicts."""
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _IBDEV.match(line.strip())
        if not m:
            raise CheckOutputError(f"not an ibdev2netdev line: {line.strip()!r}")
        roce, port, netdev, state = m.groups()
        entries.append({"roce": roce, "port": int(port), "netdev": netdev, "state": state})
    return entries


def roce_for_netdevs(text: str, netdevs: list[str]) -> dict:
    """Which RoCE device backs each netdev: {netdev: roce or None}."""
    by_netdev = {e["netdev"]: e["roce"] for e in parse_ibdev2netdev(text)}
    return {n: by_netdev.get(n) for n in netdevs}


def check_roce(text: str, links: list[dict]) -> dict:
    """Every link's netdev is backed by a RoCE device (its ``roce`` when given) that is Up."""
    entries = parse_ibdev2netdev(text)
    problems = []
    found = []
    for link in links:
        netdev = link["netdev"]
        mine = [e for e in entries if e["netdev"] == netdev]
        if not mine:
            problems.append(f"{netdev}: no RoCE device backs it in ibdev2netdev")
            continue
        entry = mine[0]
        found.append(entry)
        wanted = link.get("roce") or ""
        if wanted and wanted != entry["roce"]:
            problems.append(
                f"{netdev}: backed by {entry['roce']}, but host_prep_cx7_links names {wanted}"
            )
        if entry["state"] != "Up":
            problems.append(f"{entry['roce']} ==> {netdev} is {entry['state']}, not Up")
    if problems:
        return _result("roce", False, "; ".join(problems), devices=found)
    shown = ", ".join(f"{e['roce']} ==> {e['netdev']}" for e in found)
    return _result("roce", True, f"RoCE devices up: {shown}", devices=found)


# --------------------------------------------------------------------------- RoCE GID tables
# Each RoCE port keeps a table of GIDs: per index the GID (gids/<i>, an IPv6 address: the
# default fe80::/64 one made from the MAC, then one IPv4-mapped ::ffff:a.b.c.d per IPv4 address
# of the netdev, one per RoCE version), its version (gid_attrs/types/<i>: "IB/RoCE v1" or
# "RoCE v2"; an unused entry cannot be read) and its netdev (gid_attrs/ndevs/<i>).

_GID_LINE = re.compile(
    r"^/\S*?/(?P<dev>[^/\s]+)/ports/\d+/(?P<kind>gids|gid_attrs/types|gid_attrs/ndevs)/"
    r"(?P<index>\d+):(?P<value>.*)$"
)
_GID_KIND = {"gids": "gid", "gid_attrs/types": "type", "gid_attrs/ndevs": "ndev"}
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def parse_gid_tables(text: str) -> dict[str, dict[int, dict]]:
    """``grep -r -s -H . <dev>/ports/1/gids <dev>/ports/1/gid_attrs/types
    <dev>/ports/1/gid_attrs/ndevs`` (under /sys/class/infiniband, for one or more RoCE
    devices) -> {device: {index: {"gid", "type", "ndev"}}}; what an entry lacks is None."""
    tables: dict[str, dict[int, dict]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _GID_LINE.match(line.strip())
        if not m:
            raise CheckOutputError(f"not a line of a RoCE GID table: {line.strip()[:100]!r}")
        entry = tables.setdefault(m["dev"], {}).setdefault(
            int(m["index"]), {"gid": None, "type": None, "ndev": None}
        )
        value = m["value"].strip()
        if m["kind"] == "gids":
            try:
                ipaddress.IPv6Address(value)
            except ValueError:
                raise CheckOutputError(
                    f"{m['dev']} GID {m['index']}: {value!r} is no GID"
                ) from None
        entry[_GID_KIND[m["kind"]]] = value
    return tables


def _gid_words(gid: str | None) -> tuple[int, int, int, int]:
    packed = int(ipaddress.IPv6Address(gid or ZERO_GID))
    return (
        packed >> 96,
        (packed >> 64) & 0xFFFFFFFF,
        (packed >> 32) & 0xFFFFFFFF,
        packed & 0xFFFFFFFF,
    )


def gid_family(gid: str | None) -> int:
    """4 for an IPv4-mapped GID (``::ffff:a.b.c.d``, or its multicast form), else 6."""
    w = _gid_words(gid)
    mapped = w[0] == 0 and w[1] == 0 and w[2] == 0xFFFF
    mapped_multicast = w[0] == 0xFF0E0000 and w[1] == 0 and w[2] == 0xFFFF
    return 4 if mapped or mapped_multicast else 6


def gid_valid(gid: str | None) -> bool:
    """A GID in use that is not link-local: not all zero, not fe80::/64."""
    w = _gid_words(gid)
    unset = w == (0, 0, 0, 0) or (w[0] == 0xFE800000 and w[1:] == (0, 0, 0))
    return not unset and not (w[0] == 0xFE800000 and w[1] == 0)


def gid_ipv4(gid: str | None) -> str | None:
    """The IPv4 address of an IPv4-mapped GID, else None."""
    return str(ipaddress.IPv4Address(_gid_words(gid)[3])) if gid_family(gid) == 4 else None


def roce_version(gid_type: str | None) -> int | None:
    """gid_attrs/types: ``IB/RoCE v1`` or ``RoCE v1`` -> 1, ``RoCE v2`` -> 2, else None."""
    text = (gid_type or "").strip()
    if text.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    return 2 if text.startswith("RoCE v2") else None


def _int(value: object, default: int) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        return default


def nccl_gid_index(table: dict[int, dict], env: dict | None = None) -> int:
    """The GID index NCCL's IB transport uses on a RoCE port (ncclIbGetGidIndex in NCCL's
    src/transport/net_ib, 2.28 as the Sparks run it): ``NCCL_IB_GID_INDEX`` when set (0 or
    more); else from index 0 on, a GID of the wanted family (``NCCL_IB_ADDR_FAMILY``, IPv4
    unless ``AF_INET6``) within ``NCCL_IB_ADDR_RANGE`` replaces one of the other family, and
    a valid GID of that family replaces the current one when their RoCE versions differ (or
    the current is not valid) and its version is ``NCCL_IB_ROCE_VERSION_NUM`` (2). With one
    IPv4 address on the netdev that is its RoCE v2 GID."""
    env = env or {}
    forced = _int(env.get("NCCL_IB_GID_INDEX", -1), -1)
    if forced >= 0:
        return forced
    family = 6 if str(env.get("NCCL_IB_ADDR_FAMILY", "")).strip() == "AF_INET6" else 4
    version = _int(env.get("NCCL_IB_ROCE_VERSION_NUM", 2), 2)
    subnet = None
    if str(env.get("NCCL_IB_ADDR_RANGE") or "").strip():
        try:
            subnet = ipaddress.ip_network(str(env["NCCL_IB_ADDR_RANGE"]).strip(), strict=False)
        except ValueError:
            subnet = None  # NCCL ignores a range it cannot read

    def in_range(gid: str | None) -> bool:
        if subnet is None:
            return True
        if family == 4:
            return gid_ipv4(gid) is not None and ipaddress.IPv4Address(gid_ipv4(gid)) in subnet
        return ipaddress.IPv6Address(gid or ZERO_GID) in subnet

    def get(index: int) -> dict:
        return table.get(index) or {"gid": ZERO_GID, "type": None}

    current = 0
    for candidate in range(1, max(table, default=0) + 1):
        now, new = get(current), get(candidate)
        new_family = gid_family(new["gid"])
        if new_family != gid_family(now["gid"]) and new_family == family and in_range(new["gid"]):
            current = candidate
        elif new_family != family or not gid_valid(new["gid"]) or not in_range(new["gid"]):
            continue
        elif (
            roce_version(now["type"]) != roce_version(new["type"]) or not gid_valid(now["gid"])
        ) and roce_version(new["type"]) == version:
            current = candidate
    return current


def _gid_shown(entry: dict | None) -> str:
    if not entry or _gid_words(entry.get("gid")) == (0, 0, 0, 0):
        return "no GID (an unused entry)"
    gid = entry["gid"]
    address = gid_ipv4(gid) or str(ipaddress.IPv6Address(gid))
    details = ", ".join(x for x in (entry.get("type"), entry.get("ndev")) if x)
    return f"{'::ffff:' if gid_ipv4(gid) else ''}{address}" + (f" ({details})" if details else "")


def _address_index(table: dict[int, dict], ip: str, version: int) -> int | None:
    """Where the twin's own address sits as a GID of that RoCE version, or None."""
    return next(
        (i for i in sorted(table)
         if gid_ipv4(table[i]["gid"]) == ip and roce_version(table[i]["type"]) == version),
        None,
    )  # fmt: skip


def _wrong_gid(node: str, link: dict, index: int, table: dict, env: dict, version: int) -> str:
    roce, netdev, ip = link.get("roce") or "?", link["netdev"], link["ip"]
    own = _address_index(table, ip, version)
    head = (
        f"{node}: NCCL would use GID index {index} of {roce} ({netdev}), which holds "
        f"{_gid_shown(table.get(index))}, not the twin's address {ip} as RoCE v{version}"
    )
    if _int(env.get("NCCL_IB_GID_INDEX", -1), -1) >= 0:
        where = (
            f"the twin's address is at index {own} here. Remove what else is on {netdev} (ip "
            "addr show dev " + netdev + ") so the index is the same on every node, or leave "
            "NCCL_IB_GID_INDEX out of host_prep_comm_env_extra so NCCL finds it"
            if own is not None
            else f"the twin's address has no RoCE v{version} GID: is {ip} on {netdev} "
            f"(ip addr show dev {netdev})?"
        )
        return f"{head}: NCCL_IB_GID_INDEX in the comm env names that index; {where}"
    if own is None:
        return (
            f"{head}: the twin's address has no RoCE v{version} GID on {roce}; check that {ip} "
            f"is on {netdev} (ip addr show dev {netdev}) and that ibdev2netdev shows {roce} "
            f"behind {netdev}"
        )
    return (
        f"{head} (that is at index {own}): another address of the twin comes first in the "
        f"table. Remove it from {netdev} (ip addr show dev {netdev}) and run again"
    )


def _extra_gids(table: dict[int, dict], below: int, ip: str) -> list[str]:
    """The GIDs in use below index ``below`` but the link-local default ones and the twin's
    own address."""
    return [
        f"index {i} {_gid_shown(table[i])}"
        for i in sorted(table)
        if i < below and gid_valid(table[i]["gid"]) and gid_ipv4(table[i]["gid"]) != ip
    ]


def check_gid_indices(nodes: dict[str, dict]) -> dict:
    """The RoCE GID index NCCL uses behind each twin holds the twin's own address, and is the
    same on every node.

    ``nodes`` maps a node to ``{"text": its GID tables (parse_gid_tables), "links": its
    resolved links (netdev, roce, ip), "env": its communication environment}``; twin n of one
    node is compared with twin n of the others. ``NCCL_IB_GID_INDEX`` and its kin come from
    ``env`` (``nccl_gid_index``). Returns the check with ``indices`` (node -> index per twin,
    None where unknown) and ``errors``.
    """
    errors: list[str] = []
    indices: dict[str, list[int | None]] = {}
    tables_by_node: dict[str, dict] = {}
    for node in sorted(nodes):
        data = nodes[node] or {}
        env = dict(data.get("env") or {})
        version = _int(env.get("NCCL_IB_ROCE_VERSION_NUM", 2), 2)
        try:
            tables = parse_gid_tables(str(data.get("text") or ""))
        except CheckOutputError as exc:
            errors.append(f"{node}: cannot read the RoCE GID tables: {exc}")
            continue
        tables_by_node[node] = tables
        row: list[int | None] = []
        for link in data.get("links") or []:
            table = tables.get(link.get("roce") or "")
            if not table:
                errors.append(
                    f"{node}: no GID table for {link.get('roce') or '(no RoCE device)'} behind "
                    f"{link['netdev']} under ports/1 of its sysfs entry: check that ibdev2netdev "
                    "lists the device and that the mlx5 RDMA driver is loaded"
                )
                row.append(None)
                continue
            index = nccl_gid_index(table, env)
            row.append(index)
            entry = table.get(index) or {}
            if (
                gid_ipv4(entry.get("gid")) != link["ip"]
                or roce_version(entry.get("type")) != version
            ):
                errors.append(_wrong_gid(node, link, index, table, env, version))
        indices[node] = row
    for pos in range(max((len(r) for r in indices.values()), default=0)):
        seen = {n: r[pos] for n, r in indices.items() if pos < len(r) and r[pos] is not None}
        if len(set(seen.values())) < 2:
            continue
        links = {n: nodes[n]["links"][pos] for n in seen}
        each = ", ".join(f"{i} on {n} ({links[n].get('roce')})" for n, i in seen.items())
        high = max(seen, key=lambda n: seen[n])
        netdev = links[high]["netdev"]
        table = tables_by_node[high].get(links[high].get("roce") or "", {})
        extra = _extra_gids(table, seen[high], links[high]["ip"])
        before = f"; before the twin's address {high} has {', '.join(extra)}" if extra else ""
        errors.append(
            f"twin {pos + 1}: NCCL would use GID index {each}: one NCCL_IB_GID_INDEX (and "
            f"ib_write_bw -x) names one index for both nodes, so it must be the same on each"
            f"{before}. Remove what else is on {netdev} of {high} (ip addr show dev {netdev}: a "
            "second IPv4 or a global IPv6 address each take GID entries) and run again"
        )
    shown = "; ".join(
        f"{n}: "
        + ", ".join(f"{link.get('roce')} {i}" for link, i in zip(nodes[n]["links"], r, strict=True))
        for n, r in indices.items()
    )
    if errors:
        return _result("gid", False, "\n".join(errors), indices=indices, errors=errors)
    return _result(
        "gid", True, f"RoCE GID index NCCL uses, the twin's address on every node: {shown}",
        indices=indices, errors=[],
    )  # fmt: skip


# --------------------------------------------------------------------------- ib_write_bw

_PERFTEST_DEVICE = re.compile(r"\bDevice\s*:\s*(\S+)")
_PERFTEST_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]"
)
_PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def parse_ib_write_bw(text: str) -> dict:
    """``ib_write_bw --report_gbits`` -> device, rows and the last row's average in Gb/s.

    Only Gb/s output is accepted: the MB/sec default of perftest is ambiguous about its
    megabyte, and host_prep always passes ``--report_gbits``.
    """
    header = _PERFTEST_HEADER.search(text)
    if not header:
        raise CheckOutputError("not ib_write_bw output: no '#bytes #iterations BW peak' header")
    if header.group(2) != "Gb/sec":
        raise CheckOutputError(
            f"ib_write_bw reported {header.group(2)}; run it with --report_gbits"
        )
    rows = []
    for line in text[header.end() :].splitlines():
        m = _PERFTEST_ROW.match(line)
        if m:
            size, iters, peak, avg, rate = m.groups()
            rows.append(
                {
                    "bytes": int(size),
                    "iterations": int(iters),
                    "bw_peak_gbps": float(peak),
                    "bw_average_gbps": float(avg),
                    "msg_rate_mpps": float(rate),
                }
            )
    if not rows:
        raise CheckOutputError("ib_write_bw printed its header but no result row")
    device = _PERFTEST_DEVICE.search(text)
    return {
        "device": device.group(1) if device else None,
        "rows": rows,
        "bw_average_gbps": rows[-1]["bw_average_gbps"],
    }


# perftest (linux-rdma/perftest, src/perftest_resources.c) prints, when ibv_reg_mr refuses its
# buffers, "Couldn't allocate MR with error=<errno>" (from 23.04; before it, "Couldn't allocate
# MR"), then "failed to create mr", "Failed to create MR", " Couldn't create IB resources". The
# kernel refuses to pin pages past RLIMIT_MEMLOCK, unless the process holds CAP_IPC_LOCK, with
# ENOMEM (drivers/infiniband/core/umem.c, ib_umem_get), so errno 12 is the memlock refusal.
_MR_REFUSED = re.compile(r"Couldn't allocate MR(?: with error=(\d+))?")
_PERFTEST_ERROR = re.compile(
    r"^\s*((?:Couldn't|Unable to|Failed to|failed to|No IB devices|IB device )[^\n]*?)\s*$", re.M
)
ENOMEM = 12


def ib_write_bw_refusal(text: str, memlock_lifted: bool = True) -> dict | None:
    """Why ib_write_bw stopped before it measured: ``{kind, message}``; None when its output
    names no refusal. ``kind`` is ``memlock`` for a memory registration refused with ENOMEM (or
    without an errno, as perftest before 23.04 prints it), ``registration`` for another errno,
    ``error`` for perftest's other error lines. ``memlock_lifted``: the run was not bound by the
    limit (host_prep runs it as root, whose CAP_IPC_LOCK lifts it), so an ENOMEM then comes from
    the kernel's own memory, not the limit."""
    text = text or ""
    device = _PERFTEST_DEVICE.search(text)
    name = device.group(1) if device else "ib_write_bw"
    refused = _MR_REFUSED.search(text)
    if refused:
        errno = int(refused.group(1)) if refused.group(1) else None
        said = refused.group(0)
        if errno not in (None, ENOMEM):
            return {
                "kind": "registration",
                "message": f"{name}: the RoCE device refused to register ib_write_bw's buffers "
                f"({said}, not the memlock limit's ENOMEM): check the device with ibv_devinfo",
            }
        message = (
            f"{name}: a memlock refusal: ib_write_bw could not register its buffers ({said}; "
            "ENOMEM): the kernel pins RDMA buffers only within the locked-memory limit "
            "(ulimit -l) unless the process holds CAP_IPC_LOCK, and 4 queue pairs of 1 MiB "
            "need about Ubuntu's whole 8 MiB default"
        )
        if memlock_lifted:
            message += (
                "; this run was root's, whose CAP_IPC_LOCK lifts the limit, so the kernel "
                "itself refused the memory: see the kernel warnings of preflight (a DGX "
                "OS kernel whose memory reservation makes ibv_reg_mr fail with ENOMEM, "
                "spark-vllm-docker issue 392)"
            )
        return {"kind": "memlock", "message": message}
    errors = _PERFTEST_ERROR.findall(text)
    if errors:
        return {"kind": "error", "message": f"{name}: ib_write_bw failed: {'; '.join(errors)}"}
    return None


def check_ib_write_bw(
    text: str, min_gbps: float = DEFAULT_MIN_RDMA_GBPS, memlock_lifted: bool = True
) -> dict:
    """RDMA write bandwidth of one device is at least ``min_gbps``; a refusal in the output
    (:func:`ib_write_bw_refusal`, a memlock refusal named as such) fails it."""
    refusal = ib_write_bw_refusal(text, memlock_lifted)
    if refusal and not _PERFTEST_HEADER.search(text or ""):
        return _result("rdma", False, refusal["message"], refusal=refusal["kind"])
    parsed = parse_ib_write_bw(text)
    bw = parsed["bw_average_gbps"]
    device = parsed["device"] or "RoCE device"
    passed = bw >= min_gbps
    verdict = "at least" if passed else "below"
    return _result(
        "rdma", passed,
        f"{device}: RDMA write {bw:.2f} Gb/s, {verdict} host_prep_rdma_min_gbps ({min_gbps:g})",
        device=parsed["device"], bw_average_gbps=bw, min_gbps=min_gbps,
    )  # fmt: skip


# --------------------------------------------------------------------------- NCCL_DEBUG
# Line formats (NCCL src/transport/net_ib/init.cc and src/transport/net.cc):
#   <host>:<pid>:<tid> [<dev>] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]... [RO]; OOB ...
#   ... NCCL INFO NET/IB : Made virtual device [0] name=rocep1s0f1 speed=200000 ndevs=1
#   ... NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0[/GDRDMA]
# The number after the network's name is the index of a (virtual) device of that process.
# A net plugin names the network itself: the HPC-X plugin's IB is "IBext", "IBext_v8", ...

_NCCL_PROCESS = re.compile(r"(\S+):(\d+):\d+ \[\d+\] NCCL INFO ")
_NCCL_IB_USING = re.compile(r"NET/IB : Using(.*)")
_NCCL_IB_DEVICE = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)(?::[^/\s]*)?/(\w+)")
_NCCL_IB_VDEV = re.compile(r"NET/IB : Made virtual device \[(\d+)\] name=(\S+)")
_NCCL_SOCKET_USING = re.compile(r"NET/Socket : Using (.*)")
_NCCL_SOCKET_IFACE = re.compile(r"\[\d+\]([^\s:\[\]]+):")
_NCCL_NETWORK = re.compile(r"Using network (\S+)")
_NCCL_NET_CHANNEL = re.compile(r"\bvia NET/(.+?)/(\d+)")
_NCCL_CHANNEL = re.compile(r"\bvia (\S+)")


def _net_name(name: str) -> str:
    """NCCL's network name -> ``IB`` for the IB verbs transport (built in or a plugin's)."""
    return "IB" if name.startswith("IB") else name


def _transport_kind(path: str) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``SHM/direct`` -> ``SHM``; ``COLLNET/x`` -> ``COLLNET/x``."""
    parts = path.split("/")
    if parts[0] == "COLLNET" and len(parts) > 1:
        return f"COLLNET/{parts[1]}"
    return parts[0]


def _add(items: list, item) -> None:
    if item not in items:
        items.append(item)


def nccl_transport(log: str) -> dict:
    """What NCCL_DEBUG=INFO output says about the transport and the devices NCCL used.

    ``transport``: from the channels when the log has them (``Socket`` when any channel ran
    over NET/Socket, else ``IB`` when any ran over NET/IB, else the most used intra-node
    transport: ``P2P``, ``SHM``, ...), else from the network NCCL chose (``Using network``),
    else ``Socket`` when only NET/Socket listed interfaces, else ``unknown``.
    ``ib_devices``: the devices NET/IB opened (``name:port``; a virtual device's name when the
    log lists no ``Using`` line). ``channel_devices``: the devices that carried NET/IB
    channels, resolved per process from the channel's device index.
    """
    ib_devices: list[str] = []
    socket_ifaces: list[str] = []
    networks: list[str] = []
    channels: dict[str, int] = {}
    channel_devices: list[str] = []
    gdr = False
    # Per process (host:pid): NCCL's device index -> names, and the indexes NET/IB channels used.
    devices: dict[str, dict[int, list[str]]] = {}
    used: dict[str, list[int]] = {}
    for line in log.splitlines():
        if "NCCL" not in line and "via " not in line and "NET/" not in line:
            continue
        proc = _NCCL_PROCESS.search(line)
        key = f"{proc.group(1)}:{proc.group(2)}" if proc else "?"
        table = devices.setdefault(key, {})
        m = _NCCL_IB_USING.search(line)
        if m:
            for index, dev, port, _link in _NCCL_IB_DEVICE.findall(m.group(1)):
                table.setdefault(int(index), [dev])
                _add(ib_devices, f"{dev}:{port}")
        m = _NCCL_IB_VDEV.search(line)
        if m:
            table[int(m.group(1))] = m.group(2).split("+")
        m = _NCCL_SOCKET_USING.search(line)
        if m:
            for iface in _NCCL_SOCKET_IFACE.findall(m.group(1)):
                _add(socket_ifaces, iface)
        m = _NCCL_NETWORK.search(line)
        if m:
            _add(networks, m.group(1))
        if "Channel" not in line:
            continue
        m = _NCCL_NET_CHANNEL.search(line)
        if m:
            kind = f"NET/{_net_name(m.group(1))}"
            if kind == "NET/IB":
                used.setdefault(key, []).append(int(m.group(2)))
            gdr = gdr or "/GDRDMA" in line[m.end() :]
        else:
            m = _NCCL_CHANNEL.search(line)
            if not m:
                continue
            kind = _transport_kind(m.group(1))
        channels[kind] = channels.get(kind, 0) + 1
    named = {dev.split(":")[0] for dev in ib_devices}
    for table in devices.values():
        for names in table.values():
            for name in names:
                if name not in named:
                    named.add(name)
                    ib_devices.append(name)
    for key, indexes in used.items():
        for index in indexes:
            for name in devices.get(key, {}).get(index, [f"device {index}"]):
                _add(channel_devices, name)
    nets = [_net_name(n) for n in networks]
    if channels:
        if channels.get("NET/Socket"):
            transport = "Socket"
        elif channels.get("NET/IB"):
            transport = "IB"
        else:
            transport = max(sorted(channels), key=lambda k: channels[k])
    elif "Socket" in nets:
        transport = "Socket"
    elif "IB" in nets:
        transport = "IB"
    elif socket_ifaces and not ib_devices:
        transport = "Socket"
    else:
        transport = "unknown"
    return {
        "transport": transport,
        "ib_devices": ib_devices,
        "channel_devices": channel_devices,
        "socket_ifaces": socket_ifaces,
        "networks": networks,
        "channels": channels,
        "gdr": gdr,
    }


def configured_hcas(value: str | None) -> list[str]:
    """The device names of an NCCL_IB_HCA value (``rocep1s0f1,roceP2p1s0f1`` or with ports
    ``=rocep1s0f1:1``); ``^`` (exclude) names none NCCL will use: []."""
    text = (value or "").strip()
    if text.startswith("^"):
        return []
    return [item.split(":")[0].strip() for item in text.lstrip("=").split(",") if item.strip()]


def nccl_device_mismatch(transport: dict, ib_hca: str | None) -> str:
    """Why the devices and transport NCCL used are not the configured twins ('' when they are).

    The twins are ``ib_hca`` (the NCCL_IB_HCA that comm.env holds). NCCL must have run NET/IB
    on exactly those devices: every twin carried channels (when the log shows channels) and
    NCCL opened no other device.
    """
    names = configured_hcas(ib_hca)
    named = ", ".join(names) if names else f"no device ({ib_hca or 'unset'})"
    kind = transport.get("transport", "unknown")
    if kind == "Socket":
        ifaces = ", ".join(transport.get("socket_ifaces") or []) or "a socket"
        return (
            f"NCCL used NET/Socket over {ifaces}, but NCCL_IB_HCA in comm.env names {named} "
            "over NET/IB: check NCCL_IB_DISABLE and /dev/infiniband in the container"
        )
    if kind != "IB":
        return (
            f"NCCL_DEBUG=INFO output shows no NET/IB transport (saw {kind}), but NCCL_IB_HCA "
            f"in comm.env names {named}: the run cannot prove RDMA"
        )
    opened = [dev.split(":")[0] for dev in transport.get("ib_devices") or []]
    carried = list(transport.get("channel_devices") or [])
    shown = carried or opened
    idle = [name for name in names if name not in shown]
    extra = [name for name in opened + carried if name not in names]
    if names and not idle and not extra:
        return ""
    used = ", ".join(shown) or "no device"
    return f"NCCL used NET/IB on {used}, but NCCL_IB_HCA in comm.env names {named}"


# --------------------------------------------------------------------------- all_gather


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def parse_all_gather_perf(text: str) -> dict:
    """nccl-tests ``all_gather_perf`` output -> rows, avg_busbw_gbps, wrong, collective.

    Columns are found from the header line that names ``algbw`` and ``busbw``; the first
    ``time/algbw/busbw/#wrong`` group is out-of-place, the second in-place.
    """
    columns: list[str] | None = None
    rows = []
    avg = None
    failure = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") and "algbw" in s and "busbw" in s:
            columns = s.lstrip("#").split()
            continue
        m = re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", s)
        if m:
            avg = float(m.group(1))
            continue
        if "NCCL failure" in s or "Test failure" in s or "Test NCCL failure" in s:
            failure = failure or s
        if columns and s and s[0].isdigit():
            cells = s.split()
            if len(cells) != len(columns):
                continue
            row = {"size_bytes": int(cells[0]), "count": int(cells[1])}
            busbw_columns = [i for i, c in enumerate(columns) if c == "busbw"]
            for place, i in zip(("oop", "ip"), busbw_columns, strict=False):
                row[f"{place}_time_us"] = _number(cells[i - 2])
                row[f"{place}_algbw_gbps"] = _number(cells[i - 1])
                row[f"{place}_busbw_gbps"] = _number(cells[i])
                row[f"{place}_wrong"] = _number(cells[i + 1]) if i + 1 < len(cells) else None
            rows.append(row)
    if columns is None:
        raise CheckOutputError("not nccl-tests output: no header with 'algbw' and 'busbw'")
    wrong = sum(int(r.get(k) or 0) for r in rows for k in ("oop_wrong", "ip_wrong"))
    return {"rows": rows, "avg_busbw_gbps": avg, "wrong": wrong, "failure": failure}


# --------------------------------------------------------------------------- the NCCL check


def parse_busbw_json(text: str) -> dict:
    """The last object that ``nccl_allgather_busbw.py`` printed (``check: nccl_all_gather``);
    the objects of ranks that share a stdout may share a line."""
    found = None
    decoder = json.JSONDecoder()
    for line in text.splitlines():
        s = line.strip()
        # Ranks of one host share a stdout: their objects can land on one line.
        while s.startswith("{"):
            try:
                data, end = decoder.raw_decode(s)
            except ValueError:
                break
            if isinstance(data, dict) and data.get("check") == "nccl_all_gather":
                found = data
            s = s[end:].lstrip()
    if found is None:
        raise CheckOutputError('no JSON line with "check": "nccl_all_gather" in the output')
    if not isinstance(found.get("busbw_gbps"), (int, float)):
        raise CheckOutputError("the nccl_all_gather JSON line has no numeric busbw_gbps")
    return found


def busbw_band(
    busbw_gbps: float | None,
    floor_gbps: float = DEFAULT_BUSBW_FLOOR_GBPS,
    healthy_gbps: float = DEFAULT_HEALTHY_BUSBW_GBPS,
) -> str:
    """``broken`` below the floor, ``slow`` below healthy, ``healthy`` from it; ``unmeasured``."""
    if busbw_gbps is None:
        return "unmeasured"
    if busbw_gbps < floor_gbps:
        return "broken"
    return "slow" if busbw_gbps < healthy_gbps else "healthy"


def decide_nccl(
    busbw_gbps: float | None,
    transport: dict,
    floor_gbps: float = DEFAULT_BUSBW_FLOOR_GBPS,
    healthy_gbps: float = DEFAULT_HEALTHY_BUSBW_GBPS,
    reference_gbps: float = REFERENCE_BUSBW_GBPS,
    require_ib: bool = True,
    ib_hca: str | None = None,
    extra_reasons: list[str] | None = None,
) -> dict:
    """Pass or fail on the transport, and on the bandwidth by bands.

    With ``require_ib`` NCCL must have used NET/IB and never NET/Socket; with ``ib_hca`` (the
    NCCL_IB_HCA of comm.env) on exactly those twins (``nccl_device_mismatch``). The busbw fails
    below ``floor_gbps`` (what only a broken link measures), passes with a warning below
    ``healthy_gbps`` (a working link slowed by MTU, port, cable, heat) and passes from it.
    ``extra_reasons`` (wrong values, a failed run) fail it too. ``band`` says which band;
    ``warnings`` holds the slow band's warning.
    """
    reasons, warnings = [], []
    kind = transport.get("transport", "unknown")
    if require_ib and ib_hca is not None:
        mismatch = nccl_device_mismatch(transport, ib_hca)
        if mismatch:
            reasons.append(mismatch)
    elif require_ib and kind == "Socket":
        ifaces = ", ".join(transport.get("socket_ifaces") or []) or "a socket"
        reasons.append(
            f"NCCL used the socket transport (NET/Socket over {ifaces}) instead of IB: "
            "check NCCL_IB_HCA, NCCL_IB_DISABLE and /dev/infiniband in the container"
        )
    elif require_ib and kind != "IB":
        reasons.append(
            f"NCCL_DEBUG=INFO output shows no NET/IB transport (saw {kind}); "
            "the run cannot prove RDMA"
        )
    band = busbw_band(busbw_gbps, floor_gbps, healthy_gbps)
    percent = None
    if busbw_gbps is None:
        reasons.append("no bus bandwidth was measured")
    else:
        percent = round(100.0 * busbw_gbps / reference_gbps, 1)
    if band == "broken":
        reasons.append(
            f"busbw {busbw_gbps:.2f} GB/s is below host_prep_nccl_busbw_floor_gbps "
            f"({floor_gbps:g}), which only a broken data path measures (a socket fallback or "
            "the wrong devices give about 3)"
        )
    elif band == "slow":
        warnings.append(
            f"busbw {busbw_gbps:.2f} GB/s is below host_prep_nccl_busbw_healthy_gbps "
            f"({healthy_gbps:g}; a healthy pair measures about 23.7): the link works but runs "
            f"slow; what lowers it: {SLOW_LINK_CAUSES}"
        )
    reasons.extend(extra_reasons or [])
    devices = ", ".join(transport.get("channel_devices") or transport.get("ib_devices") or [])
    over = f"NET/IB ({devices})" if kind == "IB" and devices else f"{kind} transport"
    measured = (
        f"all_gather busbw {busbw_gbps:.2f} GB/s = {percent}% of {reference_gbps:g} GB/s"
        if busbw_gbps is not None
        else "all_gather busbw not measured"
    )
    passed = not reasons
    if not passed:
        verdict = "FAIL: " + "; ".join(reasons)
    elif warnings:
        verdict = "pass with a WARNING: " + "; ".join(warnings)
    else:
        verdict = "pass"
    return _result(
        "nccl", passed, f"{measured} over {over}: {verdict}",
        busbw_gbps=busbw_gbps, percent_of_reference=percent, reference_gbps=reference_gbps,
        floor_gbps=floor_gbps, healthy_gbps=healthy_gbps, band=band, warnings=warnings,
        transport=kind, ib_devices=transport.get("ib_devices", []),
        channel_devices=transport.get("channel_devices", []), reasons=reasons,
    )  # fmt: skip


def check_all_gather_perf(
    text: str,
    floor_gbps: float = DEFAULT_BUSBW_FLOOR_GBPS,
    healthy_gbps: float = DEFAULT_HEALTHY_BUSBW_GBPS,
    reference_gbps: float = REFERENCE_BUSBW_GBPS,
    require_ib: bool = True,
    ib_hca: str | None = None,
) -> dict:
    """Decide on an ``all_gather_perf`` run whose output includes NCCL_DEBUG=INFO lines.

    The bus bandwidth judged is the ``Avg bus bandwidth`` line (what NVIDIA's script checks:
    the mean over every size and both places), else the mean of the rows, in the bands of
    :func:`decide_nccl`. Any ``#wrong`` value or NCCL failure fails the check; so do devices
    other than ``ib_hca``'s twins.
    """
    parsed = parse_all_gather_perf(text)
    busbw = parsed["avg_busbw_gbps"]
    if busbw is None and parsed["rows"]:
        values = [
            v
            for r in parsed["rows"]
            for v in (r.get("oop_busbw_gbps"), r.get("ip_busbw_gbps"))
            if v is not None
        ]
        busbw = sum(values) / len(values) if values else None
    extra = []
    if parsed["wrong"]:
        extra.append(f"{parsed['wrong']} wrong values (data corruption)")
    if parsed["failure"]:
        extra.append(parsed["failure"])
    if not parsed["rows"]:
        extra.append("no result rows")
    result = decide_nccl(
        busbw, nccl_transport(text), floor_gbps, healthy_gbps, reference_gbps, require_ib,
        ib_hca, extra,
    )  # fmt: skip
    result["rows"] = parsed["rows"]
    return result


def check_busbw_json(
    text: str,
    floor_gbps: float = DEFAULT_BUSBW_FLOOR_GBPS,
    healthy_gbps: float = DEFAULT_HEALTHY_BUSBW_GBPS,
    reference_gbps: float = REFERENCE_BUSBW_GBPS,
    require_ib: bool = True,
    ib_hca: str | None = None,
) -> dict:
    """Decide on the JSON line of ``nccl_allgather_busbw.py`` (which carries its transport).

    The transport is every rank's (``nccl``); the devices compared with ``ib_hca`` are the
    line's own rank's (``nccl_local``, when the script wrote it): each node's comm.env names
    its own twins.
    """
    data = parse_busbw_json(text)
    transport = dict(data.get("nccl") or {"transport": data.get("transport", "unknown")})
    local = data.get("nccl_local")
    if isinstance(local, dict):
        for key in ("ib_devices", "channel_devices"):
            transport[key] = list(local.get(key) or [])
    extra = []
    if data.get("wrong"):
        extra.append(f"{data['wrong']} wrong values after all_gather (data corruption)")
    result = decide_nccl(
        float(data["busbw_gbps"]), transport, floor_gbps, healthy_gbps, reference_gbps,
        require_ib, ib_hca, extra,
    )  # fmt: skip
    result["measurement"] = data
    return result
