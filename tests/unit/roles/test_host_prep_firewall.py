"""host_prep's firewall decisions, made and checked in roles/host_prep/tasks/validate.yml before
any change and put in place by tasks/firewall.yml, evaluated by Ansible's own templating on
inventories and facts: who is a peer, which ports are peer-only, who may reach the serving port,
which inputs are refused; and the ruleset they render, checked by nft itself when the controller
has it."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "host_prep"
TASKS = DataLoader().load_from_file(str(ROLE / "tasks/validate.yml"), trusted_as_template=True)
FIREWALL = DataLoader().load_from_file(str(ROLE / "tasks/firewall.yml"), trusted_as_template=True)
DEFAULTS = DataLoader().load_from_file(str(ROLE / "defaults/main.yml"), trusted_as_template=True)
# What the role's dependency spark_defaults gives it, below its own defaults.
SHARED = DataLoader().load_from_file(
    str(ROOT / "roles/spark_defaults/defaults/main.yml"), trusted_as_template=True
)
# The defaults of the roles that own the ports: the firewall must open what they use, though it
# reads only spark_defaults (and the inventory).
OWNERS = {
    owner: DataLoader().load_from_file(
        str(ROOT / "roles" / owner / "defaults/main.yml"), trusted_as_template=True
    )
    for owner in ("ray_cluster", "vllm_serve")
}


def _owner(owner: str) -> dict:
    """An owner's port defaults as they render beside spark_defaults."""
    defaults = OWNERS[owner]
    ports = {name: value for name, value in defaults.items() if name.endswith("_port")}
    return Templar(loader=DataLoader(), variables={**SHARED, **defaults}).template(ports)


def _task(name: str) -> dict:
    (task,) = [t for t in TASKS if t["name"] == name]
    return task


def _facts(mgmt: str, fast: str, prefix: int = 24) -> dict:
    """The network facts setup gathers on a simulated node (eth0 fast, eth1 management)."""

    def iface(device, address):
        net = address.rsplit(".", 1)[0] + ".0"
        ipv4 = {"address": address, "network": net, "netmask": "255.255.255.0"}
        return {"device": device, "ipv4": {**ipv4, "prefix": str(prefix)}}

    return {
        "interfaces": ["lo", "eth0", "eth1", "docker0", "veth3f2a1b0"],
        "lo": {
            "device": "lo",
            "ipv4": {"address": "127.0.0.1", "network": "127.0.0.0", "prefix": "8"},
        },
        "eth0": iface("eth0", fast),
        "eth1": iface("eth1", mgmt),
        "docker0": iface("docker0", "172.17.0.1"),
        # A container's end of a veth pair: an interface without an address.
        "veth3f2a1b0": {"device": "veth3f2a1b0", "active": True, "type": "ether"},
        "default_ipv4": {"address": mgmt, "interface": "eth1"},
        "locally_reachable_ips": {"ipv4": ["127.0.0.0/8", fast, mgmt], "ipv6": []},
        "service_mgr": "systemd",
    }


def _hostvars(twins: bool = False) -> dict:
    nodes = {"spark-1": ("192.0.2.11", "198.51.100.11"), "spark-2": ("192.0.2.12", "198.51.100.12")}
    out = {}
    for name, (mgmt, fast) in nodes.items():
        links = [{"netdev": "enp1s0f1np1", "address": f"{fast}/24"}]
        if twins:
            links.append(
                {"netdev": "enP2p1s0f1np1", "address": fast.replace("100.", "101.") + "/24"}
            )
        out[name] = {"ansible_host": mgmt, "spark_fast_ip": fast, "_host_prep_links": links,
                     "ansible_facts": _facts(mgmt, fast)}  # fmt: skip
    return out


def decide(host: str = "spark-1", hostvars: dict | None = None, **overrides) -> dict:
    """Runs the firewall's deciding and checking tasks of validate.yml, in order, the way Ansible
    templates them."""
    hostvars = hostvars or _hostvars()
    variables = {
        **SHARED,
        **DEFAULTS,
        "host_prep_comm_env_file": "/etc/dgx-spark/comm.env",
        "host_prep_nccl_master_port": 29511,
        "host_prep_rdma_port": 18515,
        "inventory_hostname": host,
        "groups": {"sparks": list(hostvars)},
        "hostvars": hostvars,
        **hostvars[host],
        "_host_prep_firewall_ephemeral": {"content": base64.b64encode(b"32768\t60999\n").decode()},
    }
    variables.update(overrides)
    # The facts ray_cluster and vllm_serve publish (their tasks/facts.yml), from their defaults
    # and the inventory's values, as validate.yml's include_role tasks set them.
    for owner in OWNERS:
        (publish,) = DataLoader().load_from_file(
            str(ROOT / "roles" / owner / "tasks/facts.yml"), trusted_as_template=True
        )
        scope = {**SHARED, **OWNERS[owner], **variables}
        for key, value in publish["ansible.builtin.set_fact"].items():
            variables[key] = Templar(loader=DataLoader(), variables=scope).template(value)
    for name in (
        "Find the management network, the network of the interface that carries ansible_host",
        "Choose who may reach which port",
        "Require valid addresses and ports for the firewall",
    ):
        task = _task(name)
        scope = {**variables, **task.get("vars", {})}
        templar = Templar(loader=DataLoader(), variables=scope)
        if "ansible.builtin.set_fact" in task:
            for key, value in task["ansible.builtin.set_fact"].items():
                variables[key] = templar.template(value)
        else:
            scope = {**variables, **task.get("vars", {})}
            errors = Templar(loader=DataLoader(), variables=scope).template(
                trust_as_template("{{ _errors }}")
            )
            variables["_errors"] = errors
    return variables


def test_ray_nccl_and_launcher_ports_are_peer_only_and_those_their_roles_use():
    out = decide()
    ray = _owner("ray_cluster")
    ports = out["_host_prep_firewall_cluster_ports"]
    names = "gcs node_manager object_manager dashboard_agent_listen dashboard_agent_grpc"
    names = (*names.split(), "runtime_env_agent", "metrics_export", "dashboard")
    for name in names:
        assert str(ray[f"ray_cluster_{name}_port"]) in ports, name
    assert f"{ray['ray_cluster_min_worker_port']}-{ray['ray_cluster_max_worker_port']}" in ports
    vllm = _owner("vllm_serve")
    assert str(vllm["vllm_serve_master_port"]) in ports
    # host_prep's own checks, Ray's client server and NCCL's (kernel-chosen) ports.
    assert {"29511", "18515-18515", "10001", "32768-60999"} <= set(ports)
    assert str(vllm["vllm_serve_port"]) not in ports
    assert out["_host_prep_firewall_serving_port"] == vllm["vllm_serve_port"]
    assert out["_errors"] == []


def test_the_inventory_wins_over_the_owning_roles_defaults():
    out = decide(ray_cluster_gcs_port=7000, ray_cluster_min_worker_port=20000,
                 ray_cluster_max_worker_port=20100, vllm_serve_master_port=29600,
                 vllm_serve_port=8080, host_prep_firewall_ephemeral_ports=False)  # fmt: skip
    ports = out["_host_prep_firewall_cluster_ports"]
    assert {"7000", "20000-20100", "29600"} <= set(ports)
    assert "10002-19999" not in ports and "29501" not in ports
    # vllm_serve reads the GCS port on its own (vllm_serve_ray_gcs_port): both stay closed.
    assert "6379" in ports
    assert "32768-60999" not in ports
    assert out["_host_prep_firewall_serving_port"] == 8080


def test_peers_are_the_other_nodes_fast_addresses_with_every_twin():
    assert decide("spark-1")["_host_prep_firewall_peers"] == ["198.51.100.12"]
    assert decide("spark-2")["_host_prep_firewall_peers"] == ["198.51.100.11"]
    twins = decide("spark-1", _hostvars(twins=True))
    assert twins["_host_prep_firewall_peers"] == ["198.51.100.12", "198.51.101.12"]
    # One ib_write_bw server per twin.
    assert "18515-18516" in twins["_host_prep_firewall_cluster_ports"]


def test_a_node_left_out_by_limit_is_still_a_peer_from_the_inventory():
    hostvars = _hostvars()
    worker = hostvars["spark-2"]
    del worker["_host_prep_links"]
    worker["host_prep_cx7_links"] = [{"netdev": "a", "address": "198.51.100.12/24"},
                                     {"netdev": "b", "address": "198.51.101.12/24"}]  # fmt: skip
    assert decide("spark-1", hostvars)["_host_prep_firewall_peers"] == [
        "198.51.100.12",
        "198.51.101.12",
    ]
    del worker["host_prep_cx7_links"]
    assert decide("spark-1", hostvars)["_host_prep_firewall_peers"] == ["198.51.100.12"]


def test_serving_port_defaults_to_the_management_network():
    out = decide()
    assert out["_host_prep_firewall_management"] == ["192.0.2.0/24"]
    assert out["_host_prep_firewall_sources"] == ["192.0.2.0/24"]


@pytest.mark.parametrize(
    ("given", "sources"),
    [
        (["10.0.0.0/8", "192.0.2.7"], ["10.0.0.0/8", "192.0.2.7"]),
        ([], []),
        (["0.0.0.0/0"], ["0.0.0.0/0"]),
        ("10.0.0.0/8, 192.0.2.7", ["10.0.0.0/8", "192.0.2.7"]),
    ],
)
def test_allowed_sources_replace_the_management_network(given, sources):
    out = decide(vllm_serve_allowed_sources=given)
    assert out["_host_prep_firewall_sources"] == sources
    assert out["_errors"] == []


NOT_CIDR = ", not an IPv4 address or CIDR (a.b.c.d or a.b.c.d/0-32)"
NOT_PORT = ", not a TCP port (1-65535) or a first-last range of them"
BACKWARDS = ", a range whose first port is above its last"
SOURCES = "vllm_serve_allowed_sources (host_prep_firewall_serving_sources) holds "
EXTRA = "host_prep_firewall_extra_peer_ports"
RAY_WORKERS = "ray_cluster_min_worker_port-ray_cluster_max_worker_port"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"vllm_serve_allowed_sources": ["10.0.0.0/33"]}, SOURCES + "10.0.0.0/33" + NOT_CIDR),
        ({"vllm_serve_allowed_sources": ["example.org"]}, SOURCES + "example.org" + NOT_CIDR),
        ({"vllm_serve_allowed_sources": "10.0.0.0/8, 256.1.1.1"}, SOURCES + "256.1.1.1" + NOT_CIDR),
        ({EXTRA: ["ssh"]}, EXTRA + " is ssh" + NOT_PORT),
        ({EXTRA: ["70000"]}, EXTRA + " is 70000" + NOT_PORT),
        ({EXTRA: ["0"]}, EXTRA + " is 0" + NOT_PORT),
        ({EXTRA: ["65000-65536"]}, EXTRA + " is 65000-65536" + NOT_PORT),
        ({EXTRA: ["9000-8000"]}, EXTRA + " is 9000-8000" + BACKWARDS),
        ({"ray_cluster_gcs_port": 65536}, "ray_cluster_gcs_port is 65536" + NOT_PORT),
        (
            {"ray_cluster_min_worker_port": 20000, "ray_cluster_max_worker_port": 10000},
            RAY_WORKERS + " is 20000-10000" + BACKWARDS,
        ),
        (
            {"host_prep_rdma_port": 65535, "hostvars": _hostvars(twins=True)},
            "host_prep_rdma_port and one per twin is 65535-65536" + NOT_PORT,
        ),
        ({"ansible_host": "203.0.113.5"}, "set vllm_serve_allowed_sources"),
    ],
)
def test_bad_inputs_are_refused_with_the_variable_named(overrides, words):
    overrides = dict(overrides)
    errors = decide(hostvars=overrides.pop("hostvars", None), **overrides)["_errors"]
    assert len(errors) == 1 and words in errors[0] and errors[0].startswith("spark-1: "), errors


def test_every_bad_value_is_named_at_once():
    sources = ["10.0.0.0/8", "nowhere"]
    errors = decide(vllm_serve_allowed_sources=sources, **{EXTRA: ["10001", "ssh", "9000-8000"]})
    assert [e.split(": ", 1)[1] for e in errors["_errors"]] == [
        SOURCES + "nowhere" + NOT_CIDR,
        EXTRA + " is ssh" + NOT_PORT,
        EXTRA + " is 9000-8000" + BACKWARDS + " (allowed: first-last, first <= last)",
    ]


def test_a_lone_node_is_refused_with_the_way_out_named():
    errors = decide(hostvars={"spark-1": _hostvars()["spark-1"]})["_errors"]
    assert len(errors) == 1 and "no other node in the sparks group" in errors[0]
    assert "host_prep_firewall: false" in errors[0]


def test_no_management_network_is_fine_when_sources_are_given():
    out = decide(ansible_host="203.0.113.5", vllm_serve_allowed_sources=["203.0.113.0/24"])
    assert out["_errors"] == []


def _ruleset(**overrides) -> str:
    out = decide(**overrides)
    templar = Templar(loader=DataLoader(), variables={**out, "ansible_managed": "Ansible managed"})
    text = (ROLE / "templates/firewall.nft.j2").read_text()
    return templar.template(trust_as_template(text))


def test_ruleset_accepts_ssh_and_loopback_before_any_refusal():
    text = _ruleset()
    chain = text[text.index("chain input") :]
    rules = [line.strip() for line in chain.splitlines()[2:] if line.strip() and "#" not in line]
    assert rules[:3] == ["iif \"lo\" accept", "ct state established,related accept",
                         "tcp dport { 22 } accept"]  # fmt: skip
    assert "policy accept;" in chain
    assert all("reject" in r or r.endswith("accept") or r == "}" for r in rules)
    assert "elements = { 198.51.100.12 }" in text
    assert "elements = { 192.0.2.0/24 }" in text
    assert _ruleset(ansible_port=2222).count("tcp dport { 22, 2222 } accept") == 1


def test_ruleset_with_no_serving_sources_declares_an_empty_set():
    text = _ruleset(vllm_serve_allowed_sources=[])
    block = text[text.index("set serving_sources") : text.index("set cluster_ports")]
    assert "elements" not in block


MONITORED = {
    "spark_monitoring": True,
    "groups": {"sparks": ["spark-1", "spark-2"], "spark_head": ["spark-1"]},
}


@pytest.mark.parametrize("host", ["spark-1", "spark-2"])
def test_monitoring_keeps_the_node_exporter_to_the_head_and_prometheus_to_the_sources(host):
    text = _ruleset(host=host, hostvars=_hostvars(twins=True), **MONITORED)
    scrapers = text[text.index("set scrapers") : text.index("set cluster_ports")]
    # The head's fast-link address and each of its twins, nothing of the worker's.
    assert "elements = { 198.51.100.11, 198.51.101.11 }" in scrapers
    chain = text[text.index("chain input") :]
    accept = chain.index("tcp dport 9100 ip saddr @scrapers accept")
    assert accept < chain.index('tcp dport 9100 counter name "refused_monitoring" reject')
    accept = chain.index("tcp dport 9090 ip saddr @serving_sources accept")
    assert accept < chain.index('tcp dport 9090 counter name "refused_monitoring" reject')
    # Both come before the cluster ports' refusal, which would otherwise not cover them.
    assert accept < chain.index("tcp dport @cluster_ports ip saddr @peers accept")


def test_monitoring_ports_follow_spark_defaults_and_leave_no_trace_when_off():
    text = _ruleset(spark_monitoring_node_exporter_port=9200, spark_monitoring_prometheus_port=9290,
                    **MONITORED)  # fmt: skip
    assert "tcp dport 9200 ip saddr @scrapers accept" in text
    assert "tcp dport 9290 ip saddr @serving_sources accept" in text
    off = _ruleset()
    assert "scrapers" not in off and "refused_monitoring" not in off and "9100" not in off


NFT = shutil.which("nft")
UNSHARE = shutil.which("unshare")


@pytest.mark.skipif(not (NFT and UNSHARE and os.geteuid() == 0), reason="needs nft, unshare, root")
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"vllm_serve_allowed_sources": []},
        {"ansible_port": 2222, "host_prep_firewall_ephemeral_ports": False},
        {"spark_monitoring": True},
    ],
)
def test_nft_loads_the_ruleset_twice_in_a_scratch_namespace(tmp_path, overrides):
    path = tmp_path / "firewall.nft"
    path.write_text(_ruleset(**overrides))
    # Loaded twice: the second load replaces the table (no "File exists"), as every rerun does.
    script = 'nft -f "$1" && nft -f "$1" && nft -s list table inet dgx_spark'
    proc = subprocess.run([UNSHARE, "--net", "sh", "-c", script, "sh", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("no network namespace here")
    assert proc.returncode == 0, proc.stderr
    assert "reject with tcp reset" in proc.stdout


def _names(node) -> set[str]:
    """The host_prep_firewall facts a task or template reads."""
    return set(re.findall(r"\b_host_prep_firewall_[a-z_]+", str(node)))


def test_validate_decides_and_checks_before_any_change_and_firewall_does_not_check_again():
    names = [t["name"] for t in TASKS]
    assert "Require valid addresses and ports for the firewall" in names
    # Deciding and checking read only: facts, the inventory, spark_defaults and /proc.
    firewall_tasks = [t for t in TASKS if "_host_prep_firewall" in str(t)]
    read_only = {f"ansible.builtin.{m}" for m in ("slurp", "set_fact", "assert")}
    assert all(read_only & set(t) for t in firewall_tasks), [t["name"] for t in firewall_tasks]
    assert not [t["name"] for t in FIREWALL
                if {"ansible.builtin.assert", "ansible.builtin.fail"} & set(t)]  # fmt: skip


def test_firewall_reads_only_what_validate_decided_or_it_registers_itself():
    registered = {t["register"] for t in FIREWALL if "register" in t}
    registered |= {k for t in FIREWALL for k in t.get("ansible.builtin.set_fact", {})}
    loop_vars = {t["loop_control"]["loop_var"] for t in FIREWALL if "loop_control" in t}
    template = (ROLE / "templates/firewall.nft.j2").read_text()
    decided = {k for t in TASKS for k in t.get("ansible.builtin.set_fact", {})}
    read = _names(FIREWALL) | _names(template)
    assert read - registered - loop_vars <= decided
