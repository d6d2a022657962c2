"""Cluster ports to peers only (host_prep's firewall) on the simulated pair. deploy.yml with
vllm_serve_allowed_sources narrowed to the controller converges naming the setting and touches
no rank: every stage runs, and only the firewall's two tasks and the record change anything.
A container outside the nodes, on both of the sim's networks, is then refused on
Ray's ports and on the serving port; the peer and SSH get through; a worker's Ray that starts
again joins the head through the firewall and the pair serves again (a drill: every deploy
forms Ray through the firewall already); a rerun of the host_prep stage changes nothing;
the host_prep stage with the default (the management network) lets the outsider reach the
serving port again, and deploy.yml refuses a bad CIDR before any change; and
host_prep_firewall: false removes the table and its files, which a run with it on brings back
as they were. A drill (`make test-drills`)
restarts the worker node: its init loads the table before its Docker starts, so the table is
there before Ray listens, and the outsider is refused again while the pair serves again."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import CONVERGE, NOOP, drills, on_node

INVENTORY = Path(__file__).resolve().parents[2] / "inventories" / "sim"

OUTSIDER = "dgxsim-firewall-outsider"
GCS_PORT = 6379
NODE_MANAGER_PORT = 6380
SERVING_PORT = 8000
TABLE = ("inet", "dgx_spark")
FIREWALL_FILE = "/etc/dgx-spark/firewall.nft"
RECORD = "/var/lib/dgx-spark/converged.json"
# Refused means a TCP reset: the peer's "open" on the same port shows who refused it.
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("unanswered", exc)
"""


def docker(*args: str) -> str:
    proc = subprocess.run(["docker", *args], text=True, capture_output=True, check=False)
    assert proc.returncode == 0, f"docker {' '.join(args[:3])}: {proc.stderr.strip()}"
    return proc.stdout.strip()


def connect(container: str, host: str, port: int) -> str:
    """Opens a TCP connection from inside container: open, refused or unanswered."""
    return docker("exec", container, "python3", "-c", PROBE, host, str(port))


def refused(node, counter: str) -> int:
    """Packets the node's firewall refused under that counter so far."""
    out = docker("exec", node.container, "nft", "list", "counter", "inet", "dgx_spark", counter)
    return int(re.search(r"packets (\d+)", out).group(1))


def completion(node) -> int:
    """Tokens of one completion asked from the controller with the inventory's key."""
    serve = yaml.safe_load((INVENTORY / "group_vars/all/serve.yml").read_text())
    endpoint = drills.endpoint(
        f"http://{node.mgmt_ip}:{SERVING_PORT}", serve["vllm_serve_api_key"], timeout=60
    )
    answer = endpoint.complete(drills.SERVED_MODEL, "spark", max_tokens=2)
    if not answer.ok:
        pytest.fail(f"no completion from {node.mgmt_ip}:{SERVING_PORT}: {answer.reason}")
    return answer.usage["completion_tokens"]


@pytest.fixture(scope="module")
def outsider(sim, images):
    """A container of the outer Docker on the sim's management and fast networks, not a node;
    labelled as the sim's own, so `make sim-down` removes it too if this test cannot."""
    subprocess.run(["docker", "rm", "-f", OUTSIDER], capture_output=True, check=False)
    docker("run", "-d", "--rm", "--name", OUTSIDER, "--label", f"{sim.LABEL}=probe",
           "--network", sim.MGMT_NETWORK, "--entrypoint", "sleep",
           images.NODE_IMAGE, "1800")  # fmt: skip
    try:
        docker("network", "connect", sim.FAST_NETWORK, OUTSIDER)
        yield OUTSIDER
    finally:
        subprocess.run(["docker", "rm", "-f", OUTSIDER], capture_output=True, check=False)


@pytest.fixture(scope="module")
def controller(sim):
    """The controller's address on the management network (the bridge's gateway). Docker
    20.10 records no gateway for a network made without --gateway: it is then the subnet's
    first address, which Docker gives the bridge."""
    config = json.loads(
        docker("network", "inspect", sim.MGMT_NETWORK, "-f", "{{json .IPAM.Config}}")
    )
    gateway = config[0].get("Gateway") or str(ipaddress.ip_network(config[0]["Subnet"])[1])
    assert ipaddress.ip_address(gateway), config
    return gateway


@pytest.fixture(scope="module")
def firewalled(deployed_pair, playbook, outsider, controller):
    """deploy.yml, as an owner runs it, with the serving port narrowed to the controller alone
    (vllm_serve_allowed_sources); afterwards the default put back, whatever happened (restore).
    What the run said, the rank containers and the converge records before it are kept."""
    nodes = deployed_pair
    state = {
        "extra": ["-e", json.dumps({"vllm_serve_allowed_sources": [f"{controller}/32"]})],
        "default": serving_sources(nodes[0]),
        "ranks": rank_containers(nodes),
        "records": {n.name: on_node(n, "cat", RECORD).stdout for n in nodes},
    }
    run = playbook("deploy.yml", *state["extra"])
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    print(f"\ndeploy.yml with the serving port narrowed: {run.seconds:.0f}s")
    state["first"] = run
    yield state
    if not state.get("restored"):
        restore(state, nodes, playbook)


def restore(state, nodes, playbook):
    """The inventory's default back through the host_prep stage, and each node's converge
    record as the converge before the narrowed one wrote it: the narrowed run changed nothing
    else (FIREWALL_ONLY), so the pair is then as that record says, and the next module's no-op
    check finds it so instead of converging the whole pair again. Returns the stage's run."""
    back = playbook("playbooks/host_prep.yml")
    assert back.rc == 0, back.failures() or back.raw[-4000:]
    for node in nodes:
        on_node(node, "sh", "-c", f"cat > {RECORD}", data=state["records"][node.name].encode())
    state["restored"] = True
    return back


def test_a_changed_allowed_sources_reaches_the_firewall_through_deploy(
    firewalled, nodes, controller, playbook
):
    """The run converged naming the setting, the head's table holds the new set, and every
    stage ran idempotent: no rank's container was touched; the same run again is a no-op.
    (First in the module: the drills below restart ranks.)"""
    said = firewalled["first"].noop_report()
    assert said.startswith(CONVERGE), said
    assert "spark-1: vllm_serve_allowed_sources: set to [" in said, said
    assert changed_tasks_by_host(firewalled["first"]) == FIREWALL_ONLY
    ranks = firewalled["ranks"]
    assert rank_containers(nodes) == ranks and len(ranks) == 3, ranks
    assert serving_sources(nodes[0]) == [controller], (serving_sources(nodes[0]), firewalled)
    again = playbook("deploy.yml", *firewalled["extra"])
    assert again.rc == 0, again.failures()
    assert again.noop_report().startswith(NOOP), again.noop_report()
    assert again.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}


def test_every_node_holds_the_table_with_the_other_as_its_peer(firewalled, nodes):
    for node in nodes:
        table = docker("exec", node.container, "nft", "-s", "list", "table", "inet", "dgx_spark")
        assert "policy accept;" in table
        peers = re.search(r"set peers \{[^}]*elements = \{ ([^}]*) \}", table).group(1)
        assert peers.split(", ") == [n.fast_ip for n in nodes if n != node]


def test_an_outsider_is_refused_on_rays_ports_and_the_peer_is_not(firewalled, nodes, outsider):
    head, worker = nodes
    before = refused(head, "refused_cluster")
    assert connect(outsider, head.fast_ip, GCS_PORT) == "refused"
    assert connect(outsider, head.mgmt_ip, GCS_PORT) == "refused"
    assert connect(outsider, worker.fast_ip, NODE_MANAGER_PORT) == "refused"
    assert refused(head, "refused_cluster") >= before + 2
    # The same port from the peer's fast-link address: Ray listens, the firewall let it in.
    assert connect(worker.container, head.fast_ip, GCS_PORT) == "open"
    # The management SSH port stays open to everyone.
    assert connect(outsider, head.mgmt_ip, 22) == "open"


def test_an_outsider_not_in_allowed_sources_is_refused_on_the_serving_port(
    firewalled, nodes, outsider
):
    head = nodes[0]
    before = refused(head, "refused_serving")
    assert connect(outsider, head.mgmt_ip, SERVING_PORT) == "refused"
    assert refused(head, "refused_serving") >= before + 1
    # The controller is the allowed source: it is answered.
    assert completion(head) == 2


@pytest.mark.drill
def test_the_nodes_form_ray_and_serve_through_the_firewall(firewalled, nodes):
    """The worker's Ray container dies and starts again: it must join the head's cluster
    through the firewall (GCS, raylet, object manager, workers' ports), and the driver must
    place a rank on it again (TP 2 needs both nodes' GPUs) before the pair serves."""
    result = drills.drill("worker-rank", nodes[0], nodes[1], timeout=300)
    print(f"\nthrough the firewall: {result}")
    assert result["recovered"], result
    assert completion(nodes[0]) == 2


def test_a_rerun_of_the_host_prep_stage_changes_nothing(firewalled, playbook):
    again = playbook("playbooks/host_prep.yml", *firewalled["extra"])
    assert again.rc == 0, again.failures()
    print(f"\nhost_prep rerun: {again.seconds:.0f}s, changed {again.changed()}")
    assert again.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, again.changed_tasks()
    load = "Load the firewall's ruleset, in one transaction"
    loads = [r for name, _h, r in again.results() if name == load]
    assert loads and all(r.get("skipped") for r in loads)


def test_the_default_admits_the_management_network(firewalled, nodes, outsider, playbook):
    """The host_prep stage with the inventory's default: only the firewall changes, and the
    outsider reaches the serving port again (Ray's stay closed); with the records put back the
    pair is as the converge before the narrowed one left it (a no-op); a bad CIDR is then
    refused by deploy.yml before any node is changed."""
    back = restore(firewalled, nodes, playbook)
    assert changed_tasks_by_host(back) == {
        node: [t for t in tasks if "firewall" in t] for node, tasks in FIREWALL_ONLY.items()
    }
    assert playbook("playbooks/noop.yml").noop_report().startswith(NOOP)
    head = nodes[0]
    assert serving_sources(head) == firewalled["default"]
    assert connect(outsider, head.mgmt_ip, SERVING_PORT) == "open"
    assert connect(outsider, head.mgmt_ip, GCS_PORT) == "refused"
    bad = playbook("deploy.yml", "-e", json.dumps({"vllm_serve_allowed_sources": ["10.0.0.0/33"]}))
    assert bad.rc != 0
    assert "vllm_serve_allowed_sources" in "\n".join(bad.failures()), bad.failures()
    assert "10.0.0.0/33" in "\n".join(bad.failures()), bad.failures()
    assert bad.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, bad.changed_tasks()
    assert serving_sources(head) == firewalled["default"]


def live_table(node) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", node.container, "nft", "-s", "list", "table", *TABLE],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_turning_the_firewall_off_removes_its_table_and_files(firewalled, nodes, outsider,
                                                              playbook):  # fmt: skip
    """host_prep_firewall: false takes the table and its files away (nothing half-left), and
    turning it on again brings back the same table."""
    head = nodes[0]
    tables = {n.name: live_table(n).stdout for n in nodes}
    assert all("set peers" in t for t in tables.values()), tables
    try:
        off = playbook("playbooks/host_prep.yml", "--tags", "host_prep_firewall",
                       "-e", "host_prep_firewall=false")  # fmt: skip
        assert off.rc == 0, off.failures()
        for node in nodes:
            assert live_table(node).returncode != 0, (node.name, live_table(node).stdout)
            files = docker("exec", node.container, "sh", "-c", f"ls {FIREWALL_FILE} 2>&1 || true")
            assert "No such file" in files, (node.name, files)
        assert connect(outsider, head.fast_ip, GCS_PORT) == "open"
    finally:
        on = playbook("playbooks/host_prep.yml", "--tags", "host_prep_firewall")
        assert on.rc == 0, on.failures()
    for node in nodes:
        assert live_table(node).stdout == tables[node.name], node.name
    assert connect(outsider, head.fast_ip, GCS_PORT) == "refused"


class NodeWatch(threading.Thread):
    """Looks into a node every few tenths of a second, through the outer Docker: whether the
    firewall's table is loaded and whether Ray's node manager listens. A look that cannot
    run (the node is down) is recorded as such."""

    LOOK = (
        f"nft list table {' '.join(TABLE)} >/dev/null 2>&1 && echo table; "
        f"ss -Hltn 'sport = :{NODE_MANAGER_PORT}' | grep -q . && echo listening; true"
    )

    def __init__(self, node):
        super().__init__(daemon=True)
        self.node = node
        self.looks: list[tuple[float, bool, set[str]]] = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            proc = subprocess.run(["docker", "exec", self.node.container, "sh", "-c", self.LOOK],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            self.looks.append((time.monotonic(), proc.returncode == 0, set(proc.stdout.split())))
            time.sleep(0.2)

    def after_the_restart(self) -> list[set[str]]:
        """What each look saw after the first one that could not run (the node was down)."""
        down = next(i for i, (_t, ran, _seen) in enumerate(self.looks) if not ran)
        return [seen for _t, ran, seen in self.looks[down:] if ran]


@pytest.mark.drill
def test_after_a_node_restart_the_table_is_back_before_ray_listens(firewalled, nodes, outsider):
    head, worker = nodes
    watch = NodeWatch(worker)
    watch.start()
    try:
        result = drills.drill("worker-reboot", head, worker, timeout=600)
    finally:
        watch.halt.set()
        watch.join(timeout=30)
    print(f"\nworker restart through the firewall: {result}")
    assert result["recovered"], result
    assert any(not ran for _t, ran, _seen in watch.looks), "no look found the node down"
    after = watch.after_the_restart()
    assert after, "no look into the node after its restart"
    listening = [i for i, seen in enumerate(after) if "listening" in seen]
    assert listening, f"Ray never listened on {NODE_MANAGER_PORT} in {len(after)} looks"
    # The node's init loads the table first thing (a look may come a moment before it):
    # from then on it stays, and Ray's first listen comes after it.
    tabled = [i for i, seen in enumerate(after) if "table" in seen]
    shown = [sorted(seen) for seen in after[:20]]
    assert tabled and tabled[0] <= listening[0], shown
    assert all("table" in seen for seen in after[tabled[0] :]), shown
    print(f"{len(after)} looks after the restart: the table from look {tabled[0]}, "
          f"Ray listening from look {listening[0]}")  # fmt: skip
    assert connect(outsider, worker.fast_ip, NODE_MANAGER_PORT) == "refused"
    assert connect(outsider, head.fast_ip, GCS_PORT) == "refused"
    assert connect(head.container, worker.fast_ip, NODE_MANAGER_PORT) == "open"
    assert completion(head) == 2


# What a converge whose only change is the serving port's sources changes on each node: every
# other task of every stage runs and changes nothing (this is the suite's proof that a whole
# converge is idempotent; molecule's default scenario reruns deploy.yml as a no-op).
FIREWALL_ONLY = {
    node: [
        "Load the firewall's ruleset, in one transaction",
        "Record what this converge was given and left",
        "Write the firewall's ruleset",
    ]
    for node in ("spark-1", "spark-2")
}


def changed_tasks_by_host(run) -> dict[str, list[str]]:
    """The names of the tasks that changed something, sorted, by host."""
    found: dict[str, set[str]] = {}
    for name, host, result in run.results():
        if result.get("changed"):
            found.setdefault(host, set()).add(name)
    return {host: sorted(names) for host, names in found.items()}


def serving_sources(node) -> list[str]:
    """The elements of the node's serving_sources set, as the live table holds them."""
    table = docker("exec", node.container, "nft", "-s", "list", "table", *TABLE)
    found = re.search(r"set serving_sources \{[^}]*?elements = \{ ([^}]*) \}", table)
    return found.group(1).split(", ") if found else []


def rank_containers(nodes) -> dict[str, str]:
    """The ID of every Ray and serving container on the pair, by node and name."""
    found = {}
    for node in nodes:
        names = docker("exec", node.container, "docker", "ps", "-a", "--format", "{{.Names}}")
        for name in names.split():
            if name in ("dgx-spark-ray", "dgx-spark-vllm"):
                found[f"{node.name}/{name}"] = docker(
                    "exec", node.container, "docker", "inspect", "-f", "{{.Id}}", name
                ).strip()
    return found
