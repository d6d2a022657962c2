"""plugins/module_utils/monitoring.py: the settings the role refuses, Prometheus's scrape
configuration, the alert rules' thresholds, and the metric names a dashboard's queries read."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils import monitoring

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "roles/monitoring/files/dgx_spark_dashboard.json"
WATCHDOG = ROOT / "roles/vllm_serve/files/dgx_spark_watchdog.py"


def settings(**overrides) -> dict:
    base = {
        "head": "spark-1",
        "nodes": {"spark-1": "198.51.100.11", "spark-2": "198.51.100.12"},
        "prometheus_port": 9090, "node_exporter_port": 9100, "vllm_port": 8000,
        "ray_metrics_port": 52368, "ray_metrics": True, "scrape_interval": "15s",
        "retention_time": "30d", "key_file": "/etc/dgx-spark-monitoring/vllm_api_key",
        "rules_file": "/etc/dgx-spark-monitoring/alerts.yml", "memory_floor_gib": 4,
        "memory_for": "2m", "disk_full_pct": 90, "disk_for": "10m", "kv_cache_pct": 90,
        "kv_cache_for": "5m", "waiting_for": "1m", "endpoint_for": "1m",
        "completion_for": "2m", "ray_for": "1m",
    }  # fmt: skip
    base.update(overrides)
    return base


def test_the_defaults_are_accepted():
    assert monitoring.setting_errors(settings()) == []


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"scrape_interval": "15"}, ["monitoring_scrape_interval", "'15'", "15s, 5m or 15d"]),
        ({"kv_cache_for": "five minutes"}, ["monitoring_alert_kv_cache_for", "duration"]),
        ({"kv_cache_pct": 120}, ["monitoring_alert_kv_cache_pct", "120", "from 1 to 100"]),
        ({"disk_full_pct": "90"}, ["monitoring_alert_disk_full_pct", "'90'"]),
        ({"memory_floor_gib": 0}, ["monitoring_alert_memory_floor_gib", "positive"]),
        ({"node_exporter_port": 70000}, ["monitoring_node_exporter_port", "70000", "1 to 65535"]),
        ({"prometheus_port": 8000}, ["monitoring_prometheus_port", "vllm_serve_port", "differ"]),
        ({"nodes": {"spark-1": "198.51.100.11", "spark-2": ""}}, ["spark-2", "spark_fast_ip"]),
        ({"nodes": {}}, ["no node", "at least one"]),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(overrides, words):
    errors = monitoring.setting_errors(settings(**overrides))
    assert len(errors) == 1, errors
    for word in words:
        assert word in errors[0]


def test_every_bad_setting_is_named_at_once():
    errors = monitoring.setting_errors(settings(kv_cache_pct=0, disk_for="", vllm_port=0))
    assert len(errors) == 3


def test_scrape_config_sends_the_key_from_its_file_and_labels_every_node():
    config = monitoring.scrape_config(settings())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["vllm", "ray", "node"]
    assert jobs["vllm"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/dgx-spark-monitoring/vllm_api_key",
    }
    assert jobs["vllm"]["static_configs"] == [
        {"targets": ["127.0.0.1:8000"], "labels": {"node": "spark-1"}}
    ]
    assert jobs["node"]["static_configs"] == [
        {"targets": ["198.51.100.11:9100"], "labels": {"node": "spark-1"}},
        {"targets": ["198.51.100.12:9100"], "labels": {"node": "spark-2"}},
    ]
    assert [c["targets"] for c in jobs["ray"]["static_configs"]] == [
        ["198.51.100.11:52368"],
        ["198.51.100.12:52368"],
    ]
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == "15s"
    assert config["rule_files"] == ["/etc/dgx-spark-monitoring/alerts.yml"]
    # The key itself is never in the configuration.
    assert "sim-only-key" not in json.dumps(config)


def test_vllms_series_carry_the_model_profile():
    config = monitoring.scrape_config(settings(profile="qwen3.5-122b-a10b-fp8"))
    (vllm,) = [job for job in config["scrape_configs"] if job["job_name"] == "vllm"]
    assert vllm["static_configs"][0]["labels"] == {
        "node": "spark-1", "profile": "qwen3.5-122b-a10b-fp8",
    }  # fmt: skip
    node = [job for job in config["scrape_configs"] if job["job_name"] == "node"][0]
    assert all("profile" not in c["labels"] for c in node["static_configs"])


def test_no_key_no_authorization_and_ray_can_be_left_out():
    config = monitoring.scrape_config(settings(key_file="", ray_metrics=False))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["vllm", "node"]
    assert "authorization" not in jobs["vllm"]
    rules = monitoring.alert_rules(settings(ray_metrics=False))["groups"][0]["rules"]
    assert "RayNodeMissing" not in {r["alert"] for r in rules}


def test_alert_thresholds_come_from_the_settings():
    rules = {
        r["alert"]: r
        for r in monitoring.alert_rules(
            settings(memory_floor_gib=6, disk_full_pct=85, kv_cache_pct=95, kv_cache_for="10m")
        )["groups"][0]["rules"]
    }
    assert set(rules) == set(monitoring.ALERTS)
    assert rules["NodeMemoryLow"]["expr"] == f"node_memory_MemAvailable_bytes < {6 * 2**30}"
    assert rules["NodeDiskNearlyFull"]["expr"].endswith("< 0.15")
    assert rules["KvCacheNearlyFull"]["expr"] == "vllm:kv_cache_usage_perc > 0.95"
    assert rules["KvCacheNearlyFull"]["for"] == "10m"
    assert "< 2 " in rules["RayNodeMissing"]["expr"]
    assert "for" not in rules["WatchdogGaveUp"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "sum(rate(vllm:generation_tokens_total[$__rate_interval]))",
            {"vllm:generation_tokens_total"},
        ),
        (
            "histogram_quantile(0.9, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[1m])))",  # noqa: E501
            {"vllm:inter_token_latency_seconds_bucket"},
        ),
        (
            '1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[1m]))',
            {"node_cpu_seconds_total"},
        ),
        (
            "node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes",
            {"node_memory_MemTotal_bytes", "node_memory_MemAvailable_bytes"},
        ),
        ('up{job="vllm"} == 0 or absent(up{job="ray"} == 1)', {"up"}),
        ("a unless on (node) b offset 5m", {"a", "b"}),
        ('{__name__="vllm:num_requests_waiting", job="vllm"}', {"vllm:num_requests_waiting"}),
    ],
)
def test_metric_names_of_an_expression(expr, names):
    assert monitoring.metric_names(expr) == names


def test_the_dashboard_reads_every_required_panel_from_the_provisioned_source():
    dashboard = json.loads(DASHBOARD.read_text())
    names = monitoring.dashboard_metric_names(dashboard)
    read = set().union(*names.values())
    # Throughput, TTFT and ITL percentiles, running and waiting, KV cache, memory per node.
    for metric in ("vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                   "vllm:inter_token_latency_seconds_bucket", "vllm:num_requests_running",
                   "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "node_memory_MemAvailable_bytes"):  # fmt: skip
        assert metric in read, metric
    assert all(names.values()), [t for t, n in names.items() if not n]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "dgx-spark-prometheus", panel["title"]
    # Each panel's place on the grid is its own.
    places = [tuple(p["gridPos"][k] for k in "xy") for p in dashboard["panels"]]
    assert len(places) == len(set(places))


def test_the_watchdog_writes_its_metrics_for_the_textfile_collector(tmp_path, monkeypatch):
    # On the node the watchdog's module_utils lie beside it (watchdog.yml installs them).
    monkeypatch.syspath_prepend(str(ROOT / "plugins/module_utils"))
    spec = importlib.util.spec_from_file_location("dgx_spark_watchdog_m", WATCHDOG)
    watchdog = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = watchdog
    spec.loader.exec_module(watchdog)
    path = tmp_path / "watchdog.prom"
    watchdog.write_metrics(path, answered=0, starting=0, gave_up=1, restarts=3)
    lines = path.read_text().splitlines()
    assert lines == ["dgx_spark_watchdog_answered 0", "dgx_spark_watchdog_starting 0",
                     "dgx_spark_watchdog_gave_up 1", "dgx_spark_watchdog_restarts 3"]  # fmt: skip
    assert not list(tmp_path.glob("*.tmp"))
    # The names the alert rules read are the ones written.
    rules = yaml.safe_dump(monitoring.alert_rules(settings()))
    for name in ("dgx_spark_watchdog_answered", "dgx_spark_watchdog_starting",
                 "dgx_spark_watchdog_gave_up"):  # fmt: skip
        assert name in rules
