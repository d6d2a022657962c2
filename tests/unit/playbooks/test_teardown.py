"""playbooks/teardown.yml judges its switches on the controller: a value that is not true or
false stops the run before any play reaches a node (the bool filter would read it as false)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
# Documentation addresses (RFC 5737): nothing answers there, and no test run reaches them.
NODES = {
    "a": {"ansible_host": "192.0.2.11", "spark_fast_ip": "198.51.100.11", "spark_hardware": False},
    "b": {"ansible_host": "192.0.2.12", "spark_fast_ip": "198.51.100.12", "spark_hardware": False},
}
INVENTORY = {
    "all": {
        "children": {
            "sparks": {
                "children": {
                    "spark_head": {"hosts": {"a": NODES["a"]}},
                    "spark_workers": {"hosts": {"b": NODES["b"]}},
                }
            }
        }
    }
}


def teardown(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(INVENTORY))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/teardown.yml", "-i", str(path), *extra],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("switch", "value"),
    [("teardown_host_prep", "maybe"), ("teardown_remove_weights", "ture"),
     ("teardown_host_prep", "2")],
)  # fmt: skip
def test_a_switch_that_is_not_a_boolean_stops_the_run_before_the_nodes(tmp_path, switch, value):
    proc = teardown(tmp_path, "-e", f"{switch}={value}")
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, out
    assert f"{switch} must be true or false (got '{value}')" in out, out
    # any_errors_fatal: no later play starts, so no node is contacted.
    assert "PLAY [Stop serving]" not in out, out
    assert "UNREACHABLE" not in out, out


@pytest.mark.parametrize("value", ["true", "false", "yes", "no", "True", "1", "0"])
def test_boolean_switches_pass_the_judgement(tmp_path, value):
    # Only the tasks tagged always run (the judgement): the plays on the nodes run no task.
    proc = teardown(
        tmp_path, "-e", f"teardown_host_prep={value}", "-e", f"teardown_remove_weights={value}",
        "--tags", "teardown_judgement_only",
    )  # fmt: skip
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, out + proc.stderr
    assert "failed=0" in out and "UNREACHABLE" not in out, out
    assert out.count("ok: [a] => (item=teardown_") == 2, out
