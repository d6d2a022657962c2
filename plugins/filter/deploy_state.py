# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the deploy_state role uses; thin wrappers over
plugins/module_utils/deploy_state_settings.py (documented in the sidecar YAML files next to
this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deploy_state_settings


def deploy_state_setting_errors(settings, defined=None):
    """What the deploy_state role's settings refuse, as messages naming the variables; an old
    operate name among ``defined`` is refused naming the variable that replaced it."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"deploy_state settings must be a mapping, got {type(settings)}")
    return deploy_state_settings.setting_errors(dict(settings), [str(n) for n in defined or []])


class FilterModule:
    def filters(self):
        return {
            "deploy_state_setting_errors": deploy_state_setting_errors,
        }
