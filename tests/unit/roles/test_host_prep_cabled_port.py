"""roles/host_prep/tasks/validate.yml finds the cabled port on hardware before anything else:
the validate entry point runs against this machine (local connection, read-only tasks only)
with a stand-in ibdev2netdev that prints a captured Spark output, and stops where it should."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.captures import tool_output

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "host_prep"
PLAY = [
    {
        "name": "Validate host_prep on a stand-in Spark",
        "hosts": "spark-1",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Run the validate entry point",
                "ansible.builtin.include_role": {
                    "name": "dgx_spark.cluster.host_prep",
                    "tasks_from": "validate",
                },
            }
        ],
    }
]


def validate(tmp_path: Path, fixture: str | None, links: list[dict]) -> str:
    """Runs the play with ``fixture`` as ibdev2netdev's output (None: no ibdev2netdev at all)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    if fixture is not None:
        # The stand-in prints what the tool printed: the fixture without its provenance header.
        output = tmp_path / "ibdev2netdev.out"
        output.write_text(tool_output(FIXTURES / fixture))
        tool = stub / "ibdev2netdev"
        tool.write_text(f"#!/bin/sh\ncat '{output}'\n")
        tool.chmod(0o755)
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ansible_host": "127.0.0.1",
        "ansible_user": "spark",
        "spark_hardware": True,
        "spark_fast_ip": "198.51.100.11",
        "spark_gpus": 1,
        "host_prep_cx7_links": links,
        "host_prep_firewall": False,
    }
    inventory = {"all": {"children": {"sparks": {"hosts": {"spark-1": host}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{stub}:{BIN}:/usr/bin:/bin",
    }
    argv = [str(BIN / "ansible-playbook"), "play.yml", "-i", "hosts.yml"]
    proc = subprocess.run(
        argv, cwd=tmp_path, env=env, text=True, capture_output=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0, "validate passed on a machine without the ConnectX-7 netdevs"
    return " ".join((proc.stdout + proc.stderr).split())


ADDRESSES = [{"address": "198.51.100.11/24"}, {"address": "198.51.101.11/24"}]


def test_no_cable_stops_at_the_cabled_port_with_the_fix(tmp_path):
    out = validate(tmp_path, "ibdev2netdev_no_cable.txt", ADDRESSES)
    assert "TASK [dgx_spark.cluster.host_prep : Require the cabled port's twins Up" in out
    assert "spark-1: no ConnectX-7 port is Up, so host_prep_cx7_links has no cabled port" in out
    assert "Seat the QSFP cable firmly at both ends" in out
    # Nothing after the refusal ran: not the interface checks, not nvidia-smi.
    assert "Check this node's ConnectX-7 links" not in out
    assert "List the GPUs" not in out


def test_pinned_port_1_with_the_cable_in_port_0_is_refused(tmp_path):
    links = [{"netdev": "enp1s0f1np1", "address": "198.51.100.11/24"}]
    out = validate(tmp_path, "ibdev2netdev_port0.txt", links)
    assert (
        "spark-1: host_prep_cx7_links[0].netdev is pinned to enp1s0f1np1, which ibdev2netdev "
        "shows Down; the Up one is enp1s0f0np0" in out
    )


def test_the_discovered_names_reach_the_interface_check(tmp_path):
    # This machine has no ConnectX-7: the interface check (the next stage) names what was found.
    out = validate(tmp_path, "ibdev2netdev_port0.txt", ADDRESSES)
    assert "spark-1: QSFP port 0 is cabled (Up)" in out
    assert "host_prep_cx7_links[0].netdev enp1s0f0np0 is not an interface on spark-1" in out
    assert "host_prep_cx7_links[1].netdev enP2p1s0f0np0 is not an interface on spark-1" in out


@pytest.mark.skipif(shutil.which("ibdev2netdev") is not None, reason="this machine has it")
def test_a_missing_ibdev2netdev_is_refused_with_its_reason(tmp_path):
    out = validate(tmp_path, None, ADDRESSES)
    assert "spark-1: ibdev2netdev failed (rc 2: " in out
    assert "DGX OS ships it with DOCA-OFED" in out
