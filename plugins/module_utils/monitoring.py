# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring role's pure logic: Prometheus's scrape configuration, the alert rules, and
the metric names a dashboard's queries read.

Plain data in, plain data out: the role renders the results with to_nice_yaml, the unit tests
check them, and the promtool tests run the rules on series written for each alert.
"""

from __future__ import annotations

import re

# Alert names, one per failure the issue names; promtool's tests cover each.
ALERTS = (
    "ServingEndpointDown",
    "ServingAnswersNoCompletion",
    "RayNodeMissing",
    "WatchdogGaveUp",
    "KvCacheNearlyFull",
    "RequestsWaiting",
    "NodeMemoryLow",
    "NodeDiskNearlyFull",
)

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_JOB = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MonitoringError(ValueError):
    """Settings the role refuses, with the variable named."""


def setting_errors(settings: dict) -> list[str]:
    """Every bad monitoring setting at once, each naming its variable and what is allowed."""
    errors = []
    for name in ("scrape_interval", "retention_time", "endpoint_for", "kv_cache_for",
                 "waiting_for", "memory_for", "disk_for", "ray_for", "completion_for"):  # fmt: skip
        value = str(settings.get(name, ""))
        if not _DURATION.match(value):
            errors.append(
                f"monitoring_{'alert_' if name.endswith('_for') else ''}{name} is {value!r}: "
                "a Prometheus duration such as 15s, 5m or 15d is allowed"
            )
    for name, low, high in (("kv_cache_pct", 1, 100), ("disk_full_pct", 1, 100)):
        value = settings.get(name)
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not low <= value <= high
        ):
            errors.append(f"monitoring_alert_{name} is {value!r}: a number from {low} to {high}")
    floor = settings.get("memory_floor_gib")
    if not isinstance(floor, (int, float)) or isinstance(floor, bool) or floor <= 0:
        errors.append(f"monitoring_alert_memory_floor_gib is {floor!r}: a positive number of GiB")
    nodes = settings.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        errors.append(f"the sparks group holds no node ({nodes!r}): at least one is needed")
    else:
        errors += [
            f"{name}: spark_fast_ip is not set; Prometheus scrapes every node's exporters there"
            for name, address in sorted(nodes.items())
            if not str(address or "").strip()
        ]
    for name in ("prometheus_port", "node_exporter_port", "vllm_port", "ray_metrics_port"):
        value = settings.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            errors.append(f"monitoring_{name} is {value!r}: a TCP port from 1 to 65535")
    ports = [settings.get(n) for n in ("prometheus_port", "node_exporter_port")]
    if ports[0] == ports[1] or settings.get("vllm_port") in ports:
        errors.append(
            "monitoring_prometheus_port, monitoring_node_exporter_port and the serving port "
            f"(vllm_serve_port) must differ, got {ports + [settings.get('vllm_port')]}"
        )
    return errors


def scrape_config(settings: dict) -> dict:
    """prometheus.yml: vLLM on the head (bearer key from a file), Ray's export and the node
    exporter on every node's fast-link address, each target labelled with its node; vLLM's
    with the model profile it serves too (``profile``), where one is given."""

    def targets(port: int) -> list[dict]:
        return [
            {"targets": [f"{address}:{port}"], "labels": {"node": name}}
            for name, address in sorted(settings["nodes"].items())
        ]

    vllm = {
        "job_name": "vllm",
        "metrics_path": "/metrics",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{settings['vllm_port']}"],
                "labels": {"node": settings["head"]}
                | ({"profile": settings["profile"]} if settings.get("profile") else {}),
            }
        ],
    }
    if settings.get("key_file"):
        vllm["authorization"] = {"type": "Bearer", "credentials_file": settings["key_file"]}
    jobs = [vllm]
    if settings.get("ray_metrics", True):
        jobs.append({"job_name": "ray", "static_configs": targets(settings["ray_metrics_port"])})
    jobs.append({"job_name": "node", "static_configs": targets(settings["node_exporter_port"])})
    return {
        "global": {
            "scrape_interval": settings["scrape_interval"],
            "evaluation_interval": settings["scrape_interval"],
            "external_labels": {"cluster": settings.get("cluster", "dgx-spark")},
        },
        "rule_files": [settings["rules_file"]],
        "scrape_configs": jobs,
    }


def alert_rules(settings: dict) -> dict:
    """The alert rules file: one group, each rule's threshold and duration from the settings."""
    floor = int(float(settings["memory_floor_gib"]) * 2**30)
    disk_free = round(1 - float(settings["disk_full_pct"]) / 100, 4)
    kv = round(float(settings["kv_cache_pct"]) / 100, 4)
    fs = settings.get("disk_fstypes", "ext4|xfs|btrfs")
    rules = [
        {
            "alert": "ServingEndpointDown",
            "expr": 'up{job="vllm"} == 0',
            "for": settings["endpoint_for"],
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "The serving endpoint does not answer",
                "description": "Prometheus on the head has not reached vLLM's /metrics for "
                f"{settings['endpoint_for']}: the serving container is down or refuses the key.",
            },
        },
        {
            "alert": "ServingAnswersNoCompletion",
            # Not while a start is in its grace (weights load, compile): the watchdog says so.
            "expr": "dgx_spark_watchdog_answered == 0 unless dgx_spark_watchdog_starting == 1",
            "for": settings["completion_for"],
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "The endpoint answers no completion on {{ $labels.node }}",
                "description": "The watchdog's one-token probe has gone unanswered for "
                f"{settings['completion_for']} (the endpoint may still answer /metrics).",
            },
        },
        {
            "alert": "WatchdogGaveUp",
            "expr": "dgx_spark_watchdog_gave_up == 1",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "The watchdog on {{ $labels.node }} gave up restarting",
                "description": "Restarts did not bring the endpoint back; it no longer restarts "
                "(playbooks/status.yml shows its reason). Rerun the serve stage once the cause "
                "is fixed.",
            },
        },
        {
            "alert": "KvCacheNearlyFull",
            "expr": f"vllm:kv_cache_usage_perc > {kv}",
            "for": settings["kv_cache_for"],
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "KV cache above {:g} % for {}".format(
                    float(settings["kv_cache_pct"]), settings["kv_cache_for"]
                ),
                "description": "Usage is {{ $value | humanizePercentage }}: new requests wait "
                "or running ones are preempted.",
            },
        },
        {
            "alert": "RequestsWaiting",
            "expr": "vllm:num_requests_waiting > 0",
            "for": settings["waiting_for"],
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Requests have waited for {}".format(settings["waiting_for"]),
                "description": "{{ $value }} requests wait and the queue has not emptied "
                f"for {settings['waiting_for']}.",
            },
        },
        {
            "alert": "NodeMemoryLow",
            "expr": f"node_memory_MemAvailable_bytes < {floor}",
            "for": settings["memory_for"],
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.node }} has less than "
                + f"{float(settings['memory_floor_gib']):g} GiB available",
                "description": "{{ $value | humanize1024 }}B available: on unified memory an "
                "exhausted node hard-resets.",
            },
        },
        {
            "alert": "NodeDiskNearlyFull",
            "expr": f'node_filesystem_avail_bytes{{fstype=~"{fs}"}}'
            f' / node_filesystem_size_bytes{{fstype=~"{fs}"}} < {disk_free}',
            "for": settings["disk_for"],
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.mountpoint }} on {{ $labels.node }} is over "
                + f"{float(settings['disk_full_pct']):g} % full",
                "description": "{{ $value | humanizePercentage }} left.",
            },
        },
    ]
    if settings.get("ray_metrics", True):
        nodes = len(settings["nodes"])
        rules.insert(
            2,
            {
                "alert": "RayNodeMissing",
                "expr": f'count(up{{job="ray"}} == 1) < {nodes} or absent(up{{job="ray"}} == 1)',
                "for": settings["ray_for"],
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "A rank's node is missing from Ray",
                    "description": f"Fewer than {nodes} nodes' Ray metrics exports answer: "
                    "a raylet is gone, and with it that node's rank.",
                },
            },
        )
    return {"groups": [{"name": "dgx_spark", "rules": rules}]}


# ---------------------------------------------------------------- dashboards

_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan", "atan2",
}  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels, strings and
    range durations left out; a name given as __name__="x" counted)."""
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    for name, call in _IDENT.findall(text):
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel, rows' panels included."""
    out = []

    def walk(panels):
        for panel in panels or []:
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    out.append((str(panel.get("title", "")), str(target["expr"])))
            walk(panel.get("panels"))

    walk(dashboard.get("panels"))
    return out


def dashboard_metric_names(dashboard: dict) -> dict[str, set[str]]:
    """Each panel's title with the metric names its queries read."""
    names: dict[str, set[str]] = {}
    for title, expr in dashboard_queries(dashboard):
        names.setdefault(title, set()).update(metric_names(expr))
    return names
