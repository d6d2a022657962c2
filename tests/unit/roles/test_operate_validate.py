"""roles/operate/tasks/validate.yml, the entry point preflight and status, benchmark and logs
run first, against inventories/sparks on a local connection (nothing reaches its addresses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PLAY = """\
- name: The operate role's checks alone
  hosts: sparks
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: dgx_spark.cluster.operate
        tasks_from: validate
"""


def validate(tmp_path: Path, **extra) -> subprocess.CompletedProcess:
    play = tmp_path / "validate.yml"
    play.write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    local = ["-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run(
        [str(BIN / "ansible-playbook"), str(play), "-i", "sparks", *local, "-e", json.dumps(extra)],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=300,
    )  # fmt: skip


def test_the_sparks_inventory_passes(tmp_path):
    proc = validate(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_bad_setting_is_refused_naming_it(tmp_path):
    proc = validate(tmp_path, operate_status_timeout=0, operate_benchmark_concurrency=[0])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "operate_status_timeout is 0; allowed: whole seconds 1-600" in out, out
    assert "operate_benchmark_concurrency is [0]" in out, out
