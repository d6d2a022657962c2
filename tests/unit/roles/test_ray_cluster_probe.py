"""ray_cluster's probe entry point (tasks/probe.yml) runs a one-off container with the Ray
containers' own settings: every setting of the Ray container (tasks/container.yml) but its
identity and lifecycle is there, with the same value, so a setting added to the ranks reaches
vllm_serve's collective too."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
MODULE = "community.docker.docker_container"
# What makes the probe a one-off of its own rather than the Ray container.
OWN = {"name", "image", "state", "restart", "restart_policy", "entrypoint", "command", "labels",
       "detach", "cleanup", "image_name_mismatch"}  # fmt: skip


def containers(path: Path) -> list[dict]:
    tasks = yaml.safe_load(path.read_text())
    return [t[MODULE] for t in tasks if MODULE in t and t[MODULE].get("state") == "started"]


def test_the_probe_carries_every_rank_setting_of_the_ray_container():
    (ray,) = containers(ROOT / "roles/ray_cluster/tasks/container.yml")
    (probe,) = containers(ROOT / "roles/ray_cluster/tasks/probe.yml")
    shared = {k: v for k, v in ray.items() if k not in OWN}
    assert {"network_mode", "ipc_mode", "env", "env_file", "volumes", "devices"} <= set(shared)
    assert {k: probe.get(k) for k in shared} == shared


def test_the_probe_adds_no_setting_the_ranks_lack():
    (ray,) = containers(ROOT / "roles/ray_cluster/tasks/container.yml")
    (probe,) = containers(ROOT / "roles/ray_cluster/tasks/probe.yml")
    assert set(probe) - set(ray) - OWN == set()
