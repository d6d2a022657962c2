"""The role's own tasks that read what else defines the twins (tasks/validate.yml) and the RoCE
GID tables after a netplan apply (tasks/netplan_apply.yml), run as written against this machine
(local connection, read-only) on directories made here from the constructed fixtures: find's
and grep's arguments, and what the filter then decides from their output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from support.captures import tool_output

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "host_prep"
BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "host_prep"
LEFTOVER_TASKS = (
    "Read the netplan files and NetworkManager profiles of this node",
    "Require no other netplan file or NetworkManager profile to define the twins",
)
GID_TASKS = (
    "Read the RoCE GID tables behind every node's twins",
    "Require the RoCE GID index NCCL uses to hold each twin's address, the same on every node",
)


def _tasks(path: Path, names: tuple[str, ...]) -> list[dict]:
    """The named tasks of a task file (inside blocks too), as the role has them."""
    found: dict[str, dict] = {}

    def walk(tasks):
        for task in tasks:
            if task.get("name") in names:
                found[task["name"]] = task
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    walk(yaml.safe_load(path.read_text()))
    assert sorted(found) == sorted(names), f"{path.name} lacks {set(names) - set(found)}"
    return [found[name] for name in names]


def _play(tmp_path: Path, hosts: dict, tasks: list[dict], play_vars: dict, *extra: str) -> str:
    """Runs ``tasks`` on ``hosts`` (local connection, no become: the tests run as the owner of
    the files) and returns what ansible-playbook printed, on one line."""
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
              "ansible_become": False}  # fmt: skip
    inventory = {"all": {"hosts": {h: {**common, **v} for h, v in hosts.items()}}}
    play = [{"name": "The role's tasks", "hosts": "all", "gather_facts": False,
             "vars": play_vars, "tasks": tasks}]  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}:/usr/bin:/bin"}  # fmt: skip
    argv = [str(BIN / "ansible-playbook"), "play.yml", "-i", "hosts.yml", *extra]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, check=False)
    return f"rc={proc.returncode} " + " ".join((proc.stdout + proc.stderr).split())


# --------------------------------------------------------------------------- leftovers


def _node(tmp_path: Path) -> dict:
    """A node's netplan and NetworkManager directories under tmp_path (no /run/netplan)."""
    etc, lib, nm = tmp_path / "etc/netplan", tmp_path / "lib/netplan", tmp_path / "nm"
    for folder in (etc, lib, nm):
        folder.mkdir(parents=True)
    own = etc / "40-cx7.yaml"
    own.write_text("# ConnectX-7 twins of spark-1\nnetwork:\n  ethernets:\n    enp1s0f1np1: {}\n")
    (etc / "01-network-manager-all.yaml").write_text(
        tool_output(FIXTURES / "netplan_network_manager_all.txt")
    )
    wifi = nm / "office.nmconnection"
    wifi.write_text(tool_output(FIXTURES / "nm_wifi.txt"))
    wifi.chmod(0o600)
    return {
        "_host_prep_netplan_dirs": [str(tmp_path / "run/netplan"), str(etc), str(lib)],
        "_host_prep_nm_dirs": [str(nm)],
        "host_prep_netplan_file": str(own),
        "_host_prep_links": [{"index": 0, "netdev": "enp1s0f1np1", "roce": "rocep1s0f1",
                              "address": "198.51.100.11/24", "ip": "198.51.100.11"}],
        "ansible_facts": {},
    }  # fmt: skip


def test_a_node_without_leftovers_passes(tmp_path):
    play_vars = _node(tmp_path)
    out = _play(tmp_path, {"spark-1": {}}, _tasks(ROLE / "tasks/validate.yml", LEFTOVER_TASKS),
                play_vars)  # fmt: skip
    assert out.startswith("rc=0 "), out
    etc, nm = play_vars["_host_prep_netplan_dirs"][1], play_vars["_host_prep_nm_dirs"][0]
    assert (
        "spark-1: no other netplan file or NetworkManager profile defines enp1s0f1np1 (read: "
        f"{etc}/01-network-manager-all.yaml, {nm}/office.nmconnection)" in out
    ), out


def test_leftovers_stop_the_node_naming_each_file(tmp_path):
    play_vars = _node(tmp_path)
    etc, nm = (
        Path(play_vars["_host_prep_netplan_dirs"][1]),
        Path(play_vars["_host_prep_nm_dirs"][0]),
    )
    (etc / "60-cx7-link.yaml").write_text(tool_output(FIXTURES / "netplan_hand_written_twins.txt"))
    profile = nm / "cx7 twin 1.nmconnection"  # a space in the name, as NetworkManager writes them
    profile.write_text(tool_output(FIXTURES / "nm_twin_manual.txt"))
    profile.chmod(0o600)
    # A keyfile NetworkManager would not load (readable by others) is left alone.
    loose = nm / "loose.nmconnection"
    loose.write_text(tool_output(FIXTURES / "nm_twin_by_mac_dhcp.txt"))
    loose.chmod(0o644)
    # -v prints every task's result: the read's must stay hidden (profiles hold Wi-Fi keys).
    out = _play(tmp_path, {"spark-1": {}}, _tasks(ROLE / "tasks/validate.yml", LEFTOVER_TASKS),
                play_vars, "-v")  # fmt: skip
    assert out.startswith("rc=2 "), out
    assert (
        f"spark-1: {etc}/60-cx7-link.yaml also defines twin enp1s0f1np1 (ethernets.enp1s0f1np1): "
        "addresses 192.168.100.10/24, dhcp4 false, mtu 9000." in out
    ), out
    assert f"Move the file out of those directories (sudo mv {etc}/60-cx7-link.yaml /root/)" in out
    assert (
        f"spark-1: NetworkManager profile {nm}/cx7 twin 1.nmconnection ('cx7-twin-1') binds twin "
        "enp1s0f1np1 (interface-name=enp1s0f1np1)" in out
    ), out
    assert "loose.nmconnection" not in out
    assert "censored" in out and "not-a-real-key" not in out


# --------------------------------------------------------------------------- RoCE GID tables


def _sysfs(root: Path, fixture: str, prefix: str) -> None:
    """The files grep reads, made from a fixture of grep's output, each RoCE device's name with
    ``prefix``; an unused entry's type and netdev are left out (the kernel refuses to read
    them, grep -s says nothing)."""
    for line in tool_output(FIXTURES / fixture).splitlines():
        m = re.match(r"^/sys/class/infiniband/(\S+?/ports/1/\S+?):(.*)$", line)
        path = root / (prefix + m.group(1))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(m.group(2) + "\n")


def _pair(tmp_path: Path, spark_2: str, extra: dict | None = None) -> str:
    # One machine plays both nodes, and the task reads every node's tables under one directory
    # (the same on every node): spark-2's RoCE devices get a prefix here.
    def links(last: int, prefix: str) -> list[dict]:
        return [
            {"index": 0, "netdev": "enp1s0f1np1", "roce": f"{prefix}rocep1s0f1",
             "address": f"198.51.100.{last}/24", "ip": f"198.51.100.{last}"},
            {"index": 1, "netdev": "enP2p1s0f1np1", "roce": f"{prefix}roceP2p1s0f1",
             "address": f"198.51.101.{last}/24", "ip": f"198.51.101.{last}"},
        ]  # fmt: skip

    hosts = {}
    for host, last, fixture, prefix in (
        ("spark-1", 11, "gids_spark1.txt", ""),
        ("spark-2", 12, spark_2, "b-"),
    ):
        _sysfs(tmp_path / "infiniband", fixture, prefix)
        hosts[host] = {"spark_hardware": True, "spark_fast_ip": f"198.51.100.{last}",
                       "_host_prep_links": links(last, prefix),
                       "_host_prep_comm_env_extra": extra or {}}  # fmt: skip
    tasks = _tasks(ROLE / "tasks/netplan_apply.yml", GID_TASKS)
    return _play(
        tmp_path, hosts, tasks, {"_host_prep_infiniband_dir": str(tmp_path / "infiniband")}
    )


def test_the_gid_check_passes_on_alike_tables(tmp_path):
    out = _pair(tmp_path, "gids_spark2.txt")
    assert out.startswith("rc=0 "), out
    # (The YAML callback doubles the quote in "twin's".)
    assert (
        "address on every node: spark-1: rocep1s0f1 3, roceP2p1s0f1 3; spark-2: b-rocep1s0f1 3, "
        "b-roceP2p1s0f1 3" in out
    ), out


def test_the_gid_check_stops_both_nodes_on_unequal_indices(tmp_path):
    out = _pair(tmp_path, "gids_spark2_ipv6_global.txt")
    assert out.startswith("rc=2 "), out
    said = "twin 1: NCCL would use GID index 3 on spark-1 (rocep1s0f1), 5 on spark-2 (b-rocep1s0f1)"
    # Each node read both tables (its own and, delegated, the peer's) and stops.
    assert out.count("fatal: [spark-1]: FAILED!") == out.count("fatal: [spark-2]: FAILED!") == 1
    assert said in out, out


# --------------------------------------------------------------------------- in the role's order


def test_the_checks_after_an_apply_roll_it_back_and_say_why():
    (apply,) = yaml.safe_load((ROLE / "tasks/netplan_apply.yml").read_text())
    block = [task["name"] for task in apply["block"]]
    # Both checks run after the apply and the peers' answer, before the backup is dropped.
    order = ["Apply the netplan configuration", "Reach the peers over the new addresses",
             "Require the inventory's IPv4 address, and no other, on every twin", *GID_TASKS,
             "Remove the backup of the previous netplan file"]  # fmt: skip
    assert [name for name in block if name in order] == order
    for task in _tasks(ROLE / "tasks/netplan_apply.yml", GID_TASKS):
        assert task["when"] == "spark_hardware | bool", task["name"]
    # The rollback's message names each check by the task that failed.
    report = next(task for task in apply["rescue"] if task["name"] == "Report the rollback")
    peers = [task["name"] for task in yaml.safe_load((ROLE / "tasks/reach_peers.yml").read_text())]
    assert set(report["vars"]["_why"]) == {
        "Require every peer reachable over each twin with jumbo frames",
        "Require the inventory's IPv4 address, and no other, on every twin",
        GID_TASKS[1],
    }
    assert set(report["vars"]["_why"]) <= set(block) | set(peers)


def test_the_leftovers_are_read_in_validation_before_any_change():
    names = [task.get("name") for task in yaml.safe_load((ROLE / "tasks/validate.yml").read_text())]
    first, decide = (names.index(name) for name in LEFTOVER_TASKS)
    assert names.index("Keep the resolved links") < first < decide
    # validate.yml stays read-only: its tasks change nothing (main.yml runs it first).
    read = _tasks(ROLE / "tasks/validate.yml", LEFTOVER_TASKS[:1])[0]
    assert read["changed_when"] is False and read["check_mode"] is False and read["no_log"] is True
    assert read["become"] is True  # netplan files are root's alone; sudo may ask for a password
