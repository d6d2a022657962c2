"""plugins/module_utils/deploy_stages.py: which stages a run's tags reach, so which roles
preflight checks; and that its table matches deploy.yml and what each stage's tasks read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import deploy_state as filters
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deploy_stages as ds

ROOT = Path(__file__).resolve().parents[4]
EVERY_STAGE = ["host_prep", "images", "model", "ray", "serve", "monitoring"]
EVERY_ROLE = [
    "host_prep", "hybrid_image", "model_cache", "ray_cluster", "vllm_serve", "monitoring",
    "deploy_state", "operate",
]  # fmt: skip
PREFIX = "dgx_spark.cluster."


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "stages"),
    [
        (["all"], [], EVERY_STAGE),
        ([], [], EVERY_STAGE),
        # Molecule's converge and idempotence skip tags no task carries.
        (["all"], ["molecule-notest", "notest", "molecule-idempotence-notest"], EVERY_STAGE),
        (["serve"], [], ["serve"]),
        (["vllm_serve"], [], ["serve"]),
        (["model", "serve"], [], ["model", "serve"]),
        (["serve", "host_prep"], [], ["host_prep", "serve"]),
        # A role's own tags reach its stage.
        (["host_prep_firewall"], [], ["host_prep"]),
        (["model_cache_verify"], [], ["model"]),
        (["hybrid_image_build", "ray_cluster_run"], [], ["images", "ray"]),
        (["vllm_serve_run"], [], ["serve"]),
        # A stage's tag skipped leaves it out, whatever else reaches it; a role tag skipped
        # leaves the rest of the stage.
        (["all"], ["host_prep"], EVERY_STAGE[1:]),
        (["serve", "ray"], ["serve"], ["ray"]),
        (["all"], ["host_prep_firewall"], EVERY_STAGE),
        # When in doubt, every stage.
        (["always"], [], EVERY_STAGE),
        (["tagged"], [], EVERY_STAGE),
        (["untagged"], [], EVERY_STAGE),
        (["serve", "my_own_tag"], [], EVERY_STAGE),
        (["host_prepare"], [], EVERY_STAGE),
    ],
)
def test_the_stages_a_runs_tags_reach(run_tags, skip_tags, stages):
    assert ds.stages_reached(run_tags, skip_tags) == stages


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "roles"),
    [
        (["all"], [], EVERY_ROLE),
        (["serve"], [], ["model_cache", "ray_cluster", "vllm_serve", "deploy_state", "operate"]),
        (["model"], [], ["model_cache", "deploy_state", "operate"]),
        (["images"], [], ["hybrid_image", "deploy_state", "operate"]),
        (["host_prep_firewall"], [], ["host_prep", "deploy_state", "operate"]),
        (["monitoring"], [], ["host_prep", "monitoring", "deploy_state", "operate"]),
        # host_prep skipped, but the monitoring stage still loads its firewall.
        (["all"], ["host_prep"], EVERY_ROLE),
        (
            ["all"],
            ["host_prep", "monitoring"],
            [r for r in EVERY_ROLE if r not in ("host_prep", "monitoring")],
        ),
        # Nothing reached: the record's and operate's settings still.
        (["serve"], ["serve"], ["deploy_state", "operate"]),
    ],
)
def test_the_roles_preflight_checks(run_tags, skip_tags, roles):
    assert ds.roles_to_validate(run_tags, skip_tags) == roles


def test_the_filters_pass_the_tags_through_and_refuse_a_string():
    assert filters.deploy_stages_reached(["serve"], []) == ["serve"]
    assert filters.deploy_stages_roles(["images"]) == ["hybrid_image", "deploy_state", "operate"]
    with pytest.raises(AnsibleFilterError, match="ansible_run_tags must be a list of tags"):
        filters.deploy_stages_reached("serve")
    with pytest.raises(AnsibleFilterError, match="ansible_skip_tags must be a list"):
        filters.deploy_stages_roles(["serve"], "serve")


def test_the_stages_are_deploy_yml_s_tagged_stages_in_order():
    plays = yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text())
    tagged = [tag for play in plays for tag in play.get("tags", []) if tag != "always"]
    assert tagged == list(ds.STAGES)


def _roles_named(node) -> set[str]:
    """The collection's roles a playbook or task file enters (roles:, include_role,
    import_role), by name."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                found.add(value["name"].removeprefix(PREFIX))
            elif key == "role" and isinstance(value, str):
                found.add(value.removeprefix(PREFIX))
            else:
                found |= _roles_named(value)
    elif isinstance(node, list):
        for item in node:
            found |= _roles_named(item)
    return found


def _roles_entered(role: str) -> set[str]:
    """The roles a role's task files enter, itself included."""
    entered = {role}
    for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        entered |= _roles_named(yaml.safe_load(path.read_text()))
    return entered


@pytest.mark.parametrize("stage", list(ds.STAGES))
def test_each_stage_reads_only_the_roles_its_entry_names(stage):
    """What the stage's playbook enters, and what those roles enter in turn, is in its entry
    of STAGES; else a --tags run of it would reach a role whose settings preflight skipped."""
    plays = yaml.safe_load((ROOT / "playbooks" / f"{stage}.yml").read_text())
    direct = _roles_named(plays)
    entered, new = set(), set(direct)
    while new:
        entered |= new
        new = set().union(*(_roles_entered(role) for role in new)) - entered
    assert direct, stage
    assert ds.STAGES[stage][0] in direct
    assert entered <= set(ds.STAGES[stage]), sorted(entered - set(ds.STAGES[stage]))


def test_every_role_preflight_checks_is_in_the_table():
    plays = yaml.safe_load((ROOT / "playbooks/preflight.yml").read_text())
    checked = [
        task["ansible.builtin.include_role"]["name"].removeprefix(PREFIX)
        for task in plays[0]["tasks"]
        if "ansible.builtin.include_role" in task
    ]
    assert sorted(checked) == sorted(ds.ROLES)


def test_preflight_and_every_stage_guard_ask_the_filters():
    preflight = (ROOT / "playbooks/preflight.yml").read_text()
    assert "dgx_spark.cluster.deploy_stages_roles(ansible_skip_tags)" in preflight
    guard = (ROOT / "playbooks/tasks/in_step_guard.yml").read_text()
    assert "dgx_spark.cluster.deploy_stages_reached(ansible_skip_tags)" in guard
    # monitoring.yml's plays have no guard: deploy.yml enters them only with spark_monitoring.
    for stage in [stage for stage in ds.STAGES if stage != "monitoring"]:
        text = (ROOT / "playbooks" / f"{stage}.yml").read_text()
        assert re.search(rf"deploy_stage: {stage}\b", text), f"{stage}.yml names no stage"
