"""The alias the builder moves is the image the runners run, however the inventory names it.

The roles' defaults are loaded as Ansible loads them (spark_defaults, then hybrid_image and
the runners, the inventory's values as extra vars above them) and rendered by Ansible itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SHOWN = ("hybrid_image_alias", "hybrid_image_name", "ray_cluster_image", "vllm_serve_image")
PLAY = f"""\
- name: The images the builder and the runners name
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Load the defaults
      ansible.builtin.include_vars:
        file: "{{{{ item }}}}"
      loop:
        - {ROOT}/roles/spark_defaults/defaults/main.yml
        - {ROOT}/roles/hybrid_image/defaults/main.yml
        - {ROOT}/roles/ray_cluster/defaults/main.yml
        - {ROOT}/roles/vllm_serve/defaults/main.yml
    - name: Show them
      ansible.builtin.debug:
        msg: "{{{{ {{{", ".join(f"'{name}': {name}" for name in SHOWN)}}} }}}}"
"""


def rendered(tmp_path: Path, **extra: str) -> dict:
    play = tmp_path / "show.yml"
    play.write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}  # fmt: skip
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), str(play), "-i", "localhost,", "-c", "local",
         "-e", json.dumps(extra), "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["plays"][0]["tasks"][-1]["hosts"]["localhost"]["msg"]


@pytest.mark.parametrize(
    ("extra", "served"),
    [
        ({}, "dgx-spark/vllm-serving:current"),
        ({"spark_serving_image": "registry.example/team/serving:live"},
         "registry.example/team/serving:live"),
        ({"spark_serving_image_name": "team/serving"}, "team/serving:current"),
        ({"spark_serving_image_tag": "live"}, "dgx-spark/vllm-serving:live"),
    ],
    ids=["defaults", "image set alone", "name set", "tag set"],
)  # fmt: skip
def test_the_builder_moves_the_image_the_runners_run(tmp_path, extra, served):
    seen = rendered(tmp_path, **extra)
    assert seen["ray_cluster_image"] == seen["vllm_serve_image"] == served, seen
    assert seen["hybrid_image_alias"] == served, seen


def test_a_build_beside_the_served_image_leaves_it_where_it_is(tmp_path):
    seen = rendered(tmp_path, hybrid_image_name="team/trial")
    assert seen["hybrid_image_alias"] == "team/trial:current", seen
    assert seen["vllm_serve_image"] == "dgx-spark/vllm-serving:current", seen
