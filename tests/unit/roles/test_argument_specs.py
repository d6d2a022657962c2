"""Every role documents each default in meta/argument_specs.yml, with the same value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/defaults/main.yml"))


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_agree(role):
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    required = {name for name, spec in options.items() if spec.get("required")}
    assert sorted(defaults) == sorted(set(options) - required), "defaults and argument_specs differ"
    assert not required & set(defaults), "a required option must not have a default"
    for name, value in defaults.items():
        assert name.startswith(f"{role.name}_"), f"{name} is not prefixed with the role name"
        assert options[name].get("default") == value, f"{name}: default differs"
        assert options[name].get("description"), f"{name} has no description"


def test_every_role_has_argument_specs():
    for role in ROOT.glob("roles/*"):
        assert (role / "meta/argument_specs.yml").exists(), role.name
