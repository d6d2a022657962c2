"""The alert rules and Prometheus's configuration as the monitoring role renders them, checked
by promtool itself: `promtool test rules` on series written for each alert, and `promtool check`
on the configuration. promtool comes from the sim's monitoring image (Debian's prometheus
package), built here on this machine's Docker when missing; the pair itself is not needed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import _load, sim_common, sim_images, simctl

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "monitoring"
ROLE = ROOT / "roles" / "monitoring"
# Pure logic, loaded from its path as Ansible's filters use it.
monitoring = _load("dgx_spark_monitoring", ROOT / "plugins" / "module_utils" / "monitoring.py")


def role_settings(**overrides) -> dict:
    """The settings validate.yml builds, from the role's defaults, for the sim's two nodes."""
    d = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    settings = {
        "head": "spark-1",
        "nodes": {"spark-1": "172.30.241.11", "spark-2": "172.30.241.12"},
        "prometheus_port": 9090, "node_exporter_port": 9100, "vllm_port": 8000,
        "ray_metrics_port": 52368, "ray_metrics": d["monitoring_ray_metrics"],
        "scrape_interval": d["monitoring_scrape_interval"],
        "retention_time": d["monitoring_retention_time"],
        "key_file": "/etc/dgx-spark-monitoring/vllm_api_key",
        "rules_file": "alerts.yml",
    }  # fmt: skip
    for key, value in d.items():
        if key.startswith("monitoring_alert_"):
            settings[key.removeprefix("monitoring_alert_")] = value
    settings.update(overrides)
    assert monitoring.setting_errors(settings) == []
    return settings


@pytest.fixture(scope="module")
def promtool():
    simctl.monitoring(build_only=True)

    def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sim_common.DOCKER, "run", "--rm", "--network", "none",
             "--label", f"{sim_common.LABEL}=job",
             "-v", f"{workdir}:/t:ro", "-w", "/t", "--entrypoint", "promtool",
             sim_images.MONITORING_IMAGE, *args],
            text=True, capture_output=True, check=False,
        )  # fmt: skip

    return run


def write_rules(workdir: Path, settings: dict) -> None:
    text = yaml.safe_dump(monitoring.alert_rules(settings), sort_keys=False)
    (workdir / "alerts.yml").write_text(text)


def test_every_alert_has_a_promtool_test():
    tests = yaml.safe_load((HERE / "alert_rules_test.yml").read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]
    }
    assert tested == fired == set(monitoring.ALERTS)
    rules = monitoring.alert_rules(role_settings())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == set(monitoring.ALERTS)


def test_alert_rules_pass_promtool_tests(promtool, tmp_path):
    write_rules(tmp_path, role_settings())
    shutil.copy(HERE / "alert_rules_test.yml", tmp_path)
    check = promtool(tmp_path, "check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    proc = promtool(tmp_path, "test", "rules", "alert_rules_test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_changed_threshold_changes_when_the_alert_fires(promtool, tmp_path):
    """The same series with a lower memory floor (2 GiB): 3 GB available no longer alerts, so
    the unchanged test's expectation fails - the rules read the setting, not a constant."""
    write_rules(tmp_path, role_settings(memory_floor_gib=2))
    shutil.copy(HERE / "alert_rules_test.yml", tmp_path)
    proc = promtool(tmp_path, "test", "rules", "alert_rules_test.yml")
    assert proc.returncode != 0
    assert "NodeMemoryLow" in proc.stdout + proc.stderr


def test_prometheus_configuration_passes_promtool_check(promtool, tmp_path):
    settings = role_settings(rules_file="/t/alerts.yml", key_file="/t/vllm_api_key")
    write_rules(tmp_path, settings)
    (tmp_path / "vllm_api_key").write_text("k")
    text = yaml.safe_dump(monitoring.scrape_config(settings), sort_keys=False)
    (tmp_path / "prometheus.yml").write_text(text)
    proc = promtool(tmp_path, "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
