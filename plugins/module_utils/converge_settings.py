# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The converge role's settings, checked in preflight: each refusal names its variable and
what is allowed. A setting still set under an older name (the deploy_state role's, before
that the operate role's) is refused naming the new one, so that an inventory's value is never
silently left unread."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils.setting_ranges import (
    range_errors,
)

# Whole-number settings: (lowest, highest, what they count).
WHOLE = {
    "converge_noop_timeout": (1, 600, "seconds"),
}
# Older names of the settings the converge role owns now: old name -> new name.
RENAMED = {
    "operate_deployment_record": "converge_record_file",
    "operate_in_step_timeout": "converge_noop_timeout",
    "deploy_state_record_file": "converge_record_file",
    "deploy_state_in_step_timeout": "converge_noop_timeout",
}


def renamed_errors(defined) -> list[str]:
    """One refusal for each old name among ``defined`` (the names of the run's variables)."""
    return [
        f"{old} is no longer read: deploy.yml's no-op check and converge record belong to the "
        f"converge role now; set {new} instead (and remove {old})"
        for old, new in RENAMED.items()
        if old in set(defined)
    ]


def setting_errors(settings: dict, defined=()) -> list[str]:
    """What the converge role's settings refuse; only the settings present are checked.
    ``defined`` names the variables the run has, to find the older names."""
    return renamed_errors(defined) + range_errors(settings, WHOLE)
