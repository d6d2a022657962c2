"""Tests for plugins/module_utils/cx7_ports.py: the cabled QSFP port found in ibdev2netdev
output (tests/unit/fixtures/host_prep/, sources in its README), and the links it names."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import cx7_ports as cp
from ansible_collections.dgx_spark.cluster.plugins.module_utils import fast_link as fl
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_checks as lc
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"
# inventories/sparks: addresses only, the names are found.
ADDRESSES = [{"address": "198.51.100.11/24"}, {"address": "198.51.101.11/24"}]
# The names the production inventory pinned before: port 1's twins.
PINNED_PORT_1 = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.11/24"},
]
PORT_0 = [("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")]
PORT_1 = [("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]
L0, L1 = "spark-1: host_prep_cx7_links[0]", "spark-1: host_prep_cx7_links[1]"


def fixture(name: str) -> str:
    return tool_output(FIXTURES / name)


def named(links, name: str) -> dict:
    return cp.name_links(links, fixture(name), "spark-1")


def names(got: dict) -> list[tuple[str, str]]:
    return [(link["netdev"], link["roce"]) for link in got["links"]]


# --------------------------------------------------------------------------- the captures


@pytest.mark.parametrize(
    ("name", "port", "twins"),
    [
        # NVIDIA's two-Spark guide (devices listed in C-locale order: roceP2... first).
        ("ibdev2netdev_port1.txt", 1, PORT_1),
        # spark-vllm-docker's networking guide (the same cable, the other listing order).
        ("ibdev2netdev_up.txt", 1, PORT_1),
        # NVIDIA's NCCL guide, two Sparks: the cable in port 0.
        ("ibdev2netdev_port0.txt", 0, PORT_0),
    ],
)
def test_the_cabled_port_names_both_twins(name, port, twins):
    got = named(ADDRESSES, name)
    assert got["errors"] == [] and got["warnings"] == []
    assert got["ports"] == [port]
    assert names(got) == twins
    assert [link["address"] for link in got["links"]] == ["198.51.100.11/24", "198.51.101.11/24"]
    assert got["message"] == (
        f"spark-1: QSFP port {port} is cabled (Up): "
        f"host_prep_cx7_links[0] = {twins[0][0]} ({twins[0][1]}), "
        f"host_prep_cx7_links[1] = {twins[1][0]} ({twins[1][1]})"
    )


@pytest.mark.parametrize(
    ("name", "hca", "ifname"),
    [
        ("ibdev2netdev_port0.txt", "rocep1s0f0,roceP2p1s0f0", "enp1s0f0np0"),
        ("ibdev2netdev_port1.txt", "rocep1s0f1,roceP2p1s0f1", "enp1s0f1np1"),
    ],
)
def test_the_comm_env_follows_the_cable(name, hca, ifname):
    """ibdev2netdev -> links -> resolve_links -> NCCL_IB_HCA, as validate.yml chains them."""
    got = named(ADDRESSES, name)
    interfaces = ["enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1", "enP7s7"]
    facts = {"interfaces": interfaces, **{i: {"device": i, "mtu": 1500} for i in interfaces}}
    facts["enP7s7"]["ipv4"] = {"address": "192.0.2.11", "prefix": "24"}
    resolved = fl.resolve_links(got["links"], "spark-1", facts, "198.51.100.11", "192.0.2.11")
    assert resolved["errors"] == []
    env = fl.comm_env(resolved["links"], "198.51.100.11")
    assert env["NCCL_IB_HCA"] == hca
    assert env["NCCL_SOCKET_IFNAME"] == ifname
    assert env["NCCL_IB_DISABLE"] == "0"


def test_no_cable_is_refused_with_the_fix():
    got = named(ADDRESSES, "ibdev2netdev_no_cable.txt")
    assert got["ports"] == []
    assert got["errors"] == [
        "spark-1: no ConnectX-7 port is Up, so host_prep_cx7_links has no cabled port to use "
        "(ibdev2netdev: QSFP port 0: enp1s0f0np0 (rocep1s0f0) Down, enP2p1s0f0np0 "
        "(roceP2p1s0f0) Down; QSFP port 1: enp1s0f1np1 (rocep1s0f1) Down, enP2p1s0f1np1 "
        "(roceP2p1s0f1) Down). Seat the QSFP cable firmly at both ends (NVIDIA's two-Spark "
        "guide uses the same port on both Sparks) and make sure the peer is powered on; if no "
        "port comes Up, reboot both Sparks and run again"
    ]
    # Pinned names change nothing: the cable is what is missing.
    assert named(PINNED_PORT_1, "ibdev2netdev_no_cable.txt")["errors"] == got["errors"]


def test_one_twin_down_is_refused():
    got = named(ADDRESSES, "ibdev2netdev_twin_down.txt")
    assert got["errors"] == [
        f"{L1} takes twin enP2p1s0f1np1 (roceP2p1s0f1) of the cabled QSFP port 1, which "
        "ibdev2netdev shows Down while enp1s0f1np1 (rocep1s0f1) is Up: the cable is in, but one "
        "PCIe half of the port has no carrier. Reseat the QSFP cable at both ends and reboot "
        "both Sparks if it stays Down, or keep in host_prep_cx7_links only the Up twin(s) (one "
        "twin carries about half the bandwidth)"
    ]


def test_one_twin_down_with_one_link_passes():
    got = named(ADDRESSES[:1], "ibdev2netdev_twin_down.txt")
    assert got["errors"] == [] and got["warnings"] == []
    assert names(got) == PORT_1[:1]


def test_one_link_on_a_port_with_two_up_twins_warns():
    got = named(ADDRESSES[:1], "ibdev2netdev_port0.txt")
    assert got["errors"] == []
    assert names(got) == PORT_0[:1]
    assert got["warnings"] == [
        "spark-1: enP2p1s0f0np0 (roceP2p1s0f0) of the cabled QSFP port 0 is Up but no entry of "
        "host_prep_cx7_links uses it, so NCCL_IB_HCA leaves it out and RDMA gets about half the "
        "port's bandwidth; add a link (its own subnet) for it"
    ]


# --------------------------------------------------------------------------- pinned names


def test_pinned_names_that_are_up_pass():
    got = named(PINNED_PORT_1, "ibdev2netdev_port1.txt")
    assert got["errors"] == []
    assert names(got) == PORT_1


def test_pinned_port_1_with_the_cable_in_port_0_is_refused():
    got = named(PINNED_PORT_1, "ibdev2netdev_port0.txt")
    assert got["errors"] == [
        f"{L0}.netdev is pinned to enp1s0f1np1, which ibdev2netdev shows Down; the Up one is "
        "enp1s0f0np0 (QSFP port 0 is the cabled one; Up: enp1s0f0np0 (rocep1s0f0), "
        "enP2p1s0f0np0 (roceP2p1s0f0)). Set netdev to enp1s0f0np0, or leave it out (auto) so "
        "host_prep uses the cabled port's twins",
        f"{L1}.netdev is pinned to enP2p1s0f1np1, which ibdev2netdev shows Down; the Up one is "
        "enP2p1s0f0np0 (QSFP port 0 is the cabled one; Up: enp1s0f0np0 (rocep1s0f0), "
        "enP2p1s0f0np0 (roceP2p1s0f0)). Set netdev to enP2p1s0f0np0, or leave it out (auto) so "
        "host_prep uses the cabled port's twins",
    ]


def test_pinned_roce_alone_names_its_netdev():
    links = [{"roce": "roceP2p1s0f0", "address": "198.51.100.11/24"}, ADDRESSES[1]]
    got = named(links, "ibdev2netdev_port0.txt")
    assert got["errors"] == []
    # The pinned device takes its twin; the entry left to discovery gets the other one.
    assert names(got) == [PORT_0[1], PORT_0[0]]


def test_pinned_roce_that_is_down_is_refused():
    links = [{"netdev": "auto", "roce": "rocep1s0f1", "address": "198.51.100.11/24"}]
    got = named(links, "ibdev2netdev_port0.txt")
    assert got["errors"] == [
        f"{L0}.roce is pinned to rocep1s0f1, which ibdev2netdev shows Down; the Up one is "
        "rocep1s0f0 (QSFP port 0 is the cabled one; Up: enp1s0f0np0 (rocep1s0f0), "
        "enP2p1s0f0np0 (roceP2p1s0f0)). Set roce to rocep1s0f0, or leave it out (auto) so "
        "host_prep uses the cabled port's twins"
    ]


def test_pinned_twin_down_says_it_is_the_same_port():
    got = named(PINNED_PORT_1, "ibdev2netdev_twin_down.txt")
    assert got["errors"] == [
        f"{L1}.netdev is pinned to enP2p1s0f1np1, which ibdev2netdev shows Down, while its twin "
        "enp1s0f1np1 (rocep1s0f1) on the same QSFP port 1 is Up: the cable is in, but this PCIe "
        "half of the port has no carrier. Reseat the QSFP cable at both ends and reboot both "
        "Sparks if it stays Down, or remove this entry from host_prep_cx7_links (one twin "
        "carries about half the bandwidth)"
    ]


def test_pinned_name_ibdev2netdev_does_not_list():
    links = [{"netdev": "enp9s0f0np0", "address": "198.51.100.11/24"}]
    got = named(links, "ibdev2netdev_port1.txt")
    assert got["errors"][0].startswith(
        f"{L0}.netdev is pinned to enp9s0f0np0, which ibdev2netdev does not list; the Up one is "
        "enp1s0f1np1 (QSFP port 1 is the cabled one"
    )


# --------------------------------------------------------------------------- two cables


def test_both_ports_up_is_ambiguous_for_two_links():
    got = named(ADDRESSES, "ibdev2netdev_both_ports.txt")
    assert got["ports"] == [0, 1]
    assert got["errors"] == [
        "spark-1: both QSFP ports are Up (QSFP port 0: enp1s0f0np0 (rocep1s0f0) Up, "
        "enP2p1s0f0np0 (roceP2p1s0f0) Up; QSFP port 1: enp1s0f1np1 (rocep1s0f1) Up, "
        "enP2p1s0f1np1 (roceP2p1s0f1) Up), so which one is cabled to the peer is ambiguous for "
        "host_prep_cx7_links[0], host_prep_cx7_links[1]: pin their netdev to the twins of the "
        "port that reaches the peer, or list one link per Up twin (4) when both ports are "
        "cabled to it"
    ]


def test_both_ports_up_with_four_links_takes_every_twin():
    links = [{"address": f"198.51.10{n}.11/24"} for n in range(4)]
    got = named(links, "ibdev2netdev_both_ports.txt")
    assert got["errors"] == [] and got["warnings"] == []
    assert names(got) == PORT_0 + PORT_1
    assert got["message"].startswith("spark-1: QSFP ports 0 and 1 are cabled (Up): ")


def test_both_ports_up_with_pinned_links_passes():
    assert named(PINNED_PORT_1, "ibdev2netdev_both_ports.txt")["errors"] == []


def test_more_links_than_twins_is_refused():
    links = [{"address": f"198.51.10{n}.11/24"} for n in range(3)]
    got = named(links, "ibdev2netdev_port1.txt")
    assert got["errors"] == [
        "spark-1: host_prep_cx7_links leaves 3 entries (host_prep_cx7_links[0], "
        "host_prep_cx7_links[1], host_prep_cx7_links[2]) to discovery, but the cabled port has "
        "2 twin(s) left for them (enp1s0f1np1 (rocep1s0f1), enP2p1s0f1np1 (roceP2p1s0f1)); a "
        "QSFP port has two twins: list at most 2 there, or pin the others' netdev"
    ]


# --------------------------------------------------------------------------- the tool itself


def test_every_fixture_is_what_ibdev2netdev_prints():
    """No header or comment: each line is one the tool prints (the README holds the sources)."""
    for path in sorted(FIXTURES.glob("ibdev2netdev_*.txt")):
        entries = lc.parse_ibdev2netdev(tool_output(path))
        assert len(entries) == 4, path.name
        assert {e["state"] for e in entries} <= {"Up", "Down"}, path.name
        assert sorted(cp.qsfp_ports(entries)) == [0, 1], path.name


@pytest.mark.parametrize(
    ("text", "rc", "error", "message"),
    [
        ("", 0, "", "spark-1: ibdev2netdev lists no RoCE device, so host_prep_cx7_links has no "
         "ConnectX-7 port to use: no Mellanox netdev is visible (spark_hardware is true only on "
         "Sparks; the simulated pair sets it false)"),
        ("", 255, "", "spark-1: ibdev2netdev failed (rc 255); it maps the RoCE devices to the "
         "ConnectX-7 netdevs on a Spark (DGX OS ships it with DOCA-OFED, and it needs the mlx5 "
         "RDMA driver loaded)"),
        ("", 2, "[Errno 2] No such file or directory: b'ibdev2netdev'",
         "spark-1: ibdev2netdev failed (rc 2: [Errno 2] No such file or directory: "
         "b'ibdev2netdev'); it maps"),
        ("bash: ibdev2netdev: command not found\n", 0, "",
         "spark-1: cannot read the ibdev2netdev output: not an ibdev2netdev line: "
         "'bash: ibdev2netdev: command not found'"),
    ],
)  # fmt: skip
def test_unusable_output_is_refused(text, rc, error, message):
    got = cp.name_links(ADDRESSES, text, "spark-1", rc, error)
    assert len(got["errors"]) == 1 and got["errors"][0].startswith(message), got["errors"]
    assert got["links"] == ADDRESSES


def test_other_rdma_devices_belong_to_no_port():
    text = fixture("ibdev2netdev_port0.txt") + "mlx5_0 port 1 ==> ibp26s0 (Down)\n"
    entries = lc.parse_ibdev2netdev(text)
    assert [t["netdev"] for t in cp.qsfp_ports(entries)[0]] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    assert names(cp.name_links(ADDRESSES, text, "spark-1")) == PORT_0
    down = fixture("ibdev2netdev_no_cable.txt") + "mlx5_0 port 1 ==> ibp26s0 (Down)\n"
    assert "; other: ibp26s0 (mlx5_0) Down)" in cp.name_links(ADDRESSES, down, "h")["errors"][0]


# What the simulated pair's stand-in ibdev2netdev prints (tests/sim/host_prep_standins/).
STANDIN = "roce_eth0 port 1 ==> eth0 (Up)\nroce_eth1 port 1 ==> eth1 (Up)\n"


def test_devices_not_named_like_a_spark_leave_auto_to_the_fast_ip():
    links = [{"netdev": "auto", "address": "172.30.241.11/24"}]
    got = cp.name_links(links, STANDIN, "spark-1")
    assert got["errors"] == [] and got["warnings"] == [] and got["ports"] == []
    assert got["links"] == links
    assert got["message"] == (
        "spark-1: ibdev2netdev names no ConnectX-7 function the Spark way (en...np<N>), so no "
        "QSFP port is found by name: host_prep_cx7_links is used as given, auto being the "
        "interface that carries spark_fast_ip (Up: eth0 (roce_eth0), eth1 (roce_eth1))"
    )
    pinned = cp.name_links([{"netdev": "eth0", "address": "172.30.241.11/24"}], STANDIN, "h")
    assert pinned["errors"] == [] and pinned["links"][0]["roce"] == "roce_eth0"
    down = cp.name_links([{"netdev": "eth2", "address": "172.30.241.11/24"}], STANDIN, "h")
    assert down["errors"] == [
        "h: host_prep_cx7_links[0].netdev is pinned to eth2, which ibdev2netdev does not list; "
        "Up: eth0 (roce_eth0), eth1 (roce_eth1). Set netdev to an Up one"
    ]


def test_bad_entries_are_left_for_resolve_links():
    links = ["enp1s0f1np1", {"address": "198.51.100.11/24"}]
    got = named(links, "ibdev2netdev_port1.txt")
    assert got["errors"] == []
    assert got["links"][0] == "enp1s0f1np1"
    assert got["links"][1]["netdev"] == "enp1s0f1np1"
    assert named("enp1s0f1np1", "ibdev2netdev_port1.txt")["links"] == "enp1s0f1np1"


def test_roce_auto_is_filled_and_the_input_is_not_changed():
    links = [{"netdev": "auto", "roce": "auto", "address": "198.51.100.11/24"}]
    got = named(links, "ibdev2netdev_port0.txt")
    assert names(got) == PORT_0[:1]
    assert links == [{"netdev": "auto", "roce": "auto", "address": "198.51.100.11/24"}]


# --------------------------------------------------------------------------- same port on both


def cabled(name: str, host: str) -> list[int]:
    """The node's cabled port as host_prep's validate finds it (``_host_prep_cabled.ports``)."""
    return cp.name_links([{"address": "198.51.100.11/24"}], fixture(name), host)["ports"]


def test_cables_in_different_ports_warn_naming_each_node_and_its_port():
    ports = {
        "spark-2": cabled("ibdev2netdev_port1.txt", "spark-2"),
        "spark-1": cabled("ibdev2netdev_port0.txt", "spark-1"),
    }
    assert ports == {"spark-2": [1], "spark-1": [0]}
    (warning,) = cp.port_mismatch(ports)
    assert warning.startswith(
        "the nodes' cables sit in different QSFP ports (spark-1 QSFP port 0, spark-2 QSFP port 1)"
    )
    assert "same physical port on both Sparks" in warning
    assert "github.com/NVIDIA/dgx-spark-playbooks/blob/main/nvidia/connect-two-sparks" in warning


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # The same cable seen by two captures in two listing orders: both port 1.
        ("ibdev2netdev_port1.txt", "ibdev2netdev_up.txt"),
        ("ibdev2netdev_port0.txt", "ibdev2netdev_port0.txt"),
    ],
)
def test_cables_in_the_same_port_say_nothing(first, second):
    ports = {"spark-1": cabled(first, "spark-1"), "spark-2": cabled(second, "spark-2")}
    assert ports["spark-1"] == ports["spark-2"] and len(ports["spark-1"]) == 1
    assert cp.port_mismatch(ports) == []


@pytest.mark.parametrize(
    "other",
    [
        # No port Up (name_links refuses this node anyway), or both ports cabled.
        "ibdev2netdev_no_cable.txt",
        "ibdev2netdev_both_ports.txt",
    ],
)
def test_a_node_whose_port_is_unknown_says_nothing(other):
    ports = {"spark-1": cabled("ibdev2netdev_port0.txt", "spark-1"), "spark-2": cabled(other, "h")}
    assert ports["spark-1"] == [0] and len(ports["spark-2"]) != 1
    assert cp.port_mismatch(ports) == []


def test_port_mismatch_reads_what_the_playbook_hands_it():
    # Off hardware (or no ConnectX-7 named the Spark way) a node has no ports: left out.
    assert cp.port_mismatch({"spark-1": [0], "spark-2": []}) == []
    assert cp.port_mismatch({"spark-1": [0], "spark-2": None}) == []
    assert cp.port_mismatch({"spark-1": [1]}) == []
    assert cp.port_mismatch({}) == [] and cp.port_mismatch(None) == []
    # A bare number or its text (a hostvar that went through a template) counts as the port.
    assert len(cp.port_mismatch({"spark-1": 0, "spark-2": "1"})) == 1
    assert cp.port_mismatch({"spark-1": "1", "spark-2": [1]}) == []
    assert cp.port_mismatch({"spark-1": True, "spark-2": [0]}) == []
    # Three nodes, one odd: every known node is named.
    (warning,) = cp.port_mismatch({"c": [1], "a": [1], "b": [0], "d": "auto"})
    assert "(a QSFP port 1, b QSFP port 0, c QSFP port 1)" in warning
