"""plugins/module_utils/converge_settings.py: the converge role's settings, refused by name,
and their older names (the deploy_state role's, the operate role's) refused naming the new
ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils import converge_settings as ds

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/converge/defaults/main.yml").read_text())


def test_the_defaults_pass():
    assert ds.setting_errors(DEFAULTS) == []


def test_strings_from_extra_vars_count_as_their_numbers():
    assert ds.setting_errors({**DEFAULTS, "converge_noop_timeout": "45"}) == []


@pytest.mark.parametrize("value", [0, 601, "soon", True, 1.5])
def test_a_timeout_out_of_range_is_refused_by_name(value):
    assert ds.setting_errors({**DEFAULTS, "converge_noop_timeout": value}) == [
        f"converge_noop_timeout is {value!r}; allowed: whole seconds 1-600"
    ]


@pytest.mark.parametrize(("old", "new"), sorted(ds.RENAMED.items()))
def test_an_older_name_is_refused_naming_the_new_one(old, new):
    (error,) = ds.setting_errors(DEFAULTS, ["operate_status_timeout", old])
    assert error.startswith(f"{old} is no longer read:"), error
    assert f"set {new} instead" in error, error


def test_every_older_name_is_refused_and_other_operate_settings_are_not():
    defined = ["operate_logs_lines", *ds.RENAMED, "operate_benchmark_seed"]
    errors = ds.setting_errors(DEFAULTS, defined)
    assert [e.split()[0] for e in errors] == list(ds.RENAMED)


def test_the_new_names_are_the_roles_settings_and_the_old_ones_are_gone_from_operate():
    assert sorted(set(ds.RENAMED.values())) == sorted(DEFAULTS)
    operate = yaml.safe_load((ROOT / "roles/operate/defaults/main.yml").read_text())
    assert not set(ds.RENAMED) & set(operate)
