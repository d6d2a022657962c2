# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deploy_state role's settings, checked before deploy.yml's in-step check: each refusal
names its variable and what is allowed. The role took deploy.yml's bookkeeping over from the
operate role; a setting still set under its operate name is refused naming the new one, so
that an inventory's value is never silently left unread."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils.setting_ranges import (
    range_errors,
)

# Whole-number settings: (lowest, highest, what they count).
WHOLE = {
    "deploy_state_in_step_timeout": (1, 600, "seconds"),
}
# The operate role's names of the settings deploy_state owns now: old name -> new name.
RENAMED = {
    "operate_deployment_record": "deploy_state_record_file",
    "operate_in_step_timeout": "deploy_state_in_step_timeout",
}


def renamed_errors(defined) -> list[str]:
    """One refusal for each old name among ``defined`` (the names of the run's variables)."""
    return [
        f"{old} is no longer read: deploy.yml's record and in-step check belong to the "
        f"deploy_state role now; set {new} instead (and remove {old})"
        for old, new in RENAMED.items()
        if old in set(defined)
    ]


def setting_errors(settings: dict, defined=()) -> list[str]:
    """What the deploy_state role's settings refuse; only the settings present are checked.
    ``defined`` names the variables the run has, to find the operate role's old names."""
    return renamed_errors(defined) + range_errors(settings, WHOLE)
