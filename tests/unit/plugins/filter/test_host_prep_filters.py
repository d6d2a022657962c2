"""Tests for plugins/filter/host_prep.py: the thin layer between the role and module_utils."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import host_prep as hp
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"


def test_one_filter_holds_every_operation():
    assert set(hp.OPERATIONS) == {
        "cabled",
        "links",
        "nodes",
        "roce",
        "comm_env",
        "check",
        "serving",
        "platform",
        "link_plan",
        "leftovers",
        "gids",
    }
    assert set(hp.FilterModule().filters()) == {"host_prep"}
    assert (Path(hp.__file__).parent / "host_prep.yml").exists(), "host_prep has no documentation"


def _hostvars():
    def node(ip, fast):
        return {
            "spark_fast_ip": fast,
            "_host_prep_links": [
                {"index": 0, "netdev": "eth0", "roce": "", "address": f"{fast}/24", "ip": fast,
                 "prefix": 24, "network": "172.30.241.0/24"}
            ],
        }  # fmt: skip

    return {"spark-1": node("a", "172.30.241.11"), "spark-2": node("b", "172.30.241.12")}


def test_nodes_gives_errors_hosts_names_and_peers():
    got = hp.host_prep_nodes(["spark-1", "spark-2"], _hostvars(), "spark-2")
    assert got["errors"] == []
    assert [(e["ip"], e["names"]) for e in got["host_entries"]] == [
        ("172.30.241.11", ["spark-1-fast", "spark-1-fast-1"]),
        ("172.30.241.12", ["spark-2-fast", "spark-2-fast-1"]),
    ]
    assert got["names_by_node"]["spark-1"] == [
        "spark-1",
        "spark-1-fast",
        "spark-1-fast-1",
        "172.30.241.11",
    ]
    assert [(p["peer"], p["netdev"], p["ip"]) for p in got["peers"]] == [
        ("spark-1", "eth0", "172.30.241.11")
    ]
    assert got["port_warnings"] == []  # no cabled port known (the sim)


def test_nodes_warn_when_the_cables_sit_in_different_ports():
    hostvars = _hostvars()
    hostvars["spark-1"]["_host_prep_cabled"] = {"ports": [0]}
    hostvars["spark-2"]["_host_prep_cabled"] = {"ports": [1]}
    got = hp.host_prep_nodes(["spark-1", "spark-2"], hostvars)
    assert len(got["port_warnings"]) == 1
    assert "spark-1 QSFP port 0, spark-2 QSFP port 1" in got["port_warnings"][0]
    hostvars["spark-2"]["_host_prep_cabled"] = {"ports": [0]}
    assert hp.host_prep_nodes(["spark-1", "spark-2"], hostvars)["port_warnings"] == []


def test_check_dispatches_and_turns_unreadable_output_into_a_failure():
    ok = hp.host_prep_check(tool_output(FIXTURES / "ethtool_spark_200g_speed.txt"), "link", 200000)
    assert ok["passed"]
    bad = hp.host_prep_check("bash: ethtool: command not found", "link", 200000)
    assert bad == {
        "check": "link",
        "passed": False,
        "message": "cannot read the link output: not ethtool output: no 'Speed:' and no "
        "'Link detected:' line",
    }
    with pytest.raises(AnsibleFilterError, match="unknown check 'speed'"):
        hp.host_prep_check("", "speed")


def test_cabled_takes_the_registered_command_as_ansible_gives_it():
    links = [{"address": "198.51.100.11/24"}]
    text = tool_output(FIXTURES / "ibdev2netdev_port0.txt")
    got = hp.host_prep_cabled(links, text, "spark-1", "0", None)
    assert got["errors"] == []
    assert got["links"][0]["netdev"] == "enp1s0f0np0"
    failed = hp.host_prep_cabled(links, None, "spark-1", 255, "")
    assert failed["errors"][0].startswith("spark-1: ibdev2netdev failed (rc 255)")


@pytest.mark.parametrize(
    ("hca", "passed"),
    [("rocep1s0f1,roceP2p1s0f1", True), ("roce_eth0", False)],
)
def test_check_compares_nccls_devices_with_comm_env_as_the_role_calls_it(hca, passed):
    # verify_nccl_nccl_tests.yml: host_prep_check('all_gather_perf', min, reference, ib_hca=...)
    log = tool_output(FIXTURES / "all_gather_perf_spark_ib.txt")
    result = hp.host_prep_check(log, "all_gather_perf", 21.875, 25.0, ib_hca=hca)
    assert result["passed"] is passed
    if not passed:
        assert result["reasons"] == [
            "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env "
            "names roce_eth0"
        ]


def test_roce_with_unreadable_ibdev2netdev():
    got = hp.host_prep_roce([], "ibdev2netdev: command not found", "spark-1")
    assert got["errors"] == ["spark-1: not an ibdev2netdev line: 'ibdev2netdev: command not found'"]


def test_comm_env_error_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="is not on any of the links"):
        hp.host_prep_comm_env([], "172.30.241.11")


def test_link_plan_reads_every_node_from_hostvars():
    hostvars = {
        "spark-1": {"_host_prep_serving": [],
                    "_host_prep_link_stamp": {"valid": True, "reason": "skipped: link-check"}},
        "spark-2": {"_host_prep_serving": ["dgx-spark-vllm"],
                    "_host_prep_link_stamp": {"valid": False, "reason": "runs: no stamp"}},
    }  # fmt: skip
    plan = hp.host_prep_link_plan(["spark-1", "spark-2"], hostvars, "auto", True)
    assert plan["run"] is False
    assert plan["stale"] == {"spark-2": "runs: no stamp"}
    assert "dgx-spark-vllm on spark-2 holds the GPUs" in plan["reason"]
    with pytest.raises(AnsibleFilterError, match="host_prep_link_check"):
        hp.host_prep_link_plan(["spark-1"], hostvars, "sometimes", True)


def test_platform_filter_adds_the_warnings():
    got = hp.host_prep_platform("NVIDIA GB10, 580.173.02\n", 1, "spark-1", "7.0.0-1019-nvidia")
    assert got["passed"] is True
    assert len(got["warnings"]) == 1 and "ibv_reg_mr_iova2" in got["warnings"][0]


def test_leftovers_takes_the_find_result_and_the_facts_as_the_role_gives_them():
    # validate.yml: the registered find command, _host_prep_links, ansible_facts (a Spark's MAC
    # written here: the sim's capture has none), host_prep_netplan_file, the role's directories.
    profile = tool_output(FIXTURES / "nm_twin_by_mac_dhcp.txt")
    path = "/etc/NetworkManager/system-connections/Wired connection 2.nmconnection"
    listing = {
        "rc": 1,
        "stdout": f"0 600 {path}\n{base64.b64encode(profile.encode()).decode()}\n",
        "stderr": "find: '/run/netplan': No such file or directory",
        "changed": False,
    }
    links = [{"index": 0, "netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1",
              "address": "198.51.101.11/24", "ip": "198.51.101.11"}]  # fmt: skip
    facts = {"enP2p1s0f1np1": {"macaddress": "4c:bb:47:2a:10:03", "module": "mlx5_core"}}
    dirs = (["/run/netplan", "/etc/netplan", "/lib/netplan"],
            ["/etc/NetworkManager/system-connections"])  # fmt: skip
    got = hp.host_prep_leftovers(
        listing, links, facts, "/etc/netplan/40-cx7.yaml", *dirs, "spark-1"
    )
    assert [(f["file"], f["twin"]) for f in got["found"]] == [(path, "enP2p1s0f1np1")]
    assert got["errors"][0].startswith(f"spark-1: NetworkManager profile {path}")
    # Another MAC on the twin: the profile binds some other device.
    facts["enP2p1s0f1np1"]["macaddress"] = "4c:bb:47:2a:10:05"
    got = hp.host_prep_leftovers(
        listing, links, facts, "/etc/netplan/40-cx7.yaml", *dirs, "spark-1"
    )
    assert got["passed"] and got["read"] == [path]


def test_gids_reads_each_node_of_the_loop_with_its_comm_env():
    # netplan_apply.yml: the loop's results (item: the node read), and hostvars with each node's
    # resolved links, spark_fast_ip and the comm env extras validate.yml kept.
    def links(last: int) -> list[dict]:
        return [
            {"index": 0, "netdev": "enp1s0f1np1", "roce": "rocep1s0f1",
             "address": f"198.51.100.{last}/24", "ip": f"198.51.100.{last}"},
            {"index": 1, "netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1",
             "address": f"198.51.101.{last}/24", "ip": f"198.51.101.{last}"},
        ]  # fmt: skip

    hostvars = {
        "spark-1": {"_host_prep_links": links(11), "spark_fast_ip": "198.51.100.11",
                    "_host_prep_comm_env_extra": {}},
        "spark-2": {"_host_prep_links": links(12), "spark_fast_ip": "198.51.100.12",
                    "_host_prep_comm_env_extra": {}},
    }  # fmt: skip
    results = [
        {"item": "spark-1", "rc": 2, "stdout": tool_output(FIXTURES / "gids_spark1.txt")},
        {
            "item": "spark-2",
            "rc": 2,
            "stdout": tool_output(FIXTURES / "gids_spark2_ipv6_global.txt"),
        },
    ]
    got = hp.host_prep_gids(results, hostvars)
    assert got["passed"] is False and got["indices"] == {"spark-1": [3, 3], "spark-2": [5, 3]}
    # NCCL_IB_GID_INDEX from spark-2's extras: index 3 there holds the IPv6 address.
    hostvars["spark-2"]["_host_prep_comm_env_extra"] = {"NCCL_IB_GID_INDEX": "3"}
    got = hp.host_prep_gids(results, hostvars)
    assert got["indices"] == {"spark-1": [3, 3], "spark-2": [3, 3]}
    assert got["errors"][0].startswith("spark-2: NCCL would use GID index 3 of rocep1s0f1")
    assert "NCCL_IB_GID_INDEX in the comm env names that index" in got["errors"][0]
