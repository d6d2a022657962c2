"""The sim serves as inventories/sparks does, but where the CPU build of vLLM or the sim forces
otherwise: every difference in the serving settings is listed here with its reason, so a new
one fails until someone says why the sim needs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from support.vaulted_yaml import load

ROOT = Path(__file__).resolve().parents[3]
INVENTORIES = ROOT / "inventories"
# What reaches the serving command, the ranks' environment and the weights.
SERVING = re.compile(r"^(vllm_serve_|model_cache_)|^spark_rank_env$|^spark_model_profiles?$")

# Forced by the CPU build of vLLM (the README's "The simulated pair" says more).
CPU_FORCED = {
    "spark_model_profile": "Qwen3.5 needs torchvision, absent there: a tiny Qwen3-MoE stands in",
    "vllm_serve_extra_args": "--enforce-eager: no C++ compiler in the image for torch.compile",
    "spark_rank_env": "VLLM_CPU_KVCACHE_SPACE and TORCHDYNAMO_DISABLE; no CUDA allocator",
}
# Forced by the sim itself: no internet, no vault, tests that should finish.
SIM_ONLY = {
    "spark_model_profiles": "the checkpoints sim-up trains on the controller (no internet)",
    "vllm_serve_api_key": "a real deployment keeps its key in a vault",
    "vllm_serve_health_timeout": "the tiny model loads in seconds",
    "vllm_serve_start_stall_timeout": "no step of the tiny model's start waits a minute",
    "vllm_serve_watchdog_interval": "the drills finish sooner",
}


def group_var_files(inventory: str) -> list[Path]:
    """group_vars/all first, then the groups below it, as Ansible applies them."""
    base = INVENTORIES / inventory / "group_vars"
    return sorted(base.glob("*/*.yml"), key=lambda p: (p.parent.name != "all", str(p)))


def settings(inventory: str) -> dict:
    """The serving settings an inventory ends with: the roles' defaults, then its group_vars."""
    merged: dict = {}
    for path in [*sorted(ROOT.glob("roles/*/defaults/main.yml")), *group_var_files(inventory)]:
        merged.update(load(path) or {})
    return {name: shared(value, merged) for name, value in merged.items() if SERVING.search(name)}


def shared(value, merged: dict):
    """A default derived from a spark_defaults setting this comparison does not name itself
    (vllm_serve_backend: "{{ spark_serving_backend }}") counts as that setting's value."""
    ref = re.fullmatch(r"\{\{ (spark_\w+) \}\}", value) if isinstance(value, str) else None
    return merged[ref.group(1)] if ref and not SERVING.search(ref.group(1)) else value


def differences() -> set[str]:
    sim, sparks = settings("sim"), settings("sparks")
    return {name for name in sim.keys() | sparks.keys() if sim.get(name) != sparks.get(name)}


def test_the_sim_differs_from_the_sparks_only_where_listed():
    listed = CPU_FORCED.keys() | SIM_ONLY.keys()
    found = differences()
    assert not found - listed, (
        f"inventories/sim differs from inventories/sparks in {sorted(found - listed)}: serve as "
        "the Sparks do, or list the setting here with the reason the sim forces it"
    )
    assert not listed - found, f"no longer differs, remove from the list: {sorted(listed - found)}"


@pytest.mark.parametrize("name", sorted(CPU_FORCED.keys() | SIM_ONLY.keys()))
def test_each_difference_has_its_reason_beside_it(name):
    """A comment on the setting's line, or on the line above it, in inventories/sim."""
    for path in group_var_files("sim"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if line.startswith(f"{name}:"):
                above = lines[number - 1] if number else ""
                assert " # " in line or above.startswith("#"), f"{path.name}: {name} says no why"
                return
    assert name in settings("sim"), name  # set by a role's default only: nothing to explain


def test_the_sim_serves_real_weights_with_the_sparks_parsers():
    sim = settings("sim")
    assert not any("load-format" in str(arg) for arg in sim["vllm_serve_extra_args"])
    for name in (
        "vllm_serve_reasoning_parser",
        "vllm_serve_enable_auto_tool_choice",
        "vllm_serve_tool_call_parser",
        "vllm_serve_enable_prefix_caching",
    ):
        assert sim[name] == settings("sparks")[name], name


def container_settings(inventory: str) -> dict:
    merged: dict = {}
    for path in group_var_files(inventory):
        merged.update(load(path) or {})
    return {
        k: v
        for k, v in merged.items()
        if k.startswith("spark_container_")
        and k.endswith(("devices", "capabilities", "ulimits", "device_requests"))
    }


def test_the_sim_applies_the_sparks_container_device_settings():
    """The Ray and serving containers are made with the Sparks' RDMA devices, capabilities and
    the same limits (at values the sim's nodes can grant); only the GPU request is left out,
    which needs NVIDIA's runtime (tests/unit/roles/test_container_gpu_request.py)."""
    sim, sparks = container_settings("sim"), container_settings("sparks")
    assert sim["spark_container_devices"] == sparks["spark_container_devices"]
    assert sim["spark_container_capabilities"] == sparks["spark_container_capabilities"]

    def names(limits):
        return sorted(limit.split(":", 1)[0] for limit in limits)

    assert names(sim["spark_container_ulimits"]) == names(sparks["spark_container_ulimits"])
    assert "spark_container_device_requests" in sparks
    assert "spark_container_device_requests" not in sim


def test_the_vaulted_sudo_password_opens_with_the_sims_vault_password(sim_images):
    """The sim inventory gives the owner's sudo password as the README tells owners to: vaulted
    as ansible_become_password; the sim's vault password opens it to what the nodes were built
    with."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    raw = yaml.safe_load(
        (INVENTORIES / "sim/group_vars/sparks/vault.yml")
        .read_text(encoding="utf-8")
        .replace("!vault |", "|")
    )["ansible_become_password"]
    assert raw.startswith("$ANSIBLE_VAULT;")
    secret = (INVENTORIES / "sim" / "vault-password").read_bytes().strip()
    vault = VaultLib([("default", VaultSecret(secret))])
    assert vault.decrypt(raw).decode() == sim_images.SUDO_PASSWORD
