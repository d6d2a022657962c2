# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filter the converge role uses; a thin wrapper over
plugins/module_utils/converge_settings.py (its operation documented in this folder's sidecar
of the same name)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import converge_settings
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def converge_setting_errors(settings, defined=None):
    """What the converge role's settings refuse, as messages naming the variables; an older
    name among ``defined`` is refused naming the variable that replaced it."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"converge settings must be a mapping, got {type(settings)}")
    return converge_settings.setting_errors(dict(settings), [str(n) for n in defined or []])


# The operations of the one filter this role uses, dgx_spark.cluster.converge:
# ``value | dgx_spark.cluster.converge('<operation>', ...)``.
OPERATIONS = {
    "setting_errors": converge_setting_errors,
}


class FilterModule:
    def filters(self):
        return {"converge": role_filter("converge", OPERATIONS)}
