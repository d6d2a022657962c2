# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the monitoring role uses; thin wrappers over plugins/module_utils/monitoring.py
(the operations of the one filter documented in this folder's sidecar of the same name)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import monitoring
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def _plain(settings):
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"monitoring settings must be a mapping, got {type(settings)}")
    return dict(settings)


def monitoring_setting_errors(settings):
    """Every bad monitoring setting, each naming its variable: a list of messages."""
    return monitoring.setting_errors(_plain(settings))


def monitoring_scrape_config(settings):
    """Prometheus's configuration (prometheus.yml) as data."""
    return monitoring.scrape_config(_plain(settings))


def monitoring_alert_rules(settings):
    """The alert rules file as data."""
    return monitoring.alert_rules(_plain(settings))


# The operations of the one filter this role uses, dgx_spark.cluster.monitoring:
# ``value | dgx_spark.cluster.monitoring('<operation>', ...)``.
OPERATIONS = {
    "setting_errors": monitoring_setting_errors,
    "scrape_config": monitoring_scrape_config,
    "alert_rules": monitoring_alert_rules,
}


class FilterModule:
    def filters(self):
        return {"monitoring": role_filter("monitoring", OPERATIONS)}
