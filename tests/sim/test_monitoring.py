"""Monitoring on the simulated pair, for real: the monitoring stage (playbooks/monitoring.yml,
which deploy.yml runs with spark_monitoring on) runs Prometheus (Debian's package, from the
sim's monitoring image) on the head and a node exporter on both nodes; load is sent;
Prometheus's API holds vLLM's request and token counters and both nodes' memory; every
dashboard panel reads metrics it holds; the firewall keeps the node exporter to the head;
stopping the serving container fires ServingEndpointDown (timed, a drill). Afterwards the
stage with the inventory's spark_monitoring (false) removes monitoring, and the pair is in
step with the inventory again (the next deploy.yml is a no-op)."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import NOOP, _answers, _load, drills, on_node, run_playbook

ROOT = Path(__file__).resolve().parents[2]
monitoring = _load("dgx_spark_monitoring_sim", ROOT / "plugins" / "module_utils" / "monitoring.py")
SERVE = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/serve.yml").read_text())
SIM_MON = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/monitoring.yml").read_text())
DASHBOARD = json.loads((ROOT / "roles/monitoring/files/dgx_spark_dashboard.json").read_text())
PORT = 9090
ON = ("-e", "spark_monitoring=true")
PROMETHEUS_DATA = "/var/lib/dgx-spark/monitoring/prometheus"
COUNTERS = ("vllm:request_success_total", "vllm:generation_tokens_total")


def prom(head, path: str, **params) -> dict:
    url = f"http://{head.mgmt_ip}:{PORT}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310
        data = json.loads(answer.read())
    assert data["status"] == "success", data
    return data["data"]


def query(head, expr: str) -> list[dict]:
    return prom(head, "/api/v1/query", query=expr)["result"]


def endpoint(head, key: str = SERVE["vllm_serve_api_key"]):
    """The collection's client of the head's endpoint."""
    return drills.endpoint(f"http://{head.mgmt_ip}:8000", key, timeout=120)


def complete(head, prompt: str, max_tokens: int = 16) -> int:
    answer = endpoint(head).complete(drills.SERVED_MODEL, prompt, max_tokens)
    assert answer.ok, answer.reason
    return answer.usage["completion_tokens"]


def wait_for(what: str, check, timeout: float, step: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"{what}: not within {timeout:.0f}s")


@pytest.fixture(scope="module")
def monitored(sim, deployed_pair):
    """The pair serving as the inventory has it (deployed_pair), then monitoring on through its
    own stage:
    playbooks/monitoring.yml, the playbook deploy.yml runs with spark_monitoring true, which
    loads host_prep's table with the monitoring ports before it starts anything. Afterwards
    the same stage with the inventory's spark_monitoring (false) removes it, and the next run
    is a no-op: no container or table rule of the monitoring is left."""
    nodes = deployed_pair
    sim.monitoring(build_only=False)
    run = run_playbook("playbooks/monitoring.yml", *ON)
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    print(f"\nplaybooks/monitoring.yml with spark_monitoring=true: {run.seconds:.0f}s")
    assert _answers(nodes), "the pair does not serve after playbooks/monitoring.yml"
    yield nodes
    # Off as an owner turns it off: the inventory's spark_monitoring (false) and the stage,
    # which removes what the run with it true started and loads host_prep's table without the
    # monitoring ports (deploy.yml runs the same stage last). Prometheus's data stays, as for
    # an owner; the test removes it afterwards.
    off = run_playbook("playbooks/monitoring.yml")
    assert off.rc == 0, off.failures() or off.raw[-4000:]
    for node in nodes:
        names = on_node(node, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert not {"dgx-spark-prometheus", "dgx-spark-node-exporter"} & set(names), node.name
        table = on_node(node, "nft", "list", "table", "inet", "dgx_spark").stdout
        assert "scrapers" not in table and "9100" not in table, node.name
    on_node(nodes[0], "rm", "-rf", PROMETHEUS_DATA)
    check = run_playbook("playbooks/noop.yml")
    assert check.rc == 0 and check.noop_report().startswith(NOOP), check.raw[-3000:]


def test_a_second_run_changes_nothing(monitored):
    run = run_playbook("playbooks/monitoring.yml", *ON)
    assert run.rc == 0, run.failures()
    assert set(run.changed().values()) == {0}, run.changed_tasks()


def test_prometheus_holds_vllms_counters_and_both_nodes_memory(monitored):
    head = monitored[0]
    sent = 12

    def total(name: str) -> float:
        held = query(head, f"sum({name})")
        return float(held[0]["value"][1]) if held else -1.0

    # The counters count since the server started (earlier requests too), and a scrape may
    # land between two of ours: wait until a scrape holds all of this test's requests and
    # tokens over what the counters held before them.
    before = {name: max(total(name), 0.0) for name in COUNTERS}
    tokens = sum(complete(head, f"spark {i}") for i in range(sent))
    assert tokens > 0
    wanted = {"vllm:request_success_total": sent, "vllm:generation_tokens_total": tokens}

    def counted():
        held = {name: total(name) - before[name] for name in COUNTERS}
        return all(held[name] >= wanted[name] for name in COUNTERS) and held

    held = wait_for("vLLM's request and token counters in Prometheus", counted, 60)
    print(f"\nPrometheus counted {held} for {sent} requests and {tokens} tokens")
    assert float(query(head, "sum(vllm:prompt_tokens_total)")[0]["value"][1]) > 0
    memory = {r["metric"]["node"]: float(r["value"][1])
              for r in query(head, "node_memory_MemAvailable_bytes")}  # fmt: skip
    assert set(memory) == {n.name for n in monitored}
    assert all(v > 0 for v in memory.values())
    targets = prom(head, "/api/v1/targets")["activeTargets"]
    health = {(t["labels"]["job"], t["labels"]["node"]): t["health"] for t in targets}
    assert health == {("vllm", head.name): "up", **{("node", n.name): "up" for n in monitored}}


def test_every_dashboard_panel_reads_metrics_prometheus_holds(monitored):
    head = monitored[0]
    held = set(prom(head, "/api/v1/label/__name__/values"))
    missing = {title: sorted(names - held)
               for title, names in monitoring.dashboard_metric_names(DASHBOARD).items()
               if names - held}  # fmt: skip
    assert not missing
    rules = monitoring.alert_rules(
        {**{k: "1m" for k in ("endpoint_for", "completion_for", "kv_cache_for", "waiting_for",
                              "memory_for", "disk_for", "ray_for")},
         "memory_floor_gib": 4, "disk_full_pct": 90, "kv_cache_pct": 90,
         "nodes": {n.name: n.fast_ip for n in monitored}, "ray_metrics": False}
    )  # fmt: skip
    read = set().union(*(monitoring.metric_names(r["expr"]) for r in rules["groups"][0]["rules"]))
    assert not read - held, sorted(read - held)


def test_the_key_stays_root_only_and_out_of_the_configuration(monitored):
    head = monitored[0]
    mode = on_node(head, "stat", "-c", "%a %U", "/etc/dgx-spark/monitoring/vllm_api_key").stdout
    assert mode.split() == ["600", "root"]
    config = on_node(head, "cat", "/etc/dgx-spark/monitoring/prometheus.yml").stdout
    assert "credentials_file" in config and SERVE["vllm_serve_api_key"] not in config
    # /metrics still refuses a request without the key.
    assert endpoint(head, key="").request("/metrics", timeout=10)[0] == 401


def test_the_node_exporter_answers_the_head_only(monitored):
    head, worker = monitored[0], monitored[1]
    # From the head (its fast-link address): answered.
    got = on_node(head, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                  f"http://{worker.fast_ip}:9100/metrics", check=False).stdout  # fmt: skip
    assert got == "200"
    # From this machine, on the same fast network: reset by the firewall.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((worker.fast_ip, 9100), timeout=5).close()
    # Prometheus's port is reachable like the serving port (the management network).
    assert prom(head, "/api/v1/status/buildinfo")["version"]


def test_status_names_prometheus(monitored):
    run = run_playbook("playbooks/status.yml", *ON)
    assert run.rc == 0, run.failures()
    assert f"Prometheus: http://{monitored[0].mgmt_ip}:{PORT}" in run.messages()
    assert "(ready)" in run.messages()


@pytest.mark.drill
def test_stopping_the_endpoint_fires_the_alert(monitored):
    head = monitored[0]
    # Without the watchdog, which would start the container again within seconds.
    on_node(head, "docker", "stop", "dgx-spark-watchdog")
    try:
        stopped = time.monotonic()
        on_node(head, "docker", "stop", "dgx-spark-vllm")

        def firing():
            alerts = prom(head, "/api/v1/alerts")["alerts"]
            return [
                a
                for a in alerts
                if a["labels"]["alertname"] == "ServingEndpointDown" and a["state"] == "firing"
            ]

        alert = wait_for("ServingEndpointDown firing", firing, 240)
        seconds = time.monotonic() - stopped
        print(f"\nendpoint stopped -> ServingEndpointDown firing: {seconds:.0f}s "
              f"(for: 1m, scrape {SIM_MON['monitoring_scrape_interval']})")  # fmt: skip
        assert alert[0]["labels"]["node"] == head.name
        assert 60 <= seconds <= 120
    finally:
        on_node(head, "docker", "start", "dgx-spark-vllm", check=False)
        on_node(head, "docker", "start", "dgx-spark-watchdog", check=False)
        deadline = time.monotonic() + 300
        while not _answers(monitored) and time.monotonic() < deadline:
            time.sleep(5)
        if not _answers(monitored):
            run = run_playbook("deploy.yml")
            assert run.rc == 0, run.failures()
    assert _answers(monitored)


def test_measure_prometheus_memory_and_disk(monitored):
    """For the closing note: Prometheus's memory and its head block's series and samples at the
    sim's scrape interval, and what a day comes to."""
    head = monitored[0]
    tsdb = prom(head, "/api/v1/status/tsdb")["headStats"]
    mem = on_node(head, "docker", "stats", "--no-stream", "--format", "{{.MemUsage}}",
                  "dgx-spark-prometheus").stdout.strip()  # fmt: skip
    disk = on_node(head, "du", "-sb", PROMETHEUS_DATA).stdout.split()[0]
    interval = float(SIM_MON["monitoring_scrape_interval"].rstrip("s"))
    per_day = tsdb["numSeries"] * 86400 / interval
    print(
        f"\nPrometheus: {mem}; {tsdb['numSeries']} series, {disk} bytes on disk now; "
        f"{per_day:.3g} samples/day at {interval:.0f}s (about {per_day * 1.5 / 1e6:.0f} MB/day "
        f"at ~1.5 bytes/sample); at 15 s a third of that"
    )
    # The measure is of what the scrapes brought: at one instant, every live series (alerts'
    # own series aside; the collection records no rules) is one of the samples a target's
    # last scrape kept or one of the five series Prometheus 2.x adds per target (up,
    # scrape_duration_seconds, scrape_samples_scraped, scrape_samples_post_metric_relabeling,
    # scrape_series_added), and the head block holds at least those.
    live = 'count({__name__=~".+", __name__!~"ALERTS|ALERTS_FOR_STATE"})'
    scraped = "sum(scrape_samples_post_metric_relabeling) + 5 * count(up)"
    # vLLM on the head and the node exporter on each node, all up (the alert's drill stopped
    # the endpoint: its target is up again from the first scrape after it serves).
    wait_for("every target up", lambda: len(query(head, "up == 1")) == 3, 60)
    [gap] = query(head, f"{live} - on() ({scraped})")
    assert float(gap["value"][1]) == 0, gap
    [now] = query(head, live)
    held = prom(head, "/api/v1/status/tsdb")["headStats"]["numSeries"]  # read after, not before
    assert held >= int(now["value"][1]) > 0, (held, now)
