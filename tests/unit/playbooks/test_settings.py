"""playbooks/settings.yml refuses what the controller can judge alone before any SSH connection,
and a failed run prints no play after the one that failed (issue #45).

The example inventory's nodes are TEST-NET addresses (192.0.2.0/24). ssh is given a proxy
command that exits at once, so even a regression that let a play connect sends no packet: it
would show as UNREACHABLE, which these tests refuse.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SETTINGS_PLAY = "Judge the settings on the controller, before any connection"


def deploy(*extra: str) -> tuple[int, str]:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_SSH_ARGS": "-o ProxyCommand=false",
    }
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/deploy.yml", "-i", "inventories/sparks",
         "-e", "vllm_serve_api_key=unit-test-key", *extra],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def plays(output: str) -> list[str]:
    return re.findall(r"^PLAY \[(.*)\] \**$", output, flags=re.MULTILINE)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        # 3 GPUs' worth of ranks on two single-GPU nodes (the example's spark_gpus: 1).
        ("vllm_serve_tensor_parallel_size=3", "vllm_serve_tensor_parallel_size (3)"),
        ("vllm_serve_port=70000", "vllm_serve_port is '70000'"),
        ("vllm_serve_gpu_memory_utilization=1.7", "vllm_serve_gpu_memory_utilization is '1.7'"),
        ("host_prep_nccl_size_mib=16384", "host_prep_nccl_size_mib (16384) must be 1 to 8192"),
        (
            "ray_cluster_min_worker_port=20100",
            "ray_cluster_min_worker_port..ray_cluster_max_worker_port",
        ),
        ("vllm_serve_api_key=", "vllm_serve_api_key is empty"),
        ("hybrid_image_keep_builds=0", "hybrid_image_keep_builds is 0; allowed: a whole number"),
    ],
)
def test_a_bad_setting_is_refused_before_any_connection(setting, named):
    rc, output = deploy("-e", setting)
    flat = " ".join(output.split())
    assert rc == 2, output
    assert named in flat, output
    assert "UNREACHABLE" not in output, output
    # The settings play is the last that started: nothing after the failure, not even a header.
    assert plays(output) == ["Check the inventory", SETTINGS_PLAY], plays(output)


def test_good_settings_pass_and_the_first_connection_comes_after():
    rc, output = deploy()
    headers = plays(output)
    assert headers[:3] == [
        "Check the inventory",
        SETTINGS_PLAY,
        "Decide whether this run is a no-op or a converge",
    ]
    settings = output.split(f"PLAY [{SETTINGS_PLAY}]")[1].split("PLAY [")[0]
    assert "fatal:" not in settings and "UNREACHABLE" not in settings, settings
    # The pair cannot be reached here: the run stops at the first play that connects, and no
    # empty play header follows.
    assert rc == 4, output
    assert "UNREACHABLE" in output
    assert len(headers) == 3, headers


def test_the_converge_record_covers_every_roles_prefix():
    """Every role's variables count as settings in what a converge was given (the converge
    role's _converge_setting_names), so a new role cannot be left out of the no-op check."""
    role_vars = yaml.safe_load((ROOT / "roles/converge/vars/main.yml").read_text())
    pattern = role_vars["_converge_setting_names"].strip()
    prefixes = set(re.match(r"\^\((.*?)\)_", pattern).group(1).split("|"))
    roles = {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()} - {"spark_defaults"}
    assert prefixes == roles | {"spark"}, (prefixes, roles)
