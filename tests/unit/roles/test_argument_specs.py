"""Every role documents each default in meta/argument_specs.yml, with the same value; the
roles that preflight validates through an entry point share its options with main."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/defaults/main.yml"))
# Roles that playbooks/preflight.yml enters with tasks_from: validate (no .yml), so Ansible
# checks the spec of their `validate` entry point before the tasks run.
VALIDATED = (
    "host_prep", "hybrid_image", "model_cache", "monitoring", "operate",
    "ray_cluster", "vllm_serve",
)  # fmt: skip
# The settings several roles read keep the inventory's own spark_ names, not their home's.
PREFIX = {"spark_defaults": "spark_"}


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_agree(role):
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    required = {name for name, spec in options.items() if spec.get("required")}
    assert sorted(defaults) == sorted(set(options) - required), "defaults and argument_specs differ"
    assert not required & set(defaults), "a required option must not have a default"
    for name, value in defaults.items():
        prefix = PREFIX.get(role.name, f"{role.name}_")
        assert name.startswith(prefix), f"{name} is not prefixed with {prefix}"
        assert options[name].get("default") == value, f"{name}: default differs"
        assert options[name].get("description"), f"{name} has no description"


def test_every_role_has_argument_specs():
    for role in ROOT.glob("roles/*"):
        assert (role / "meta/argument_specs.yml").exists(), role.name


@pytest.mark.parametrize("name", VALIDATED)
def test_validate_entry_point_shares_the_options_of_main(name):
    role = ROOT / "roles" / name
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
    assert "validate" in specs, f"{name} has no validate entry point"
    assert specs["validate"]["options"] == specs["main"]["options"]
    assert specs["validate"].get("short_description")
    assert (role / "tasks/validate.yml").exists()


@pytest.mark.parametrize("name", VALIDATED)
def test_main_runs_validate_only_when_preflight_did_not(name):
    tasks = ROOT / "roles" / name / "tasks"
    main = yaml.safe_load((tasks / "main.yml").read_text())
    # With the files main.yml imports (operate's main.yml is its status entry point).
    key = "ansible.builtin.import_tasks"
    imported = [task[key] for task in main if key in task]
    text = yaml.safe_dump(main) + "".join((tasks / f).read_text() for f in imported)
    assert "dgx_spark_preflight_done" in text, f"{name}'s main.yml validates a second time"


def test_preflight_enters_the_validate_entry_points_without_extension():
    plays = yaml.safe_load((ROOT / "playbooks/preflight.yml").read_text())
    tasks = plays[0]["tasks"]
    includes = [
        task["ansible.builtin.include_role"]
        for task in tasks
        if "ansible.builtin.include_role" in task
    ]
    assert {include["tasks_from"] for include in includes} == {"validate"}
    # Each role by its own static name: a templated name is compiled again for every task.
    prefix = "dgx_spark.cluster."
    assert all(include["name"].startswith(prefix) for include in includes)
    # Every role's, the converge role's too (its entry point is deploy.yml's, not a stage's).
    names = sorted(include["name"].removeprefix(prefix) for include in includes)
    assert names == sorted((*VALIDATED, "converge"))
    assert not any("{{" in include["name"] for include in includes)
    for include in includes:
        assert "always" in include["apply"]["tags"]
