"""The simulated pair's stand-ins for the Spark's link tools (tests/sim/host_prep_standins/)
report the node's real interfaces, so the collection's link gate can fail on the sim.

Each test builds a fake ``/sys/class/net`` under tmp_path, runs the real stand-in script as a
subprocess with ``STANDIN_SYS_CLASS_NET`` pointing at it, and hands its output to the same
``link_checks`` functions the role calls (host_prep('check', 'busbw_json' / 'roce'))."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import link_checks as lc
from support.captures import tool_output

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests/sim/host_prep_standins"
FIXTURES = ROOT / "tests/unit/fixtures/host_prep"
# What comm.env gives the NCCL check's container on the sim (fast_link.comm_env).
FAST_IP = "192.0.2.2"


def sysfs(tmp_path: Path, states: dict[str, str]) -> Path:
    """A fake /sys/class/net: one folder per interface with its operstate."""
    net = tmp_path / "net"
    for name, state in states.items():
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text(f"{state}\n")
    return net


def standin(args: list[str], net: Path, **env: str) -> str:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "STANDIN_SYS_CLASS_NET": str(net),
        # nccl_rank.py imports link_checks from /checks in its container; here, from the tree.
        "PYTHONPATH": str(ROOT / "plugins/module_utils"),
        **env,
    }
    done = subprocess.run(args, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def nccl_rank(net: Path, hca: str | None, rank: int = 0, **env: str) -> str:
    comm_env = {"NCCL_SOCKET_IFNAME": "eth0", "VLLM_HOST_IP": FAST_IP, **env}
    if hca is not None:
        comm_env["NCCL_IB_HCA"] = hca
    script = str(STANDINS / "nccl_rank.py")
    return standin([sys.executable, script, f"--node-rank={rank}"], net, **comm_env)


def nccl_lines(out: str) -> list[str]:
    return [line.split(" NCCL INFO ", 1)[1] for line in out.splitlines() if " NCCL INFO " in line]


def test_all_twins_up_gives_net_ib_on_them_and_the_gate_passes(tmp_path):
    net = sysfs(tmp_path, {"lo": "unknown", "eth0": "up", "eth1": "up", "docker0": "down"})
    out = nccl_rank(net, "roce_eth0,roce_eth1", rank=1)
    transport = lc.nccl_transport(out)
    assert transport["transport"] == "IB"
    assert transport["ib_devices"] == ["roce_eth0:1", "roce_eth1:1"]
    assert transport["channel_devices"] == ["roce_eth0", "roce_eth1"]
    # The role's decision: the JSON line against the node's comm.env.
    decision = lc.check_busbw_json(out, ib_hca="roce_eth0,roce_eth1")
    assert decision["passed"], decision["message"]
    assert "over NET/IB (roce_eth0, roce_eth1): pass" in decision["message"]
    assert decision["measurement"]["rank"] == 1


@pytest.mark.parametrize(
    ("states", "why"),
    [
        ({"lo": "unknown", "eth0": "up"}, "comm.env names a device the node lacks"),
        ({"lo": "unknown", "eth0": "up", "nosuch0": "down"}, "its interface is down"),
    ],
)
def test_no_usable_hca_falls_back_to_sockets_and_the_gate_fails_naming_it(tmp_path, states, why):
    net = sysfs(tmp_path, states)
    out = nccl_rank(net, "roce_nosuch0")
    transport = lc.nccl_transport(out)
    assert transport["transport"] == "Socket", why
    assert transport["socket_ifaces"] == ["eth0"] and transport["ib_devices"] == []
    decision = lc.check_busbw_json(out, ib_hca="roce_nosuch0")
    assert not decision["passed"], why
    assert decision["reasons"][0] == (
        "NCCL used NET/Socket over eth0, but NCCL_IB_HCA in comm.env names roce_nosuch0 over "
        "NET/IB: check NCCL_IB_DISABLE and /dev/infiniband in the container"
    )
    assert decision["transport"] == "Socket"


def test_socket_fallback_is_written_as_real_nccl_writes_it(tmp_path):
    """Every line of the fall-back but the channels is one the captured NCCL run printed, for
    the same NCCL_IB_HCA (roce_eth0) on a host without that device."""
    capture = nccl_lines(tool_output(FIXTURES / "all_gather_perf_h200x2_socket.txt"))
    ours = nccl_lines(nccl_rank(sysfs(tmp_path, {"eth1": "up"}), "roce_eth0"))
    setup = [line for line in ours if not line.startswith("Channel ")]
    assert setup[0] == "NCCL_IB_HCA set to roce_eth0"
    assert [line for line in setup if line not in capture] == []
    channel = re.compile(r"^Channel \d\d/0 : (\d)\[\d\] -> (\d)\[\d\] \[send\] via NET/Socket/0$")
    channels = [line for line in ours if line.startswith("Channel ")]
    assert channels and all(channel.match(line) for line in channels), channels
    # The captured run's own channel lines have that form (its ring lines carry no "via").
    real = [line.replace("[receive]", "[send]") for line in capture if " via " in line]
    assert real and all(channel.match(line) for line in real), real


def test_one_hca_missing_leaves_net_ib_on_the_other_and_the_gate_names_both(tmp_path):
    net = sysfs(tmp_path, {"eth0": "up"})
    out = nccl_rank(net, "roce_eth0,roce_nosuch0")
    assert lc.nccl_transport(out)["ib_devices"] == ["roce_eth0:1"]
    decision = lc.check_busbw_json(out, ib_hca="roce_eth0,roce_nosuch0")
    assert not decision["passed"]
    assert decision["reasons"] == [
        "NCCL used NET/IB on roce_eth0, but NCCL_IB_HCA in comm.env names roce_eth0, roce_nosuch0"
    ]


def test_ib_disabled_uses_sockets_even_with_the_twin_up(tmp_path):
    out = nccl_rank(sysfs(tmp_path, {"eth0": "up"}), "roce_eth0", NCCL_IB_DISABLE="1")
    assert not any(line.startswith("NET/IB") for line in nccl_lines(out))
    assert not lc.check_busbw_json(out, ib_hca="roce_eth0")["passed"]


def test_ibdev2netdev_reports_each_interface_in_its_own_state(tmp_path):
    net = sysfs(tmp_path, {"lo": "unknown", "eth0": "up", "eth1": "down", "dummy0": "unknown"})
    out = standin([str(STANDINS / "ibdev2netdev")], net)
    entries = lc.parse_ibdev2netdev(out)
    assert {e["netdev"]: e["state"] for e in entries} == {
        "eth0": "Up",
        "eth1": "Down",
        "dummy0": "Down",
    }
    # The Down line has the real tool's form (the derived fixture of one twin down).
    real = tool_output(FIXTURES / "ibdev2netdev_twin_down.txt").splitlines()
    assert "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)" in real
    assert "roce_eth1 port 1 ==> eth1 (Down)" in out.splitlines()
    # A RoCE device still backs the down twin, but the role's check refuses it.
    assert lc.roce_for_netdevs(out, ["eth0", "eth1"]) == {"eth0": "roce_eth0", "eth1": "roce_eth1"}
    links = [{"netdev": "eth0"}, {"netdev": "eth1"}]
    check = lc.check_roce(out, links)
    assert not check["passed"]
    assert check["message"] == "roce_eth1 ==> eth1 is Down, not Up"
    assert lc.check_roce(out, links[:1])["passed"]
