"""Tests for plugins/module_utils/fast_link.py: the inventory's links checked against a node's
facts and against the other nodes, and the environment derived from them."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import fast_link as fl


def facts(**interfaces) -> dict:
    """Ansible-shaped facts: facts(eth0=("172.30.241.11", 9000), ...)."""
    out = {"interfaces": list(interfaces)}
    for name, (address, mtu) in interfaces.items():
        data = {"device": name, "mtu": mtu}
        if address:
            data["ipv4"] = {"address": address, "prefix": "24"}
        out[name.replace("-", "_")] = data
    return out


SIM = facts(eth0=("172.30.241.11", 9000), eth1=("172.30.240.11", 1500), lo=("127.0.0.1", 65536))
SPARK = facts(
    enp1s0f1np1=(None, 1500),
    enP2p1s0f1np1=(None, 1500),
    enP7s7=("192.0.2.11", 1500),
    lo=("127.0.0.1", 65536),
)
TWINS_1 = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.11/24"},
]
TWINS_2 = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.12/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.12/24"},
]


E0 = "spark-1: host_prep_cx7_links[0]"


def resolve(links, facts_=None, fast_ip="198.51.100.11", mgmt="192.0.2.11", mtu=9000):
    facts_ = SPARK if facts_ is None else facts_
    return fl.resolve_links(links, "spark-1", facts_, fast_ip, mgmt, mtu)


# --------------------------------------------------------------------------- one node


def test_spark_twins_resolve():
    got = resolve(TWINS_1)
    assert got["errors"] == []
    assert got["links"] == [
        {
            "index": 0,
            "netdev": "enp1s0f1np1",
            "roce": "rocep1s0f1",
            "address": "198.51.100.11/24",
            "ip": "198.51.100.11",
            "prefix": 24,
            "network": "198.51.100.0/24",
        },
        {
            "index": 1,
            "netdev": "enP2p1s0f1np1",
            "roce": "roceP2p1s0f1",
            "address": "198.51.101.11/24",
            "ip": "198.51.101.11",
            "prefix": 24,
            "network": "198.51.101.0/24",
        },
    ]


@pytest.mark.parametrize(("fast", "mgmt"), [("eth0", "eth1"), ("eth1", "eth0")])
def test_auto_finds_the_interface_carrying_spark_fast_ip(fast, mgmt):
    f = facts(**{fast: ("172.30.241.11", 9000), mgmt: ("172.30.240.11", 1500)})
    got = resolve([{"netdev": "auto", "address": "172.30.241.11/24"}], f, "172.30.241.11",
                  "172.30.240.11")  # fmt: skip
    assert got["errors"] == []
    assert got["links"][0]["netdev"] == fast
    assert got["links"][0]["roce"] == ""


def test_secondary_addresses_count_for_auto():
    f = facts(eth0=("10.0.0.5", 9000), eth1=("172.30.240.11", 1500))
    f["eth0"]["ipv4_secondaries"] = [{"address": "172.30.241.11"}]
    got = resolve([{"netdev": "auto", "address": "172.30.241.11/24"}], f, "172.30.241.11",
                  "172.30.240.11")  # fmt: skip
    assert got["links"][0]["netdev"] == "eth0"


@pytest.mark.parametrize(
    ("links", "mtu", "message"),
    [
        ([{"netdev": "enp1s0f1np1"}], 9000,
         E0 + ".address is missing (e.g. 198.51.100.11/24)"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.11"}], 9000,
         E0 + ".address '198.51.100.11' needs a prefix length (IP/prefix)"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.311/24"}], 9000,
         E0 + ".address '198.51.100.311/24' is not an IPv4 address with a prefix"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.11/31"}], 9000,
         E0 + ".address 198.51.100.11/31: prefix /31 leaves no room for a "
         "point-to-point link (use /8 to /30)"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.0/24"}], 9000,
         E0 + ".address 198.51.100.0/24 is its subnet's network or broadcast address"),
        ([{"netdev": "enp9s0", "address": "198.51.100.11/24"}], 9000,
         E0 + ".netdev enp9s0 is not an interface on spark-1 "
         "(it has: enP2p1s0f1np1, enP7s7, enp1s0f1np1, lo)"),
        ([{"netdev": "en p1", "address": "198.51.100.11/24"}], 9000,
         E0 + ".netdev 'en p1' is not an interface name"),
        ([{"netdev": "enP7s7", "address": "198.51.100.11/24"}], 9000,
         E0 + ".netdev enP7s7 is the management interface (it carries "
         "ansible_host 192.0.2.11); host_prep never touches it"),
        ([{"netdev": "enp1s0f1np1", "address": "192.0.2.50/24"}], 9000,
         E0 + ".address 192.0.2.50/24: its subnet 192.0.2.0/24 contains "
         "the management address ansible_host 192.0.2.11; give the fast link a subnet of its own"),
        ([{"netdev": "auto", "address": "198.51.100.11/24"}], 9000,
         E0 + ".netdev is auto but no interface on spark-1 carries "
         "spark_fast_ip (198.51.100.11) yet: name the netdev (ibdev2netdev lists them)"),
        ([{"netdev": "enp1s0f1np1", "roce": "roce p1", "address": "198.51.100.11/24"}], 9000,
         E0 + ".roce 'roce p1' is not a RoCE device name (e.g. rocep1s0f1)"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.11/24", "mtu": 9000}], 9000,
         E0 + " has unknown keys ['mtu']; use netdev, roce, address"),
        (TWINS_1, 12000,
         "spark-1: host_prep_mtu (12000) is out of range: the fast link's MTU must be between 1280 "
         "and 9978 (9000 on a Spark pair)"),
        (TWINS_1, 576, "spark-1: host_prep_mtu (576) is out of range"),
        (TWINS_1, "jumbo", "spark-1: host_prep_mtu ('jumbo') must be an integer"),
        ([], 9000, "spark-1: host_prep_cx7_links must be a non-empty list of links"),
        ("enp1s0f1np1", 9000, "spark-1: host_prep_cx7_links must be a non-empty list of links"),
        (["enp1s0f1np1"], 9000,
         E0 + " must be a dict with netdev and address, got 'enp1s0f1np1'"),
    ],
)  # fmt: skip
def test_bad_input_names_the_variable_and_the_node(links, mtu, message):
    errors = resolve(links, mtu=mtu)["errors"]
    assert any(e.startswith(message) for e in errors), errors


@pytest.mark.parametrize(
    ("second", "what"),
    [
        ({"netdev": "enP2p1s0f1np1", "address": "198.51.100.21/24"}, "subnet 198.51.100.0/24; "
         "each twin needs a subnet of its own"),
        ({"netdev": "enp1s0f1np1", "address": "198.51.101.11/24"}, "netdev enp1s0f1np1"),
        ({"netdev": "enP2p1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.101.11/24"},
         "roce rocep1s0f1"),
    ],
)  # fmt: skip
def test_duplicates_on_one_node(second, what):
    errors = resolve([TWINS_1[0], second])["errors"]
    assert errors == [
        f"spark-1: host_prep_cx7_links[0] and host_prep_cx7_links[1] have the same {what}"
    ]


def test_duplicate_address_on_one_node():
    errors = resolve([TWINS_1[0], {**TWINS_1[1], "address": "198.51.100.11/16"}])["errors"]
    assert "have the same address 198.51.100.11" in errors[0]


def test_spark_fast_ip_must_be_on_a_twin():
    errors = resolve(TWINS_1, fast_ip="198.51.100.99")["errors"]
    assert errors == [
        "spark-1: spark_fast_ip (198.51.100.99) is not the address of any entry in "
        "host_prep_cx7_links; peers reach the node at spark_fast_ip, so one twin must carry it"
    ]


def test_auto_entry_must_carry_spark_fast_ip():
    got = resolve([TWINS_1[0], {"netdev": "auto", "address": "198.51.101.11/24"}])
    assert "netdev is auto, which finds the interface carrying spark_fast_ip" in got["errors"][0]


def test_management_by_default_route_when_ansible_host_is_a_name():
    f = {**SPARK, "default_ipv4": {"interface": "enP7s7"}}
    links = [{"netdev": "enP7s7", "address": "198.51.100.11/24"}]
    errors = resolve(links, f, mgmt="spark-1.lan")["errors"]
    assert "is the management interface" in errors[0]


def test_roce_auto_means_unknown():
    got = resolve([{**TWINS_1[0], "roce": "auto"}])
    assert got["links"][0]["roce"] == ""


# --------------------------------------------------------------------------- across nodes


def nodes(**links) -> dict[str, list[dict]]:
    out = {}
    for name, (lst, fast) in links.items():
        node_facts = facts(
            enp1s0f1np1=(None, 9000), enP2p1s0f1np1=(None, 9000), enP7s7=("192.0.2.1", 1500)
        )
        got = fl.resolve_links(lst, name.replace("_", "-"), node_facts, fast, "192.0.2.1")
        assert got["errors"] == []
        out[name.replace("_", "-")] = got["links"]
    return out


def test_cross_check_pair_passes():
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(TWINS_2, "198.51.100.12"))
    assert fl.cross_check(pair) == []


def test_cross_check_duplicate_address():
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(TWINS_1, "198.51.100.11"))
    assert fl.cross_check(pair) == [
        "spark-2: host_prep_cx7_links[0].address 198.51.100.11 is already used by spark-1 "
        "(host_prep_cx7_links[0])",
        "spark-2: host_prep_cx7_links[1].address 198.51.101.11 is already used by spark-1 "
        "(host_prep_cx7_links[1])",
    ]


def test_cross_check_twin_outside_its_subnet():
    other = [TWINS_2[0], {**TWINS_2[1], "address": "198.51.102.12/24"}]
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(other, "198.51.100.12"))
    assert fl.cross_check(pair) == [
        "spark-2: host_prep_cx7_links[1].address 198.51.102.12/24 is outside its twin's subnet "
        "198.51.101.0/24 (spark-1's host_prep_cx7_links[1])"
    ]


def test_cross_check_twins_swapped():
    pair = nodes(
        spark_1=(TWINS_1, "198.51.100.11"),
        spark_2=(list(reversed(TWINS_2)), "198.51.100.12"),
    )
    errors = fl.cross_check(pair)
    assert len(errors) == 2 and all("is outside its twin's subnet" in e for e in errors)


def test_cross_check_twin_count():
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(TWINS_2[:1], "198.51.100.12"))
    assert fl.cross_check(pair) == [
        "host_prep_cx7_links must list the same number of twins on every node "
        "(spark-1: 2, spark-2: 1)"
    ]


def test_cross_check_of_nothing():
    assert fl.cross_check({}) == []


# --------------------------------------------------------------------------- derived data


def test_comm_env_for_the_twins():
    links = resolve(TWINS_1)["links"]
    assert fl.comm_env(links, "198.51.100.11") == {
        "VLLM_HOST_IP": "198.51.100.11",
        "RAY_NODE_IP_ADDRESS": "198.51.100.11",
        "RAY_OVERRIDE_NODE_IP_ADDRESS": "198.51.100.11",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_DISABLE": "0",
    }


def test_comm_env_follows_spark_fast_ip_to_the_second_twin():
    f = facts(enp1s0f1np1=(None, 9000), enP2p1s0f1np1=(None, 9000))
    links = fl.resolve_links(TWINS_1, "spark-1", f, "198.51.101.11")["links"]
    env = fl.comm_env(links, "198.51.101.11")
    assert env["VLLM_HOST_IP"] == "198.51.101.11"
    assert env["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1"
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"


def test_comm_env_without_roce_disables_ib():
    links = resolve([{"netdev": "auto", "address": "172.30.241.11/24"}], SIM, "172.30.241.11",
                    "172.30.240.11")["links"]  # fmt: skip
    env = fl.comm_env(links, "172.30.241.11")
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env
    # The GB10's own NCCL settings stand without RoCE too (nothing reads them on CPU and Gloo).
    assert (env["NCCL_IGNORE_CPU_AFFINITY"], env["NCCL_NVLS_ENABLE"]) == ("1", "0")


def test_comm_env_extra_wins_and_is_checked():
    links = resolve(TWINS_1)["links"]
    env = fl.comm_env(links, "198.51.100.11", {"NCCL_IB_GID_INDEX": 3, "NCCL_NVLS_ENABLE": 1})
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_NVLS_ENABLE"] == "1"
    with pytest.raises(ValueError, match="'BAD-KEY' is not an environment name"):
        fl.comm_env(links, "198.51.100.11", {"BAD-KEY": "1"})
    with pytest.raises(ValueError, match="NCCL_DEBUG holds a line break"):
        fl.comm_env(links, "198.51.100.11", {"NCCL_DEBUG": "INFO\nX=1"})
    with pytest.raises(ValueError, match="is not on any of the links"):
        fl.comm_env(links, "10.9.9.9")


def test_host_entries_and_known_host_names():
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(TWINS_2, "198.51.100.12"))
    data = {
        "spark-1": {"links": pair["spark-1"], "fast_ip": "198.51.100.11"},
        "spark-2": {"links": pair["spark-2"], "fast_ip": "198.51.100.12"},
    }
    assert fl.host_entries(data) == [
        {"node": "spark-1", "ip": "198.51.100.11", "names": ["spark-1-fast", "spark-1-fast-1"]},
        {"node": "spark-1", "ip": "198.51.101.11", "names": ["spark-1-fast-2"]},
        {"node": "spark-2", "ip": "198.51.100.12", "names": ["spark-2-fast", "spark-2-fast-1"]},
        {"node": "spark-2", "ip": "198.51.101.12", "names": ["spark-2-fast-2"]},
    ]
    assert fl.known_host_names(data)["spark-2"] == [
        "spark-2",
        "spark-2-fast",
        "spark-2-fast-1",
        "198.51.100.12",
        "spark-2-fast-2",
        "198.51.101.12",
    ]


def test_peer_targets_pair_twins():
    pair = nodes(spark_1=(TWINS_1, "198.51.100.11"), spark_2=(TWINS_2, "198.51.100.12"))
    assert fl.peer_targets(pair, "spark-1") == [
        {"peer": "spark-2", "twin": 0, "netdev": "enp1s0f1np1", "roce": "rocep1s0f1",
         "ip": "198.51.100.12", "peer_roce": "rocep1s0f1"},
        {"peer": "spark-2", "twin": 1, "netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1",
         "ip": "198.51.101.12", "peer_roce": "roceP2p1s0f1"},
    ]  # fmt: skip


def test_attach_roce_from_ibdev2netdev():
    links = resolve([{k: v for k, v in t.items() if k != "roce"} for t in TWINS_1])["links"]
    ibdev = [
        {"roce": "rocep1s0f1", "port": 1, "netdev": "enp1s0f1np1", "state": "Up"},
        {"roce": "roceP2p1s0f1", "port": 1, "netdev": "enP2p1s0f1np1", "state": "Up"},
    ]
    got = fl.attach_roce(links, ibdev, "spark-1")
    assert got["errors"] == []
    assert [link["roce"] for link in got["links"]] == ["rocep1s0f1", "roceP2p1s0f1"]
    wrong = fl.attach_roce(
        resolve([{**TWINS_1[0], "roce": "roceP2p1s0f1"}])["links"], ibdev, "spark-1"
    )
    assert wrong["errors"] == [
        "spark-1: host_prep_cx7_links[0].roce is roceP2p1s0f1 but ibdev2netdev says rocep1s0f1 "
        "backs enp1s0f1np1"
    ]
    none = fl.attach_roce(links, ibdev[:1], "spark-1")
    assert none["errors"] == [
        "spark-1: host_prep_cx7_links[1].netdev enP2p1s0f1np1: no RoCE device backs it "
        "(ibdev2netdev)"
    ]
