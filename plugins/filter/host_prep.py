# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the host_prep role uses; thin wrappers over plugins/module_utils (documented in the
sidecar YAML files next to this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (
    cx7_ports,
    fast_link,
    link_checks,
    link_plan,
    spark_platform,
    twin_definitions,
)
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def host_prep_cabled(links, ibdev2netdev, host="", rc=0, error=""):
    """Name the links' netdev and RoCE device from the cabled port: {links, ports, errors, ...}."""
    return cx7_ports.name_links(
        links, str(ibdev2netdev or ""), str(host), int(rc or 0), str(error or "")
    )


def host_prep_links(links, host, facts, fast_ip, mgmt_ip="", mtu=9000):
    """One node's host_prep_cx7_links, checked against its facts: {links, errors}."""
    return fast_link.resolve_links(links, str(host), dict(facts), str(fast_ip), str(mgmt_ip), mtu)


def host_prep_nodes(hosts, hostvars, me=None, suffix="-fast"):
    """All nodes at once: cross-node errors, /etc/hosts entries and (for ``me``) peer targets."""
    hosts = [str(h) for h in hosts]
    links = {h: list(hostvars[h].get("_host_prep_links") or []) for h in hosts}
    nodes = {
        h: {"links": links[h], "fast_ip": str(hostvars[h].get("spark_fast_ip", ""))} for h in hosts
    }
    return {
        "errors": fast_link.cross_check(links),
        "host_entries": fast_link.host_entries(nodes, str(suffix)),
        "names_by_node": fast_link.known_host_names(nodes, str(suffix)),
        "peers": fast_link.peer_targets(links, str(me)) if me is not None else [],
        # Each node's cabled QSFP port as preflight found it (hardware only; none on the sim).
        "port_warnings": cx7_ports.port_mismatch(
            {h: (hostvars[h].get("_host_prep_cabled") or {}).get("ports") for h in hosts}
        ),
    }


def host_prep_roce(links, ibdev2netdev, host=""):
    """Fill each link's RoCE device from ``ibdev2netdev`` output: {links, errors}."""
    try:
        entries = link_checks.parse_ibdev2netdev(str(ibdev2netdev))
    except link_checks.CheckOutputError as exc:
        return {"links": list(links), "errors": [f"{host}: {exc}"]}
    return fast_link.attach_roce(list(links), entries, str(host))


def host_prep_comm_env(links, fast_ip, extra=None):
    """The communication environment (dict of str) for the node's resolved links."""
    try:
        return fast_link.comm_env(list(links), str(fast_ip), dict(extra or {}))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


_CHECKS = {
    "addresses": link_checks.check_addresses,
    "address_facts": link_checks.check_address_facts,
    "link": link_checks.check_link,
    "roce": link_checks.check_roce,
    "rdma": link_checks.check_ib_write_bw,
    "all_gather_perf": link_checks.check_all_gather_perf,
    "busbw_json": link_checks.check_busbw_json,
}


def host_prep_check(text, check, *args, **kwargs):
    """Decide one check on a tool's output: {check, passed, message, ...}."""
    if check not in _CHECKS:
        raise AnsibleFilterError(
            f"host_prep_check: unknown check {check!r}; one of {sorted(_CHECKS)}"
        )
    try:
        data = dict(text) if check == "address_facts" else str(text)
        return _CHECKS[check](data, *args, **kwargs)
    except link_checks.CheckOutputError as exc:
        return {
            "check": check,
            "passed": False,
            "message": f"cannot read the {check} output: {exc}",
        }


def host_prep_serving(containers, name):
    """Names of the running serving containers in docker_host_info's container list."""
    return link_plan.serving_containers(list(containers or []), name)


def host_prep_link_plan(hosts, hostvars, mode, hardware):
    """Whether the link benchmarks run this time, for all nodes: {run, reason, stale, serving}."""
    nodes = {}
    for host in (str(h) for h in hosts):
        facts = hostvars[host]
        nodes[host] = {
            "stamp": dict(facts.get("_host_prep_link_stamp") or {}),
            "serving": list(facts.get("_host_prep_serving") or []),
        }
    try:
        return link_plan.plan_link_check(str(mode), bool(hardware), nodes)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def host_prep_platform(nvidia_smi, gpus, host="", kernel=""):
    """GPUs against spark_gpus, and the kernel and driver against the known-bad table."""
    result = spark_platform.check_gpus(str(nvidia_smi), int(gpus), str(host))
    drivers = [g["driver"] for g in result["gpus"]]
    result["warnings"] = spark_platform.platform_warnings(str(kernel), drivers, str(host))
    return result


def host_prep_leftovers(listing, links, facts, own, netplan_dirs, nm_dirs, host=""):
    """Other netplan files and NetworkManager profiles that define the node's twins, from the
    find command's result: {passed, errors, found, read, ignored, message}."""
    twins = twin_definitions.twins_from_facts(list(links or []), dict(facts or {}))
    return twin_definitions.leftover_definitions(
        dict(listing or {}), twins, str(own), str(host), list(netplan_dirs), list(nm_dirs)
    )


def host_prep_gids(results, hostvars):
    """The RoCE GID index NCCL uses behind every twin of every node read (a loop of the GID
    tables' read over the nodes, each item a node): {check, passed, message, indices, errors}."""
    nodes = {}
    for result in results or []:
        node = str(result.get("item"))
        facts = hostvars[node]
        links = list(facts.get("_host_prep_links") or [])
        extra = dict(facts.get("_host_prep_comm_env_extra") or {})
        try:
            env = fast_link.comm_env(links, str(facts.get("spark_fast_ip", "")), extra)
        except ValueError:
            env = extra
        nodes[node] = {"text": str(result.get("stdout") or ""), "links": links, "env": env}
    return link_checks.check_gid_indices(nodes)


# The operations of the one filter this role uses, dgx_spark.cluster.host_prep:
# ``value | dgx_spark.cluster.host_prep('<operation>', ...)``.
OPERATIONS = {
    "cabled": host_prep_cabled,
    "links": host_prep_links,
    "nodes": host_prep_nodes,
    "roce": host_prep_roce,
    "comm_env": host_prep_comm_env,
    "check": host_prep_check,
    "serving": host_prep_serving,
    "platform": host_prep_platform,
    "link_plan": host_prep_link_plan,
    "leftovers": host_prep_leftovers,
    "gids": host_prep_gids,
}


class FilterModule:
    def filters(self):
        return {"host_prep": role_filter("host_prep", OPERATIONS)}
