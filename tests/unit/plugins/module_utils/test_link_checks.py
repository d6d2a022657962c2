"""Tests for plugins/module_utils/link_checks.py over the tools' output (tests/unit/fixtures/
host_prep/, described in its README): each check passes and fails where it should.

Every fixture is captured from the real tool, derived from such a capture or reconstructed from
a public one, or, where neither shows the case (a RoCE GID table), constructed; its ``#|`` header
says which, where and when (tests/unit/test_fixture_provenance.py).
A case no capture shows is made in the test from a real capture, and says what it changed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_checks as lc
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"
TWINS = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "address": "198.51.101.11/24"},
]
# comm.env's NCCL_IB_HCA for the twins of port 1 (fast_link.comm_env joins the twins' devices).
SPARK_HCA = "rocep1s0f1,roceP2p1s0f1"


def fixture(name: str) -> str:
    return tool_output(FIXTURES / name)


# --------------------------------------------------------------------------- provenance


# Every fixture's header (captured, derived, reconstructed or constructed) is checked for every
# fixture folder by tests/unit/test_fixture_provenance.py, and each is named in its folder's
# README.


def test_the_fixtures_readme_lists_no_file_that_is_gone():
    named = re.findall(r"`([\w.-]+\.(?:txt|json))`", (FIXTURES / "README.md").read_text())
    assert named
    assert [name for name in named if not (FIXTURES / name).exists()] == []


# --------------------------------------------------------------------------- ethtool


def test_ethtool_on_a_spark_twin_at_200g_passes():
    result = lc.check_link(fixture("ethtool_spark_200g_speed.txt"), netdev="enp1s0f1np1")
    assert result["passed"], result["message"]
    assert result["message"] == "enp1s0f1np1: link up at 200000Mb/s"


def test_ethtool_on_a_spark_twin_at_100g_fails():
    text = fixture("ethtool_spark_100g_speed.txt")
    result = lc.check_link(text, netdev="enp1s0f1np1")
    assert not result["passed"] and result["speed_mbps"] == 100000
    assert result["message"] == (
        "enp1s0f1np1: link at 100000Mb/s, expected 200000Mb/s "
        "(a ConnectX-7 twin on a QSFP cable to the peer)"
    )
    assert lc.check_link(text, expected_mbps=100000, netdev="enp1s0f1np1")["passed"]


def test_ethtool_link_down_fails():
    parsed = lc.parse_ethtool(fixture("ethtool_sfp_link_down.txt"))
    assert parsed == {
        "netdev": "lan12",
        "speed_mbps": None,
        "link_detected": False,
        "duplex": "Unknown!",
    }
    result = lc.check_link(fixture("ethtool_sfp_link_down.txt"))
    assert not result["passed"]
    assert (
        result["message"] == "lan12: link down (Link detected: no, speed unknown); check the cable"
    )


def test_ethtool_carrier_without_a_speed_fails():
    parsed = lc.parse_ethtool(fixture("ethtool_h200x2_eth0.txt"))
    assert parsed == {
        "netdev": "eth0",
        "speed_mbps": None,
        "link_detected": True,
        "duplex": "Unknown!",
    }
    result = lc.check_link(fixture("ethtool_h200x2_eth0.txt"))
    assert not result["passed"]
    assert result["message"].startswith("eth0: link at speed unknown, expected 200000Mb/s")


def test_ethtool_for_another_netdev_is_refused():
    with pytest.raises(lc.CheckOutputError, match="not enP2p1s0f1np1"):
        lc.check_link(fixture("ethtool_h200x2_eth0.txt"), netdev="enP2p1s0f1np1")


@pytest.mark.parametrize(
    "text",
    ["ethtool: command not found\n", "No data available\n"],
    ids=["missing", "ifb0"],
)
def test_not_ethtool_output(text):
    if text.startswith("No data"):
        assert fixture("ethtool_h200x2_ifb0.txt") == text  # what ethtool printed there
    with pytest.raises(lc.CheckOutputError, match="not ethtool output"):
        lc.parse_ethtool(text)


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


def test_ib_write_bw_parse_the_form_host_prep_runs():
    parsed = lc.parse_ib_write_bw(fixture("ib_write_bw_spark_roceP2p1s0f1.txt"))
    assert parsed == {
        "device": "roceP2p1s0f1",
        "rows": [
            {
                "bytes": 1048576,
                "iterations": 71244,
                "bw_peak_gbps": 0.0,
                "bw_average_gbps": 99.61,
                "msg_rate_mpps": 0.011874,
            }
        ],
        "bw_average_gbps": 99.61,
    }


@pytest.mark.parametrize(
    ("name", "device", "bw"),
    [("ib_write_bw_spark_rocep1s0f1.txt", "rocep1s0f1", 111.71),
     ("ib_write_bw_spark_roceP2p1s0f1.txt", "roceP2p1s0f1", 99.61)],
)  # fmt: skip
def test_ib_write_bw_decision_at_the_threshold(name, device, bw):
    passed = lc.check_ib_write_bw(fixture(name), min_gbps=bw)
    assert passed["passed"] and passed["bw_average_gbps"] == bw
    assert passed["message"] == (
        f"{device}: RDMA write {bw:.2f} Gb/s, at least host_prep_rdma_min_gbps ({bw:g})"
    )
    low = lc.check_ib_write_bw(fixture(name), min_gbps=bw + 0.01)
    assert not low["passed"]
    assert low["message"] == (
        f"{device}: RDMA write {bw:.2f} Gb/s, below host_prep_rdma_min_gbps ({bw + 0.01:g})"
    )
    assert lc.check_ib_write_bw(fixture(name))["passed"]  # the default 90 Gb/s


def test_ib_write_bw_needs_report_gbits():
    # perftest prints the same table in MB/sec without --report_gbits; no public capture of
    # that run on a Spark was found, so the unit is swapped in a real capture.
    text = fixture("ib_write_bw_spark_roceP2p1s0f1.txt").replace("[Gb/sec]", "[MB/sec]")
    with pytest.raises(lc.CheckOutputError, match="--report_gbits"):
        lc.parse_ib_write_bw(text)


def test_ib_write_bw_without_result_row():
    head = fixture("ib_write_bw_spark_rocep1s0f1.txt").split(" 65536      20000")[0]
    with pytest.raises(lc.CheckOutputError, match="no result row"):
        lc.parse_ib_write_bw(head)


def test_ib_write_bw_memlock_refusal_is_named_as_such():
    text = fixture("ib_read_bw_memlock_64k.txt")
    refusal = lc.ib_write_bw_refusal(text, memlock_lifted=False)
    assert refusal["kind"] == "memlock"
    assert refusal["message"].startswith(
        "ib_write_bw: a memlock refusal: ib_write_bw could not register its buffers "
        "(Couldn't allocate MR; ENOMEM)"
    )
    assert "ulimit -l" in refusal["message"] and "CAP_IPC_LOCK" in refusal["message"]
    assert "kernel itself" not in refusal["message"]
    result = lc.check_ib_write_bw(text)
    assert not result["passed"] and result["refusal"] == "memlock"
    assert result["message"].startswith("ib_write_bw: a memlock refusal")
    # host_prep lifts the limit: an ENOMEM then points at the kernel's own memory.
    assert "the kernel itself refused the memory" in result["message"]


def test_ib_write_bw_memlock_refusal_with_the_errno_of_perftest_23_04_and_later():
    # perftest from 23.04 adds the errno to the first line; the real capture with that line
    # changed as perftest's src/perftest_resources.c prints it, the device line of a Spark run
    # before it.
    device = fixture("ib_write_bw_spark_rocep1s0f1.txt").split(" Number of qps")[0]
    text = device + fixture("ib_read_bw_memlock_64k.txt").replace(
        "Couldn't allocate MR\n", "Couldn't allocate MR with error=12\n"
    )
    result = lc.check_ib_write_bw(text, memlock_lifted=False)
    assert not result["passed"] and result["refusal"] == "memlock"
    assert result["message"].startswith(
        "rocep1s0f1: a memlock refusal: ib_write_bw could not register its buffers "
        "(Couldn't allocate MR with error=12; ENOMEM)"
    )
    other = lc.ib_write_bw_refusal(text.replace("error=12", "error=22"))
    assert other["kind"] == "registration" and "not the memlock limit" in other["message"]


def test_ib_write_bw_other_failures_name_perftest_lines():
    text = " Couldn't connect to 198.51.100.12:18515\n Unable to init the socket connection\n"
    refusal = lc.ib_write_bw_refusal(text)
    assert refusal == {
        "kind": "error",
        "message": "ib_write_bw: ib_write_bw failed: Couldn't connect to 198.51.100.12:18515; "
        "Unable to init the socket connection",
    }
    result = lc.check_ib_write_bw(text)
    assert not result["passed"] and result["refusal"] == "error"
    assert lc.ib_write_bw_refusal(fixture("ib_write_bw_spark_rocep1s0f1.txt")) is None


def test_ib_write_bw_connection_failure_is_not_output():
    text = " Couldn't connect to 198.51.100.12:18515\nUnable to open file descriptor for socket\n"
    with pytest.raises(lc.CheckOutputError, match="not ib_write_bw output"):
        lc.parse_ib_write_bw(text)


# --------------------------------------------------------------------------- NCCL_DEBUG


def test_transport_ib_on_both_twins_of_two_sparks():
    seen = lc.nccl_transport(fixture("all_gather_perf_spark_ib.txt"))
    assert seen == {
        "transport": "IB",
        "ib_devices": ["rocep1s0f1:1", "roceP2p1s0f1:1"],
        "channel_devices": ["rocep1s0f1", "roceP2p1s0f1"],
        "socket_ifaces": [],
        "networks": ["IB"],
        "channels": {"NET/IB": 64},
        "gdr": False,
    }


def test_transport_ib_through_the_hpcx_plugin():
    # vLLM's NGC image loads HPC-X's RDMA plugin: its network is "IBext_v10", its channels
    # run "via NET/IBext_v10/<device>", and only "Made virtual device" lines name the devices.
    seen = lc.nccl_transport(fixture("nccl_debug_spark_ibext.txt"))
    assert seen["transport"] == "IB"
    assert seen["ib_devices"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert seen["channel_devices"] == ["roceP2p1s0f1", "rocep1s0f1"]
    assert seen["channels"] == {"NET/IB": 2}
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == ""


def test_transport_socket_after_ib_found_no_device():
    seen = lc.nccl_transport(fixture("all_gather_perf_h200x2_socket.txt"))
    assert seen == {
        "transport": "Socket",
        "ib_devices": [],
        "channel_devices": [],
        "socket_ifaces": ["eth0"],
        "networks": ["Socket"],
        "channels": {"NET/Socket": 8},
        "gdr": False,
    }


def test_transport_inside_one_host_is_p2p_not_the_idle_socket_network():
    seen = lc.nccl_transport(fixture("all_gather_perf_h200x2_p2p.txt"))
    assert seen["transport"] == "P2P"
    assert seen["channels"] == {"P2P": 48}
    assert seen["networks"] == ["Socket"]


@pytest.mark.parametrize(
    ("log", "transport"),
    [
        ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA", "IB"),
        ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC/read", "P2P"),
        ("h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] via SHM/direct/direct", "SHM"),
        ("h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>", "Socket"),
        ("h:1:2 [0] NCCL INFO Using network Socket", "Socket"),
        ("h:1:2 [0] NCCL INFO Using network IBext_v8", "IB"),
        ("h:1:2 [0] NCCL INFO cudaDriverVersion 13000", "unknown"),
        ("", "unknown"),
    ],
)
def test_transport_kinds(log, transport):
    assert lc.nccl_transport(log)["transport"] == transport


def test_one_socket_channel_among_ib_is_socket():
    log = fixture("all_gather_perf_spark_ib.txt") + (
        "spark-fb97:23491:23491 [0] NCCL INFO Channel 16/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    )
    assert lc.nccl_transport(log)["transport"] == "Socket"


def test_gdr_is_noted():
    log = "x NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n"
    assert lc.nccl_transport(log)["gdr"] is True
    assert lc.nccl_transport(fixture("all_gather_perf_spark_ib.txt"))["gdr"] is False


# --------------------------------------------------------------------------- the configured twins


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (SPARK_HCA, ["rocep1s0f1", "roceP2p1s0f1"]),
        ("=rocep1s0f1:1,roceP2p1s0f1:1", ["rocep1s0f1", "roceP2p1s0f1"]),
        ("roce_eth0", ["roce_eth0"]),
        ("^rocep1s0f0", []),
        ("", []),
        (None, []),
    ],
)
def test_configured_hcas(value, names):
    assert lc.configured_hcas(value) == names


def test_devices_match_the_configured_twins():
    seen = lc.nccl_transport(fixture("all_gather_perf_spark_ib.txt"))
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == ""
    assert lc.nccl_device_mismatch(seen, "=rocep1s0f1:1,roceP2p1s0f1:1") == ""


@pytest.mark.parametrize(
    ("hca", "message"),
    [
        ("roce_eth0", "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env "
                      "names roce_eth0"),
        ("rocep1s0f1", "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env "
                       "names rocep1s0f1"),
        ("rocep1s0f0,roceP2p1s0f0", "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but "
                                    "NCCL_IB_HCA in comm.env names rocep1s0f0, roceP2p1s0f0"),
        ("", "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env names "
             "no device (unset)"),
    ],
)  # fmt: skip
def test_devices_other_than_the_configured_twins_fail_naming_both(hca, message):
    seen = lc.nccl_transport(fixture("all_gather_perf_spark_ib.txt"))
    assert lc.nccl_device_mismatch(seen, hca) == message


def test_a_twin_that_carried_no_channel_fails():
    # Both twins opened, but (as if) every channel ran on the first: the log of a real run with
    # its /1 channels moved to /0.
    log = fixture("all_gather_perf_spark_ib.txt").replace("via NET/IB/1", "via NET/IB/0")
    seen = lc.nccl_transport(log)
    assert seen["channel_devices"] == ["rocep1s0f1"]
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == (
        "NCCL used NET/IB on rocep1s0f1, but NCCL_IB_HCA in comm.env names rocep1s0f1, roceP2p1s0f1"
    )


def test_the_cable_on_the_other_port_fails_naming_both():
    # The published run after the cable moved to port 0: NCCL (no NCCL_IB_HCA) took port 0's
    # twins, while a comm.env written for port 1 names the f1 twins.
    seen = lc.nccl_transport(fixture("all_gather_perf_spark_port0.txt"))
    assert seen["channel_devices"] == ["rocep1s0f0", "roceP2p1s0f0"]
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == (
        "NCCL used NET/IB on rocep1s0f0, roceP2p1s0f0, but NCCL_IB_HCA in comm.env names "
        "rocep1s0f1, roceP2p1s0f1"
    )
    assert lc.nccl_device_mismatch(seen, "rocep1s0f0,roceP2p1s0f0") == ""


def test_socket_fallback_fails_naming_both():
    seen = lc.nccl_transport(fixture("all_gather_perf_h200x2_socket.txt"))
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == (
        "NCCL used NET/Socket over eth0, but NCCL_IB_HCA in comm.env names rocep1s0f1, "
        "roceP2p1s0f1 over NET/IB: check NCCL_IB_DISABLE and /dev/infiniband in the container"
    )


def test_no_net_transport_fails_naming_the_twins():
    seen = lc.nccl_transport(fixture("all_gather_perf_h200x2_p2p.txt"))
    assert lc.nccl_device_mismatch(seen, SPARK_HCA) == (
        "NCCL_DEBUG=INFO output shows no NET/IB transport (saw P2P), but NCCL_IB_HCA in "
        "comm.env names rocep1s0f1, roceP2p1s0f1: the run cannot prove RDMA"
    )


# --------------------------------------------------------------------------- all_gather_perf


def test_all_gather_perf_parse_as_nccl_tests_prints_it():
    # nccl-tests 2.18/2.19 print a time in 7 characters (%.2f, else %.1f, else %.0f) and the
    # average busbw with %g: 24414.9, 190308, 21.9636.
    parsed = lc.parse_all_gather_perf(fixture("all_gather_perf_spark_ib.txt"))
    assert parsed == {
        "rows": [
            {
                "size_bytes": 1073741824,
                "count": 134217728,
                "oop_time_us": 24414.9,
                "oop_algbw_gbps": 43.98,
                "oop_busbw_gbps": 21.99,
                "oop_wrong": 0.0,
                "ip_time_us": 24472.5,
                "ip_algbw_gbps": 43.88,
                "ip_busbw_gbps": 21.94,
                "ip_wrong": 0.0,
            }
        ],
        "avg_busbw_gbps": 21.9636,
        "wrong": 0,
        "failure": None,
    }
    slow = lc.parse_all_gather_perf(fixture("all_gather_perf_spark_port0.txt"))
    assert [r["oop_time_us"] for r in slow["rows"]] == [190308.0, 379952.0, 758966.0]
    assert slow["avg_busbw_gbps"] == 2.83174
    h200 = lc.parse_all_gather_perf(fixture("all_gather_perf_h200x2_p2p.txt"))
    assert [r["oop_time_us"] for r in h200["rows"]] == [17.14, 27.57, 55.51, 158.76, 548.99]
    assert h200["avg_busbw_gbps"] == 146.222


def test_all_gather_perf_passes_over_ib_on_the_twins():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_spark_ib.txt"), ib_hca=SPARK_HCA)
    assert result["passed"], result["message"]
    assert result["busbw_gbps"] == 21.9636
    assert result["percent_of_reference"] == 87.9
    assert result["transport"] == "IB"
    assert result["message"] == (
        "all_gather busbw 21.96 GB/s = 87.9% of 25 GB/s over NET/IB "
        "(rocep1s0f1, roceP2p1s0f1): pass"
    )


def test_all_gather_perf_on_other_devices_fails_naming_both():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_spark_ib.txt"), ib_hca="roce_eth0")
    assert not result["passed"]
    assert result["reasons"] == [
        "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env names roce_eth0"
    ]
    assert result["message"] == (
        "all_gather busbw 21.96 GB/s = 87.9% of 25 GB/s over NET/IB (rocep1s0f1, roceP2p1s0f1): "
        "FAIL: NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env names "
        "roce_eth0"
    )


def test_all_gather_perf_slow_on_the_wrong_port_fails_twice():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_spark_port0.txt"), ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert result["reasons"] == [
        "NCCL used NET/IB on rocep1s0f0, roceP2p1s0f0, but NCCL_IB_HCA in comm.env names "
        "rocep1s0f1, roceP2p1s0f1",
        "busbw 2.83 GB/s is below host_prep_nccl_busbw_floor_gbps (6), which only a broken data "
        "path measures (a socket fallback or the wrong devices give about 3)",
    ]
    assert result["percent_of_reference"] == 11.3


def test_all_gather_perf_socket_fails_twice():
    result = lc.check_all_gather_perf(
        fixture("all_gather_perf_h200x2_socket.txt"), ib_hca=SPARK_HCA
    )
    assert not result["passed"]
    assert result["transport"] == "Socket"
    assert result["reasons"] == [
        "NCCL used NET/Socket over eth0, but NCCL_IB_HCA in comm.env names rocep1s0f1, "
        "roceP2p1s0f1 over NET/IB: check NCCL_IB_DISABLE and /dev/infiniband in the container",
        "busbw 2.86 GB/s is below host_prep_nccl_busbw_floor_gbps (6), which only a broken data "
        "path measures (a socket fallback or the wrong devices give about 3)",
    ]


def test_all_gather_perf_socket_fails_even_when_fast():
    text = fixture("all_gather_perf_h200x2_socket.txt")
    result = lc.check_all_gather_perf(text, floor_gbps=1.0, ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert len(result["reasons"]) == 1 and "NET/Socket over eth0" in result["reasons"][0]
    # Without the twins to compare (an older caller) the transport alone still fails it.
    legacy = lc.check_all_gather_perf(text, floor_gbps=1.0)
    assert legacy["reasons"] == [
        "NCCL used the socket transport (NET/Socket over eth0) instead of IB: check NCCL_IB_HCA, "
        "NCCL_IB_DISABLE and /dev/infiniband in the container"
    ]


def test_all_gather_perf_wrong_values_fail():
    # No capture shows corruption: the real Spark run with 12 wrong values written into its
    # out-of-place #wrong cell and the summary line nccl-tests prints then.
    text = (
        fixture("all_gather_perf_spark_ib.txt")
        .replace("21.99       0  24472.5", "21.99      12  24472.5")
        .replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")
    )
    result = lc.check_all_gather_perf(text, ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert result["reasons"] == ["12 wrong values (data corruption)"]
    assert result["message"].count("FAIL") == 1
    assert result["message"].endswith(": FAIL: 12 wrong values (data corruption)")


def test_all_gather_perf_without_debug_output_cannot_prove_ib():
    text = fixture("all_gather_perf_spark_nodebug.txt")
    result = lc.check_all_gather_perf(text, ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert result["busbw_gbps"] == 21.4033
    assert result["reasons"] == [
        "NCCL_DEBUG=INFO output shows no NET/IB transport (saw unknown), but NCCL_IB_HCA in "
        "comm.env names rocep1s0f1, roceP2p1s0f1: the run cannot prove RDMA",
    ]
    # 21.40 GB/s alone is the slow band: it would pass with a warning.
    alone = lc.check_all_gather_perf(text, require_ib=False)
    assert alone["passed"] and alone["band"] == "slow"


def test_all_gather_perf_band_edges_are_inclusive():
    text = fixture("all_gather_perf_spark_ib.txt")
    at = lc.check_all_gather_perf(text, healthy_gbps=21.9636, ib_hca=SPARK_HCA)
    assert at["passed"] and at["band"] == "healthy"
    under = lc.check_all_gather_perf(text, healthy_gbps=21.9637, ib_hca=SPARK_HCA)
    assert under["passed"] and under["band"] == "slow"
    assert lc.check_all_gather_perf(text, floor_gbps=21.9636, ib_hca=SPARK_HCA)["passed"]
    broken = lc.check_all_gather_perf(text, floor_gbps=21.9637, ib_hca=SPARK_HCA)
    assert not broken["passed"] and broken["band"] == "broken"


def test_all_gather_perf_without_avg_line_uses_the_rows():
    text = "\n".join(
        line
        for line in fixture("all_gather_perf_spark_nodebug.txt").splitlines()
        if "Avg bus" not in line
    )
    result = lc.check_all_gather_perf(text, require_ib=False)
    assert result["busbw_gbps"] == pytest.approx(
        (19.73 + 20.80 + 21.23 + 22.05 + 22.14 + 22.46) / 6
    )


# The bands, each on a capture: broken (fails), slow (passes with a warning), healthy (passes).


def test_band_broken_a_pair_at_2_83_gbps_over_the_configured_twins_fails_on_bandwidth_alone():
    # The cable in port 0, NCCL on port 0's twins: with NCCL_IB_HCA naming those very twins the
    # transport and devices pass, and 2.83 GB/s is below the floor.
    text = fixture("all_gather_perf_spark_port0.txt")
    result = lc.check_all_gather_perf(text, ib_hca="rocep1s0f0,roceP2p1s0f0")
    assert not result["passed"] and result["band"] == "broken"
    assert result["reasons"] == [
        "busbw 2.83 GB/s is below host_prep_nccl_busbw_floor_gbps (6), which only a broken data "
        "path measures (a socket fallback or the wrong devices give about 3)"
    ]
    assert result["warnings"] == []


def test_band_slow_a_pair_at_mtu_1500_passes_with_a_warning_naming_what_lowers_it():
    # The published MTU 1500 run has no NCCL_DEBUG lines: its header and result row follow the
    # NCCL lines of the port-1 capture (the same setup, NET/IB on both twins), its own average
    # line (left out of the page) computed as nccl-tests does: the mean of both places' busbw.
    ib = fixture("all_gather_perf_spark_ib.txt")
    nccl = "".join(line for line in ib.splitlines(keepends=True) if " NCCL INFO " in line)
    text = nccl + fixture("all_gather_perf_spark_mtu1500.txt")
    result = lc.check_all_gather_perf(text, ib_hca=SPARK_HCA)
    assert result["passed"] and result["band"] == "slow"
    assert result["busbw_gbps"] == pytest.approx((18.94 + 20.95) / 2)
    assert result["message"].startswith(
        "all_gather busbw 19.95 GB/s = 79.8% of 25 GB/s over NET/IB (rocep1s0f1, roceP2p1s0f1): "
        "pass with a WARNING: busbw 19.95 GB/s is below host_prep_nccl_busbw_healthy_gbps "
        "(21.875; a healthy pair measures about 23.7): the link works but runs slow"
    )
    for cause in ("MTU below 9000", "one twin", "below 200000Mb/s", "thermally throttled"):
        assert cause in result["warnings"][0]
    # Without the NCCL lines the same run cannot prove RDMA: the transport decides, as before.
    alone = lc.check_all_gather_perf(fixture("all_gather_perf_spark_mtu1500.txt"), ib_hca=SPARK_HCA)
    assert not alone["passed"] and "cannot prove RDMA" in alone["reasons"][0]


def test_band_healthy_the_published_port_1_run_passes_without_a_warning():
    result = lc.check_all_gather_perf(fixture("all_gather_perf_spark_ib.txt"), ib_hca=SPARK_HCA)
    assert result["passed"] and result["band"] == "healthy" and result["warnings"] == []
    assert result["message"].endswith(": pass")


def test_band_a_socket_fallback_fails_on_transport_whatever_its_bandwidth():
    # The captured socket run, its busbw taken as healthy (floor and healthy at 1 GB/s): the
    # transport still fails it.
    text = fixture("all_gather_perf_h200x2_socket.txt")
    result = lc.check_all_gather_perf(text, floor_gbps=1.0, healthy_gbps=1.0, ib_hca=SPARK_HCA)
    assert not result["passed"] and result["band"] == "healthy"


@pytest.mark.parametrize(
    ("busbw", "band"),
    [(None, "unmeasured"), (2.83, "broken"), (5.99, "broken"), (6.0, "slow"), (18.94, "slow"),
     (21.874, "slow"), (21.875, "healthy"), (23.74, "healthy")],
)  # fmt: skip
def test_busbw_bands_on_published_figures(busbw, band):
    assert lc.busbw_band(busbw) == band


def test_not_nccl_tests_output():
    with pytest.raises(lc.CheckOutputError, match="not nccl-tests output"):
        lc.parse_all_gather_perf("mpirun: command not found\n")


# --------------------------------------------------------------------------- the script's JSON


def test_busbw_json_of_both_ranks_on_one_line_is_read():
    # Two ranks of one host printed into one stdout: their objects share a line.
    text = fixture("busbw_json_h200x2_socket_twins.txt")
    assert any(line.count('"check": "nccl_all_gather"') == 2 for line in text.splitlines())
    data = lc.parse_busbw_json(text)
    assert data["check"] == "nccl_all_gather" and data["world_size"] == 2


def test_busbw_json_socket_fallback_fails_naming_both():
    result = lc.check_busbw_json(fixture("busbw_json_h200x2_socket_twins.txt"), ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert result["transport"] == "Socket"
    assert result["reasons"] == [
        "NCCL used NET/Socket over eth0, but NCCL_IB_HCA in comm.env names rocep1s0f1, "
        "roceP2p1s0f1 over NET/IB: check NCCL_IB_DISABLE and /dev/infiniband in the container",
        "busbw 3.92 GB/s is below host_prep_nccl_busbw_floor_gbps (6), which only a broken data "
        "path measures (a socket fallback or the wrong devices give about 3)",
    ]
    # The script itself decided the same transport on that machine, with the NCCL_IB_HCA it was
    # given (its bandwidth reason is the single threshold's of the capture's day, 2026-12-01).
    assert result["measurement"]["decision"]["reasons"][0] == result["reasons"][0]


def test_busbw_json_socket_with_another_hca_in_the_container():
    text = fixture("busbw_json_h200x2_socket_roce_eth0.txt")
    data = lc.parse_busbw_json(text)
    assert data["env"]["NCCL_IB_HCA"] == "roce_eth0"
    assert data["decision"]["reasons"][0].startswith(
        "NCCL used NET/Socket over eth0, but NCCL_IB_HCA in comm.env names roce_eth0 over NET/IB"
    )
    # The gate compares with the node's comm.env, not with what the container was given.
    result = lc.check_busbw_json(text, ib_hca=SPARK_HCA)
    assert "names rocep1s0f1, roceP2p1s0f1 over NET/IB" in result["reasons"][0]


def test_busbw_json_inside_one_host():
    text = fixture("busbw_json_h200x2_p2p.txt")
    data = lc.parse_busbw_json(text)
    assert (data["hosts"], data["transport"], data["busbw_gbps"]) == (["vm"], "P2P", 241.981)
    assert data["nccl_local"]["channels"] == {"P2P": 24}
    assert data["decision"]["passed"] is True  # one host: the script did not require NET/IB
    result = lc.check_busbw_json(text, ib_hca=SPARK_HCA)
    assert not result["passed"]
    assert result["reasons"] == [
        "NCCL_DEBUG=INFO output shows no NET/IB transport (saw P2P), but NCCL_IB_HCA in "
        "comm.env names rocep1s0f1, roceP2p1s0f1: the run cannot prove RDMA"
    ]
    assert lc.check_busbw_json(text, require_ib=False)["passed"]


def _spark_json(rank_log: str, **change) -> str:
    """The JSON line nccl_allgather_busbw.py writes, for a rank whose NCCL log is ``rank_log``
    (no capture of the script on Sparks exists: its transport records come from a real log)."""
    data = lc.parse_busbw_json(fixture("busbw_json_h200x2_p2p.txt"))
    local = lc.nccl_transport(rank_log)
    data.update({"hosts": ["spark-1", "spark-2"], "nccl": local, "nccl_local": local,
                 "transport": local["transport"], "busbw_gbps": 21.9636, **change})  # fmt: skip
    return json.dumps(data)


def test_busbw_json_compares_the_ranks_own_devices():
    log = fixture("all_gather_perf_spark_ib.txt")
    rank1 = "\n".join(line for line in log.splitlines() if line.startswith("spark-4440"))
    text = _spark_json(rank1)
    assert lc.check_busbw_json(text, ib_hca=SPARK_HCA)["passed"]
    result = lc.check_busbw_json(text, ib_hca="roce_eth0")
    assert result["reasons"] == [
        "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env names roce_eth0"
    ]
    wrong = lc.check_busbw_json(_spark_json(rank1, wrong=3), ib_hca=SPARK_HCA)
    assert wrong["reasons"] == ["3 wrong values after all_gather (data corruption)"]


def test_busbw_json_captured_on_the_sim_is_gloo():
    text = fixture("busbw_json_sim_gloo.txt")
    data = lc.parse_busbw_json(text)
    assert data["backend"] == "gloo" and data["hosts"] == ["spark-1", "spark-2"]
    assert data["wrong"] == 0
    assert lc.check_busbw_json(text, floor_gbps=0.01, require_ib=False)["passed"]
    assert not lc.check_busbw_json(text, floor_gbps=0.01)["passed"]


def test_busbw_json_missing_or_broken():
    with pytest.raises(lc.CheckOutputError, match="no JSON line"):
        lc.parse_busbw_json("torch.distributed.DistBackendError: NCCL error\n")
    broken = json.dumps({"check": "nccl_all_gather", "busbw_gbps": None})
    with pytest.raises(lc.CheckOutputError, match="no numeric busbw_gbps"):
        lc.parse_busbw_json(broken)


def test_decide_nccl_at_the_band_edges_and_reference():
    ib = lc.nccl_transport(fixture("all_gather_perf_spark_ib.txt"))
    at = lc.decide_nccl(21.875, ib, ib_hca=SPARK_HCA)
    assert at["passed"] and at["band"] == "healthy" and at["percent_of_reference"] == 87.5
    below = lc.decide_nccl(21.874, ib, ib_hca=SPARK_HCA)
    assert below["passed"] and below["band"] == "slow" and below["warnings"]
    assert lc.decide_nccl(6.0, ib, ib_hca=SPARK_HCA)["band"] == "slow"
    assert not lc.decide_nccl(5.999, ib, ib_hca=SPARK_HCA)["passed"]
    assert lc.decide_nccl(23.74, ib)["percent_of_reference"] == 95.0
    assert not lc.decide_nccl(None, ib)["passed"]


# --------------------------------------------------------------------------- ip -j addr


IP_JSON = fixture("ip_j_addr_h200x2.txt")
H200_LINK = [{"netdev": "eth0", "address": "192.0.2.2/24"}]


def test_addresses_pass():
    result = lc.check_addresses(IP_JSON, H200_LINK, 1400)
    assert result["passed"]
    assert result["message"] == "eth0 192.0.2.2/24 MTU 1400 UP"


@pytest.mark.parametrize(
    ("links", "mtu", "words"),
    [
        (H200_LINK, 9000, "eth0: MTU 1400, expected 9000"),
        ([{"netdev": "eth0", "address": "192.0.2.99/24"}], 1400, "192.0.2.99/24 not configured"),
        ([{"netdev": "eth7", "address": "192.0.2.2/24"}], 1400, "eth7: no such interface"),
        ([{"netdev": "ifb0", "address": "192.0.2.2/24"}], 1500, "ifb0: DOWN"),
    ],
)
def test_addresses_fail(links, mtu, words):
    result = lc.check_addresses(IP_JSON, links, mtu)
    assert not result["passed"]
    assert words in result["message"]


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


def test_address_facts_refuse_a_second_ipv4_address_on_a_twin():
    # The sim's capture with a second address on eth0, as setup lists it (ipv4_secondaries).
    facts = json.loads(json.dumps(FACTS))
    facts["ansible_eth0"]["ipv4_secondaries"] = [
        {"address": "10.10.10.2", "prefix": "24", "network": "10.10.10.0"}
    ]
    result = lc.check_address_facts(facts, FAST, 9000)
    assert result["passed"] is False
    assert result["message"] == (
        "eth0: 10.10.10.2/24 besides 172.30.241.11/24: a twin carries only the inventory's "
        "address. Remove it (sudo ip addr del 10.10.10.2/24 dev eth0) and whatever adds it "
        "(another netplan file or NetworkManager profile, a DHCP client)"
    )
    # Without the second address it passes again.
    facts["ansible_eth0"]["ipv4_secondaries"] = []
    assert lc.check_address_facts(facts, FAST, 9000)["passed"] is True


def test_ip_json_refuses_a_second_ipv4_address_too():
    data = json.loads(IP_JSON)
    eth0 = next(i for i in data if i.get("ifname") == "eth0")
    eth0["addr_info"].append({"family": "inet", "local": "10.10.10.2", "prefixlen": 24})
    result = lc.check_addresses(json.dumps(data), H200_LINK, 1400)
    assert (
        result["passed"] is False
        and "eth0: 10.10.10.2/24 besides 192.0.2.2/24" in result["message"]
    )


# --------------------------------------------------------------------------- RoCE GID tables
# Constructed examples (gids_*.txt): no published GID table of a Spark was found.

SPARK_1_LINKS = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "ip": "198.51.100.11"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "ip": "198.51.101.11"},
]
SPARK_2_LINKS = [
    {"netdev": "enp1s0f1np1", "roce": "rocep1s0f1", "ip": "198.51.100.12"},
    {"netdev": "enP2p1s0f1np1", "roce": "roceP2p1s0f1", "ip": "198.51.101.12"},
]


def pair(spark_2: str, env: dict | None = None) -> dict:
    return {
        "spark-1": {"text": fixture("gids_spark1.txt"), "links": SPARK_1_LINKS, "env": env or {}},
        "spark-2": {"text": fixture(spark_2), "links": SPARK_2_LINKS, "env": env or {}},
    }


def test_gid_tables_parse_every_entry():
    tables = lc.parse_gid_tables(fixture("gids_spark1.txt"))
    assert sorted(tables) == ["roceP2p1s0f1", "rocep1s0f1"]
    assert sorted(tables["rocep1s0f1"]) == list(range(8))
    assert tables["rocep1s0f1"][3] == {
        "gid": "0000:0000:0000:0000:0000:ffff:c633:640b",
        "type": "RoCE v2",
        "ndev": "enp1s0f1np1",
    }
    # An unused entry: its type and netdev could not be read.
    assert tables["rocep1s0f1"][6] == {"gid": lc.ZERO_GID, "type": None, "ndev": None}


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)", "not a line of a RoCE GID table"),
        ("/sys/class/infiniband/rocep1s0f1/ports/1/gids/3:0000:zzzz", "is no GID"),
    ],
)
def test_gid_tables_refuse_other_text(line, words):
    with pytest.raises(lc.CheckOutputError, match=words):
        lc.parse_gid_tables(line)


@pytest.mark.parametrize(
    ("gid", "family", "valid", "ipv4"),
    [
        ("0000:0000:0000:0000:0000:ffff:c633:640b", 4, True, "198.51.100.11"),
        ("fe80:0000:0000:0000:4ebb:47ff:fe2a:1001", 6, False, None),  # link-local
        ("2001:0db8:0100:0000:0000:0000:0000:0012", 6, True, None),
        (lc.ZERO_GID, 6, False, None),  # unused
    ],
)
def test_gid_kinds(gid, family, valid, ipv4):
    assert (lc.gid_family(gid), lc.gid_valid(gid), lc.gid_ipv4(gid)) == (family, valid, ipv4)


@pytest.mark.parametrize(
    ("text", "version"),
    [("IB/RoCE v1", 1), ("RoCE v1", 1), ("RoCE v2", 2), (None, None), ("", None)],
)
def test_roce_versions(text, version):
    assert lc.roce_version(text) == version


@pytest.mark.parametrize(
    ("name", "env", "index"),
    [
        # One IPv4 address: its RoCE v2 GID.
        ("gids_spark1.txt", {}, 3),
        ("gids_spark1.txt", {"NCCL_IB_GID_INDEX": "-1"}, 3),  # NCCL's "unset"
        ("gids_spark1.txt", {"NCCL_IB_ROCE_VERSION_NUM": "1"}, 2),
        ("gids_spark1.txt", {"NCCL_IB_GID_INDEX": "0"}, 0),  # asked for, right or wrong
        # Two IPv4 addresses: the first one's RoCE v2 GID, unless a range leaves it out.
        ("gids_spark2_second_address.txt", {}, 3),
        ("gids_spark2_second_address.txt", {"NCCL_IB_ADDR_RANGE": "198.51.100.0/24"}, 5),
        # A global IPv6 address before the IPv4 one: IPv4 still wins, two entries further on.
        ("gids_spark2_ipv6_global.txt", {}, 5),
        ("gids_spark2_ipv6_global.txt", {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 3),
    ],
)
def test_nccl_chooses_its_gid_index_as_nccl_does(name, env, index):
    table = lc.parse_gid_tables(fixture(name))["rocep1s0f1"]
    assert lc.nccl_gid_index(table, env) == index


def test_gid_check_passes_with_the_twins_address_at_one_index_on_both_nodes():
    result = lc.check_gid_indices(pair("gids_spark2.txt"))
    assert result["passed"] is True and result["errors"] == []
    assert result["indices"] == {"spark-1": [3, 3], "spark-2": [3, 3]}
    assert result["message"] == (
        "RoCE GID index NCCL uses, the twin's address on every node: spark-1: rocep1s0f1 3, "
        "roceP2p1s0f1 3; spark-2: rocep1s0f1 3, roceP2p1s0f1 3"
    )
    # The same index named outright passes as well.
    assert lc.check_gid_indices(pair("gids_spark2.txt", {"NCCL_IB_GID_INDEX": "3"}))["passed"]


def test_gid_check_refuses_another_address_in_front_of_the_twins():
    # The index is 3 on both nodes, but on spark-2 it holds the leftover address.
    result = lc.check_gid_indices(pair("gids_spark2_second_address.txt"))
    assert result["passed"] is False
    assert result["indices"] == {"spark-1": [3, 3], "spark-2": [3, 3]}
    assert result["errors"] == [
        "spark-2: NCCL would use GID index 3 of rocep1s0f1 (enp1s0f1np1), which holds "
        "::ffff:10.10.10.2 (RoCE v2, enp1s0f1np1), not the twin's address 198.51.100.12 as RoCE "
        "v2 (that is at index 5): another address of the twin comes first in the table. Remove "
        "it from enp1s0f1np1 (ip addr show dev enp1s0f1np1) and run again"
    ]


def test_gid_check_refuses_indices_that_differ_between_the_nodes():
    result = lc.check_gid_indices(pair("gids_spark2_ipv6_global.txt"))
    assert result["passed"] is False
    assert result["indices"] == {"spark-1": [3, 3], "spark-2": [5, 3]}
    assert result["errors"] == [
        "twin 1: NCCL would use GID index 3 on spark-1 (rocep1s0f1), 5 on spark-2 (rocep1s0f1): "
        "one NCCL_IB_GID_INDEX (and ib_write_bw -x) names one index for both nodes, so it must "
        "be the same on each; before the twin's address spark-2 has index 2 2001:db8:100::12 "
        "(IB/RoCE v1, enp1s0f1np1), index 3 2001:db8:100::12 (RoCE v2, enp1s0f1np1). Remove "
        "what else is on enp1s0f1np1 of spark-2 (ip addr show dev enp1s0f1np1: a second IPv4 or "
        "a global IPv6 address each take GID entries) and run again"
    ]


def test_gid_check_refuses_a_named_index_that_holds_another_gid():
    result = lc.check_gid_indices(pair("gids_spark2_ipv6_global.txt", {"NCCL_IB_GID_INDEX": "3"}))
    assert result["indices"] == {"spark-1": [3, 3], "spark-2": [3, 3]}
    assert result["errors"] == [
        "spark-2: NCCL would use GID index 3 of rocep1s0f1 (enp1s0f1np1), which holds "
        "2001:db8:100::12 (RoCE v2, enp1s0f1np1), not the twin's address 198.51.100.12 as RoCE "
        "v2: NCCL_IB_GID_INDEX in the comm env names that index; the twin's address is at index "
        "5 here. Remove what else is on enp1s0f1np1 (ip addr show dev enp1s0f1np1) so the index "
        "is the same on every node, or leave NCCL_IB_GID_INDEX out of host_prep_comm_env_extra "
        "so NCCL finds it"
    ]


def test_gid_check_refuses_a_node_without_the_tables():
    # grep printed nothing: no such RoCE device under the sysfs directory.
    nodes = pair("gids_spark2.txt")
    nodes["spark-2"]["text"] = ""
    result = lc.check_gid_indices(nodes)
    assert result["passed"] is False
    assert result["errors"] == [
        f"spark-2: no GID table for {roce} behind {netdev} under ports/1 of its sysfs entry: "
        "check that ibdev2netdev lists the device and that the mlx5 RDMA driver is loaded"
        for netdev, roce in (("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1"))
    ]
    nodes["spark-2"]["text"] = "grep: something else\n"
    (error,) = lc.check_gid_indices(nodes)["errors"]
    assert error.startswith("spark-2: cannot read the RoCE GID tables: not a line of a RoCE GID")
