"""playbooks/check_inventory.yml refuses an inventory that cannot make a cluster, naming why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def inventory(hosts: dict[str, dict], head: list[str], workers: list[str]) -> dict:
    return {
        "all": {
            "children": {
                "sparks": {
                    "children": {
                        "spark_head": {"hosts": {h: hosts[h] for h in head}},
                        "spark_workers": {"hosts": {h: hosts[h] for h in workers}},
                    }
                }
            }
        }
    }


def check(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/check_inventory.yml", "-i", str(path)],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False,
    )  # fmt: skip


GOOD = {
    "a": {"ansible_host": "192.0.2.11", "spark_fast_ip": "198.51.100.11"},
    "b": {"ansible_host": "192.0.2.12", "spark_fast_ip": "198.51.100.12"},
    "c": {"ansible_host": "192.0.2.13", "spark_fast_ip": "198.51.100.13"},
}


def test_production_example_passes():
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/check_inventory.yml", "-i", "sparks"],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_three_nodes_pass(tmp_path):
    proc = check(tmp_path, inventory(GOOD, ["a"], ["b", "c"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("head", "workers", "message"),
    [
        ([], ["a", "b"], "exactly one host in group spark_head (found 0)"),
        (["a", "b"], ["c"], "exactly one host in group spark_head (found 2)"),
        (["a"], [], "at least one host in spark_workers (found 0)"),
    ],
)
def test_head_and_workers(tmp_path, head, workers, message):
    proc = check(tmp_path, inventory(GOOD, head, workers))
    assert proc.returncode != 0
    assert message in " ".join(proc.stdout.split())


def test_missing_fast_ip(tmp_path):
    hosts = {**GOOD, "b": {"ansible_host": "192.0.2.12"}}
    proc = check(tmp_path, inventory(hosts, ["a"], ["b"]))
    assert proc.returncode != 0
    assert "b: ansible_host (192.0.2.12) and spark_fast_ip (unset)" in " ".join(proc.stdout.split())


def test_duplicate_address(tmp_path):
    hosts = {**GOOD, "b": {"ansible_host": "192.0.2.12", "spark_fast_ip": "198.51.100.11"}}
    proc = check(tmp_path, inventory(hosts, ["a"], ["b"]))
    assert proc.returncode != 0
    assert "repeated: 198.51.100.11" in " ".join(proc.stdout.split())
