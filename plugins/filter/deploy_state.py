# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the deploy_state role and deploy.yml's stage plays use; thin wrappers over
plugins/module_utils/deploy_state_settings.py and plugins/plugin_utils/deploy_stages.py
(the operations of the one filter documented in this folder's sidecar of the same name)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deploy_state_settings
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils import deploy_stages
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def deploy_state_setting_errors(settings, defined=None):
    """What the deploy_state role's settings refuse, as messages naming the variables; an old
    operate name among ``defined`` is refused naming the variable that replaced it."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"deploy_state settings must be a mapping, got {type(settings)}")
    return deploy_state_settings.setting_errors(dict(settings), [str(n) for n in defined or []])


def _tags(value, name: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise AnsibleFilterError(f"{name} must be a list of tags, got {type(value).__name__}")
    return [str(tag) for tag in value]


def deploy_stages_reached(run_tags, skip_tags=None, first=""):
    """deploy.yml's stages, in order, whose tasks a run with these tags reaches, from ``first``
    (the in-step check's earliest stage with anything to do) on."""
    return deploy_stages.stages_reached(
        _tags(run_tags, "ansible_run_tags"),
        _tags(skip_tags or [], "ansible_skip_tags"),
        str(first or ""),
    )


def deploy_stages_roles(run_tags, skip_tags=None, first=""):
    """The roles whose settings preflight checks for a run with these tags, from ``first`` on."""
    return deploy_stages.roles_to_validate(
        _tags(run_tags, "ansible_run_tags"),
        _tags(skip_tags or [], "ansible_skip_tags"),
        str(first or ""),
    )


def deploy_stages_earliest(stages):
    """The first of these stage names in deploy.yml's order ('' for none); any name that is no
    stage means every stage, so the first."""
    if isinstance(stages, str) or not isinstance(stages, (list, tuple)):
        raise AnsibleFilterError(
            f"deploy_stages_earliest takes a list of stage names, got {type(stages).__name__}"
        )
    return deploy_stages.earliest(str(stage) for stage in stages if stage)


def deploy_state_fingerprints(settings, common):
    """{stage: inputs} for the stages' records: the digest of each setting the stage reads and
    of ``common`` (the inventory, the collection)."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"the settings must be a mapping, got {type(settings).__name__}")
    return deploy_stages.fingerprints(dict(settings), common)


# The operations of the one filter this role uses, dgx_spark.cluster.deploy_state:
# ``value | dgx_spark.cluster.deploy_state('<operation>', ...)``.
OPERATIONS = {
    "setting_errors": deploy_state_setting_errors,
    "stages_earliest": deploy_stages_earliest,
    "stages_reached": deploy_stages_reached,
    "stages_roles": deploy_stages_roles,
    "fingerprints": deploy_state_fingerprints,
}


class FilterModule:
    def filters(self):
        return {"deploy_state": role_filter("deploy_state", OPERATIONS)}
