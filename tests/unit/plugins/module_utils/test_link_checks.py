"""Tests for plugins/module_utils/link_checks.py over the tools' output (tests/unit/fixtures/
host_prep/, described in its README): each check passes and fails where it should."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_checks as lc

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"
TWINS = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.11/24"},
]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --------------------------------------------------------------------------- ethtool


@pytest.mark.parametrize(
    ("name", "passed", "speed", "netdev", "words"),
    [
        ("ethtool_200g_up.txt", True, 200000, "enp1s0f1np1", "link up at 200000Mb/s"),
        ("ethtool_100g.txt", False, 100000, "enp1s0f1np1", "link at 100000Mb/s, expected 200000"),
        ("ethtool_link_down.txt", False, None, "enP2p1s0f1np1", "link down"),
    ],
)
def test_ethtool_decision(name, passed, speed, netdev, words):
    result = lc.check_link(fixture(name))
    assert result["passed"] is passed
    assert result["speed_mbps"] == speed
    assert result["netdev"] == netdev
    assert words in result["message"] and netdev in result["message"]


def test_ethtool_parse_fields():
    parsed = lc.parse_ethtool(fixture("ethtool_link_down.txt"))
    assert parsed == {
        "netdev": "enP2p1s0f1np1",
        "speed_mbps": None,
        "link_detected": False,
        "duplex": "Unknown!",
    }


def test_ethtool_lower_expectation_passes_100g():
    assert lc.check_link(fixture("ethtool_100g.txt"), expected_mbps=100000)["passed"]


def test_ethtool_for_another_netdev_is_refused():
    with pytest.raises(lc.CheckOutputError, match="not enP2p1s0f1np1"):
        lc.check_link(fixture("ethtool_200g_up.txt"), netdev="enP2p1s0f1np1")


def test_not_ethtool_output():
    with pytest.raises(lc.CheckOutputError, match="not ethtool output"):
        lc.parse_ethtool("ethtool: command not found\n")


# --------------------------------------------------------------------------- ibdev2netdev


def test_ibdev2netdev_parse():
    entries = lc.parse_ibdev2netdev(fixture("ibdev2netdev_up.txt"))
    assert [(e["roce"], e["netdev"], e["state"]) for e in entries] == [
        ("rocep1s0f0", "enp1s0f0np0", "Down"),
        ("rocep1s0f1", "enp1s0f1np1", "Up"),
        ("roceP2p1s0f0", "enP2p1s0f0np0", "Down"),
        ("roceP2p1s0f1", "enP2p1s0f1np1", "Up"),
    ]
    assert lc.roce_for_netdevs(fixture("ibdev2netdev_up.txt"), ["enP2p1s0f1np1", "eth9"]) == {
        "enP2p1s0f1np1": "roceP2p1s0f1",
        "eth9": None,
    }


def test_roce_up_behind_both_twins():
    result = lc.check_roce(fixture("ibdev2netdev_up.txt"), TWINS)
    assert result["passed"], result["message"]
    assert "rocep1s0f1 ==> enp1s0f1np1" in result["message"]
    assert "roceP2p1s0f1 ==> enP2p1s0f1np1" in result["message"]


def test_roce_twin_down_fails():
    result = lc.check_roce(fixture("ibdev2netdev_twin_down.txt"), TWINS)
    assert not result["passed"]
    assert result["message"] == "roceP2p1s0f1 ==> enP2p1s0f1np1 is Down, not Up"


def test_roce_named_wrongly_fails():
    links = [{**TWINS[0], "roce": "roceP2p1s0f1"}]
    result = lc.check_roce(fixture("ibdev2netdev_up.txt"), links)
    assert not result["passed"]
    assert "backed by rocep1s0f1, but host_prep_cx7_links names roceP2p1s0f1" in result["message"]


def test_roce_missing_device_fails():
    result = lc.check_roce(fixture("ibdev2netdev_up.txt"), [{"netdev": "eth0", "roce": ""}])
    assert not result["passed"]
    assert "eth0: no RoCE device backs it" in result["message"]


def test_not_ibdev2netdev_output():
    with pytest.raises(lc.CheckOutputError, match="not an ibdev2netdev line"):
        lc.parse_ibdev2netdev("sh: 1: ibdev2netdev: not found\n")


# --------------------------------------------------------------------------- ib_write_bw


def test_ib_write_bw_parse():
    parsed = lc.parse_ib_write_bw(fixture("ib_write_bw_rocep1s0f1.txt"))
    assert parsed["device"] == "rocep1s0f1"
    assert parsed["rows"] == [
        {
            "bytes": 1048576,
            "iterations": 66612,
            "bw_peak_gbps": 0.0,
            "bw_average_gbps": 111.74,
            "msg_rate_mpps": 0.01332,
        }
    ]


@pytest.mark.parametrize(
    ("name", "passed", "bw"),
    [("ib_write_bw_rocep1s0f1.txt", True, 111.74), ("ib_write_bw_low.txt", False, 46.64)],
)
def test_ib_write_bw_decision(name, passed, bw):
    result = lc.check_ib_write_bw(fixture(name), min_gbps=90)
    assert result["passed"] is passed
    assert result["bw_average_gbps"] == bw
    assert "host_prep_rdma_min_gbps (90)" in result["message"]


def test_ib_write_bw_threshold_is_inclusive():
    assert lc.check_ib_write_bw(fixture("ib_write_bw_rocep1s0f1.txt"), 111.74)["passed"]
    assert not lc.check_ib_write_bw(fixture("ib_write_bw_rocep1s0f1.txt"), 111.75)["passed"]


def test_ib_write_bw_needs_report_gbits():
    with pytest.raises(lc.CheckOutputError, match="--report_gbits"):
        lc.parse_ib_write_bw(fixture("ib_write_bw_mbsec.txt"))


def test_ib_write_bw_without_result_row():
    head = fixture("ib_write_bw_rocep1s0f1.txt").split(" 1048576    66612")[0]
    with pytest.raises(lc.CheckOutputError, match="no result row"):
        lc.parse_ib_write_bw(head)


def test_ib_write_bw_connection_failure_is_not_output():
    text = " Couldn't connect to 198.51.100.12:18515\nUnable to open file descriptor for socket\n"
    with pytest.raises(lc.CheckOutputError, match="not ib_write_bw output"):
        lc.parse_ib_write_bw(text)


# --------------------------------------------------------------------------- NCCL_DEBUG


def test_transport_ib_both_twins():
    seen = lc.nccl_transport(fixture("nccl_debug_ib.txt"))
    assert seen["transport"] == "IB"
    assert seen["ib_devices"] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]
    assert seen["channels"] == {"NET/IB": 4}
    assert seen["networks"] == ["IB"]
    assert seen["gdr"] is False


def test_transport_socket_after_ib_found_no_device():
    seen = lc.nccl_transport(fixture("nccl_debug_socket.txt"))
    assert seen["transport"] == "Socket"
    assert seen["socket_ifaces"] == ["enp1s0f1np1"]
    assert seen["ib_devices"] == []


@pytest.mark.parametrize(
    ("log", "transport"),
    [
        ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA", "IB"),
        ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC/read", "P2P"),
        ("h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] via SHM/direct/direct", "SHM"),
        ("h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>", "Socket"),
        ("h:1:2 [0] NCCL INFO Using network Socket", "Socket"),
        ("h:1:2 [0] NCCL INFO cudaDriverVersion 13000", "unknown"),
        ("", "unknown"),
    ],
)
def test_transport_kinds(log, transport):
    assert lc.nccl_transport(log)["transport"] == transport


def test_one_socket_channel_among_ib_is_socket():
    log = fixture("nccl_debug_ib.txt") + (
        "spark-1:4187:4201 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    )
    assert lc.nccl_transport(log)["transport"] == "Socket"


def test_gdr_is_noted():
    log = "x NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n"
    assert lc.nccl_transport(log)["gdr"] is True


# --------------------------------------------------------------------------- all_gather_perf


def test_all_gather_perf_parse():
    parsed = lc.parse_all_gather_perf(fixture("all_gather_perf_ib.txt"))
    assert parsed["avg_busbw_gbps"] == 23.35
    assert parsed["wrong"] == 0
    assert parsed["rows"] == [
        {
            "size_bytes": 4294967296,
            "count": 536870912,
            "oop_time_us": 92930.0,
            "oop_algbw_gbps": 46.22,
            "oop_busbw_gbps": 23.11,
            "oop_wrong": 0.0,
            "ip_time_us": 91020.0,
            "ip_algbw_gbps": 47.19,
            "ip_busbw_gbps": 23.59,
            "ip_wrong": 0.0,
        }
    ]


def test_all_gather_perf_passes_over_ib():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_ib.txt"))
    assert result["passed"], result["message"]
    assert result["busbw_gbps"] == 23.35
    assert result["percent_of_reference"] == 93.4
    assert result["transport"] == "IB"
    assert result["message"] == (
        "all_gather busbw 23.35 GB/s = 93.4% of 25 GB/s over NET/IB "
        "(rocep1s0f1:1, roceP2p1s0f1:1): pass"
    )


def test_all_gather_perf_low_busbw_at_mtu_1500_fails():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_ib_mtu1500.txt"))
    assert not result["passed"]
    assert result["transport"] == "IB"
    assert result["reasons"] == ["busbw 19.60 GB/s is below host_prep_nccl_min_busbw_gbps (21.875)"]
    assert result["percent_of_reference"] == 78.4


def test_all_gather_perf_socket_fails_twice():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_socket.txt"))
    assert not result["passed"]
    assert result["transport"] == "Socket"
    assert len(result["reasons"]) == 2
    assert "NCCL used the socket transport (NET/Socket over enp1s0f1np1)" in result["reasons"][0]
    assert "busbw 3.00 GB/s is below" in result["reasons"][1]


def test_all_gather_perf_socket_fails_even_when_fast():
    text = fixture("all_gather_perf_socket.txt")
    result = lc.check_all_gather_perf(text, min_busbw_gbps=1.0)
    assert not result["passed"]
    assert result["reasons"] == [result["reasons"][0]]
    assert "socket transport" in result["message"]


def test_all_gather_perf_wrong_values_fail():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_wrong.txt"))
    assert not result["passed"]
    assert "12 wrong values (data corruption)" in result["reasons"]
    assert result["message"].count("FAIL") == 1


def test_all_gather_perf_without_debug_output_cannot_prove_ib():
    table = "\n".join(
        line for line in fixture("all_gather_perf_ib.txt").splitlines() if "NCCL INFO" not in line
    )
    result = lc.check_all_gather_perf(table)
    assert not result["passed"]
    assert "shows no NET/IB transport (saw unknown)" in result["reasons"][0]
    assert lc.check_all_gather_perf(table, require_ib=False)["passed"]


def test_all_gather_perf_threshold_is_inclusive():
    text = fixture("all_gather_perf_ib.txt")
    assert lc.check_all_gather_perf(text, min_busbw_gbps=23.35)["passed"]
    assert not lc.check_all_gather_perf(text, min_busbw_gbps=23.36)["passed"]


def test_all_gather_perf_without_avg_line_uses_the_rows():
    text = "\n".join(
        line for line in fixture("all_gather_perf_ib.txt").splitlines() if "Avg bus" not in line
    )
    result = lc.check_all_gather_perf(text)
    assert result["busbw_gbps"] == pytest.approx(23.35)


def test_not_nccl_tests_output():
    with pytest.raises(lc.CheckOutputError, match="not nccl-tests output"):
        lc.parse_all_gather_perf("mpirun: command not found\n")


# --------------------------------------------------------------------------- the script's JSON


@pytest.mark.parametrize(
    ("name", "passed", "transport", "percent"),
    [
        ("busbw_json_ib.txt", True, "IB", 93.6),
        ("busbw_json_low.txt", False, "IB", 79.2),
        ("busbw_json_socket.txt", False, "Socket", 11.9),
    ],
)
def test_busbw_json_decision(name, passed, transport, percent):
    result = lc.check_busbw_json(fixture(name))
    assert result["passed"] is passed
    assert result["transport"] == transport
    assert result["percent_of_reference"] == percent
    assert result["measurement"]["size_bytes"] == 4294967296


def test_busbw_json_captured_on_the_sim_is_gloo():
    text = fixture("busbw_json_sim_gloo.txt")
    data = lc.parse_busbw_json(text)
    assert data["backend"] == "gloo" and data["hosts"] == ["spark-1", "spark-2"]
    assert data["wrong"] == 0
    assert lc.check_busbw_json(text, min_busbw_gbps=0.01, require_ib=False)["passed"]
    assert not lc.check_busbw_json(text, min_busbw_gbps=0.01)["passed"]


def test_busbw_json_missing_or_broken():
    with pytest.raises(lc.CheckOutputError, match="no JSON line"):
        lc.parse_busbw_json("torch.distributed.DistBackendError: NCCL error\n")
    broken = json.dumps({"check": "nccl_all_gather", "busbw_gbps": None})
    with pytest.raises(lc.CheckOutputError, match="no numeric busbw_gbps"):
        lc.parse_busbw_json(broken)


def test_decide_nccl_at_the_threshold_and_reference():
    ib = {"transport": "IB", "ib_devices": ["rocep1s0f1:1"]}
    at = lc.decide_nccl(21.875, ib)
    assert at["passed"] and at["percent_of_reference"] == 87.5
    below = lc.decide_nccl(21.874, ib)
    assert not below["passed"]
    assert lc.decide_nccl(23.74, ib)["percent_of_reference"] == 95.0
    assert not lc.decide_nccl(None, ib)["passed"]


# --------------------------------------------------------------------------- ip -j addr


IP_JSON = json.dumps(
    [
        {"ifname": "lo", "mtu": 65536, "operstate": "UNKNOWN", "addr_info": []},
        {
            "ifname": "eth0",
            "mtu": 9000,
            "operstate": "UP",
            "addr_info": [{"family": "inet", "local": "172.30.241.11", "prefixlen": 24}],
        },
    ]
)
SIM_LINK = [{"netdev": "eth0", "address": "172.30.241.11/24"}]


def test_addresses_pass():
    result = lc.check_addresses(IP_JSON, SIM_LINK, 9000)
    assert result["passed"]
    assert result["message"] == "eth0 172.30.241.11/24 MTU 9000 UP"


@pytest.mark.parametrize(
    ("links", "mtu", "words"),
    [
        (SIM_LINK, 1500, "eth0: MTU 9000, expected 1500"),
        (
            [{"netdev": "eth0", "address": "172.30.241.99/24"}],
            9000,
            "172.30.241.99/24 not configured",
        ),
        ([{"netdev": "eth7", "address": "172.30.241.11/24"}], 9000, "eth7: no such interface"),
    ],
)
def test_addresses_fail(links, mtu, words):
    result = lc.check_addresses(IP_JSON, links, mtu)
    assert not result["passed"]
    assert words in result["message"]


def test_addresses_down():
    data = json.loads(IP_JSON)
    data[1]["operstate"] = "DOWN"
    result = lc.check_addresses(json.dumps(data), SIM_LINK, 9000)
    assert not result["passed"] and "eth0: DOWN" in result["message"]


# --------------------------------------------------------------------------- when to measure


def test_serving_containers_from_docker_host_info():
    containers = json.loads(fixture("docker_host_info_containers.json"))
    # Running and named dgx-spark-vllm, or running and labelled; not Ray, not a created one.
    assert lc.serving_containers(containers) == ["capture-serving-standin", "dgx-spark-vllm"]
    assert lc.serving_containers([]) == [] and lc.serving_containers(None) == []


SETTINGS = {
    "links": TWINS,
    "mtu": 9000,
    "rdma_min_gbps": 90.0,
    "nccl": {"check": "torch", "size_mib": 4096, "min_busbw_gbps": 21.875},
    "kernel": "6.11.0-1016-nvidia",
}


def nodes(record=True, serving=(), settings=None, **other):
    settings = SETTINGS if settings is None else settings
    made = lc.link_record(SETTINGS, "2026-11-30T06:00:00Z", ["RDMA write 111.74 Gb/s"])
    return {
        "spark-1": {"settings": settings, "record": made if record else None,
                    "serving": list(serving)},
        "spark-2": {"settings": SETTINGS, "record": made, "serving": []},
        **other,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "hardware", "state", "run", "words"),
    [
        ("auto", True, nodes(record=False), True, "spark-1: no passed link check recorded"),
        ("auto", True, nodes(), False, "unchanged since the passed link check of 2026-11-30"),
        ("auto", True, nodes(settings={**SETTINGS, "mtu": 1500}), True,
         "spark-1: changed since the last passed check: mtu"),
        ("auto", True, nodes(settings={**SETTINGS, "kernel": "6.14.0-1015-nvidia"}), True,
         "changed since the last passed check: kernel"),
        ("auto", True, nodes(record=False, serving=["dgx-spark-vllm"]), False,
         "but dgx-spark-vllm on spark-1 holds the GPUs"),
        ("auto", True, nodes(serving=["dgx-spark-vllm"]), False, "unchanged since"),
        ("always", True, nodes(), True, "host_prep_link_check=always"),
        ("always", True, nodes(serving=["dgx-spark-vllm"]), True,
         "while dgx-spark-vllm on spark-1 holds the GPUs (asked for)"),
        ("never", True, nodes(record=False), False, "host_prep_link_check=never"),
        ("auto", False, nodes(record=False), False, "hardware-only"),
    ],
)  # fmt: skip
def test_plan_link_check(mode, hardware, state, run, words):
    plan = lc.plan_link_check(mode, hardware, state)
    assert plan["run"] is run
    assert words in plan["reason"], plan["reason"]


def test_plan_link_check_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="allowed: auto, always, never"):
        lc.plan_link_check("sometimes", True, nodes())


def test_link_record_round_trip():
    record = lc.link_record(SETTINGS, "2026-11-30T06:00:00Z")
    assert lc.read_link_record(json.dumps(record)) == record
    assert record["fingerprint"] == lc.settings_fingerprint(json.loads(json.dumps(SETTINGS)))
    for text in ("", None, "{", "[]", '{"format": 2, "settings": {}}', '{"format": 1}'):
        assert lc.read_link_record(text) is None


# --------------------------------------------------------------------------- gathered facts

FACTS = json.loads(fixture("setup_network_sim.json"))
FAST = [{"netdev": "eth0", "address": "172.30.241.11/24"}]


def test_address_facts_pass():
    result = lc.check_address_facts(FACTS, FAST, 9000)
    assert result["passed"] is True
    assert result["message"] == "eth0 172.30.241.11/24 MTU 9000 UP"


@pytest.mark.parametrize(
    ("links", "mtu", "words"),
    [
        (FAST, 1500, "eth0: MTU 9000, expected 1500"),
        ([{"netdev": "eth0", "address": "172.30.241.99/24"}], 9000,
         "eth0: 172.30.241.99/24 not configured (has ['172.30.241.11/24'])"),
        ([{"netdev": "enp1s0f1np1", "address": "198.51.100.11/24"}], 9000,
         "enp1s0f1np1: no such interface"),
        ([{"netdev": "docker0", "address": "172.17.0.1/16"}], 1500, "docker0: DOWN"),
    ],
)  # fmt: skip
def test_address_facts_fail(links, mtu, words):
    result = lc.check_address_facts(FACTS, links, mtu)
    assert result["passed"] is False and words in result["message"]


def test_address_facts_need_gathered_facts():
    with pytest.raises(lc.CheckOutputError, match="gathered network facts"):
        lc.check_address_facts({}, FAST, 9000)
