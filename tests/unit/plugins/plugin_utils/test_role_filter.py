"""The one filter per role: it runs the named operation, and refuses an unknown one naming
the operations it knows; every role filter's sidecar lists exactly its operations."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter

FILTER_DIR = Path(__file__).resolve().parents[4] / "plugins" / "filter"
ROLES = sorted(p.stem for p in FILTER_DIR.glob("*.py") if p.stem != "__init__")


def test_the_operation_gets_the_value_and_the_arguments():
    run = role_filter("demo", {"pair": lambda value, *args, **kwargs: (value, args, kwargs)})
    assert run("v", "pair", 1, key=2) == ("v", (1,), {"key": 2})
    assert run.__name__ == "demo"


def test_an_unknown_operation_is_refused_naming_the_known_ones():
    run = role_filter("demo", {"b": len, "a": len})
    with pytest.raises(
        AnsibleFilterError, match=r"dgx_spark\.cluster\.demo: no operation 'c'; known: a, b"
    ):
        run("x", "c")


@pytest.mark.parametrize("role", ROLES)
def test_each_role_has_one_filter_whose_sidecar_lists_its_operations(role):
    module = importlib.import_module(f"ansible_collections.dgx_spark.cluster.plugins.filter.{role}")
    assert list(module.FilterModule().filters()) == [role]
    doc = yaml.safe_load((FILTER_DIR / f"{role}.yml").read_text())["DOCUMENTATION"]
    assert doc["options"]["operation"]["choices"] == list(module.OPERATIONS)
    assert "internal" in doc["short_description"]
