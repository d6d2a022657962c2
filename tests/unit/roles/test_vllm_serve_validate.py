"""roles/vllm_serve/tasks/validate.yml as deploy.yml runs it before any change, here against
inventories/sparks on a local connection (nothing reaches the inventory's addresses): the key
rule of real Sparks and the watchdog's ranges, each refusal naming its variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PLAY = """\
- name: The serving role's checks alone
  hosts: sparks
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: dgx_spark.cluster.vllm_serve
        tasks_from: validate
"""


def validate(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    play = tmp_path / "validate.yml"
    play.write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    local = ["-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run(
        [str(BIN / "ansible-playbook"), str(play), "-i", "sparks", *local, *extra],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=300,
    )  # fmt: skip


def outcome(proc: subprocess.CompletedProcess, task: str) -> str:
    """The first word a task's result printed for the head (ok, fatal, ...), or ''.

    The checks after these two read the machine's own memory as a Spark's (a local connection
    here), so a run's overall result says nothing about them; each task's own line does."""
    out = proc.stdout
    marker = f"TASK [dgx_spark.cluster.vllm_serve : {task}]"
    if marker not in out:
        return ""
    after = out.split(marker, 1)[1].split("TASK [", 1)[0]
    for line in after.splitlines():
        if line.startswith(("ok:", "fatal:", "skipping:", "changed:")):
            return line.split(":", 1)[0]
    return ""


KEY_TASK = "Require an API key on real Sparks"
WATCHDOG_TASK = "Check the watchdog's settings"


def test_the_sparks_inventory_as_shipped_needs_its_key(tmp_path):
    proc = validate(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert outcome(proc, KEY_TASK) == "fatal", out
    assert "vllm_serve_api_key is empty, so anyone who reaches port 8000" in out, out
    assert "vllm_serve_allow_unauthenticated: true" in out, out


@pytest.mark.parametrize(
    "extra",
    [("-e", "vllm_serve_api_key=sk-vaulted"), ("-e", "vllm_serve_allow_unauthenticated=true")],
    ids=["key", "opt-out"],
)
def test_a_key_or_the_opt_out_passes(tmp_path, extra):
    proc = validate(tmp_path, *extra)
    assert outcome(proc, KEY_TASK) == "ok", proc.stdout + proc.stderr
    assert outcome(proc, WATCHDOG_TASK) == "ok", proc.stdout + proc.stderr
    assert "vllm_serve_api_key is empty" not in proc.stdout


def test_a_watchdog_interval_of_zero_is_refused(tmp_path):
    proc = validate(
        tmp_path, "-e", "vllm_serve_api_key=sk-vaulted", "-e", '{"vllm_serve_watchdog_interval": 0}'
    )
    out = proc.stdout + proc.stderr
    assert outcome(proc, KEY_TASK) == "ok", out
    assert outcome(proc, WATCHDOG_TASK) == "fatal", out
    assert "vllm_serve_watchdog_interval is 0; allowed: whole seconds 2-600" in out, out
