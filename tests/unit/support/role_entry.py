"""Run one role entry point against inventories/sparks on a local connection: the role's own
tasks as a playbook would run them, with nothing reaching the inventory's addresses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PLAY = """\
- name: One entry point of {role}
  hosts: sparks
  gather_facts: false
  tasks:
    - name: Run it
      ansible.builtin.include_role:
        name: dgx_spark.cluster.{role}
        tasks_from: {entry}
"""


def run_entry_point(tmp_path: Path, role: str, entry: str, *extra: str):
    """ansible-playbook of ``role``'s ``entry`` on the sparks hosts, locally; extra arguments
    follow (``-e`` ...). Returns the CompletedProcess."""
    play = tmp_path / f"{role}_{entry}.yml"
    play.write_text(PLAY.format(role=role, entry=entry))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    local = ["-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run(
        [str(BIN / "ansible-playbook"), str(play), "-i", "sparks", *local, *extra],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=300,
    )  # fmt: skip
