"""playbooks/teardown.yml on the simulated pair: with -e teardown_remove_weights=true every
container the collection made (serving, watchdog, Ray, monitoring) and the weights leave both
nodes, while the images and the host preparation (comm.env) stay. The module takes the pair
as it serves with the inventory's key, whatever its record says (deployed first when it does
not answer).

Then -e teardown_host_prep=true: the nodes first get a netplan file of the owner's at
host_prep's path (as NVIDIA's two-Spark guide has owners write it), a deploy.yml keeps it and
serves again, and the teardown removes what host_prep made (firewall table and file, comm.env,
the /etc/hosts and known_hosts blocks, the keys it generated in authorized_keys), puts the
owner's netplan file back, and keeps the weights, the images and the owner's own lines. A last
deploy.yml brings the pair back serving for the modules after this one."""

from __future__ import annotations

import base64
import hashlib
import subprocess

import pytest
from conftest import _answers, converge, run_playbook
from conftest import playbook_report as playbook
from test_serving import ROTATED

# The host preparation's tear-down and the deploy after it (about four minutes): a drill,
# run by `make test-drills`, not by `make test`.
DRILL = pytest.mark.drill


MODEL_DIR = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
MODEL_ROOT = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
# The weights' stamp of that directory (roles/model_cache/vars/main.yml).
RECORD = (
    "/var/lib/dgx-spark/stamps/weights-tiny-qwen3-moe-"
    f"{hashlib.sha256(MODEL_ROOT.encode()).hexdigest()[:8]}.json"
)
COMM_ENV = "/etc/dgx-spark/comm.env"
SERVING_ALIAS = "dgx-spark/vllm-serving:current"
CONTAINERS = ("dgx-spark-vllm", "dgx-spark-ray")
COMPONENT_LABEL = "dgx_spark.cluster.component"


def failures(report: dict) -> list[str]:
    return [
        f"{host}: {task['task']['name']}: {res.get('msg')}"
        for play in report["plays"]
        for task in play["tasks"]
        for host, res in task["hosts"].items()
        if res.get("failed") or res.get("unreachable")
    ]


def task_names(report: dict) -> set[str]:
    """The tasks that ran on some host (not only skipped)."""
    return {
        task["task"]["name"].split(" : ", 1)[-1]
        for play in report["plays"]
        for task in play["tasks"]
        if any(not res.get("skipped") for res in task["hosts"].values())
    }


def node_state(host) -> dict:
    """What the teardown may and may not remove, read on the node itself."""
    names = host.check_output("sudo docker ps -a --format '{{.Names}}'").split()
    labelled = host.check_output(
        f"sudo docker ps -a --filter label={COMPONENT_LABEL} --format '{{{{.Names}}}}'"
    ).split()
    images = host.check_output("sudo docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}'")
    return {
        "containers": sorted(n for n in names if n in CONTAINERS),
        # Every container the collection made: its label, or its name's prefix.
        "collection": sorted({n for n in names if n.startswith("dgx-spark-")} | set(labelled)),
        "images": sorted(images.splitlines()),
        "model": host.file(MODEL_DIR).exists,
        "record": host.file(RECORD).exists,
        "comm_env": host.check_output(f"sudo sha256sum {COMM_ENV}"),
    }


@pytest.fixture(scope="module")
def answering_pair(sim, nodes):
    """The pair as it serves, whatever its record says (`make test` runs this module last,
    after test_upgrade left its own donor's image serving, under test_serving's rotated key):
    the teardown removes what serves. Where the pair answers neither the inventory's key nor
    the rotated one, deploy.yml converges it."""
    if not (_answers(nodes) or _answers(nodes, ROTATED)):
        converge("test_teardown", nodes)
    return nodes


@pytest.fixture(scope="module")
def teardown(answering_pair, hosts):
    """The serving pair (deployed first when it does not answer), torn down with the weights."""
    before = {name: node_state(host) for name, host in hosts.items()}
    report = playbook("playbooks/teardown.yml", "-e", "teardown_remove_weights=true")
    after = {name: node_state(host) for name, host in hosts.items()}
    return before, report, after


def test_deployment_was_there(teardown):
    before, _report, _after = teardown
    for name, state in before.items():
        assert state["containers"], f"{name}: nothing was serving before the teardown"
        assert state["model"] and state["record"], f"{name}: no weights before the teardown"


def test_teardown_removes_the_weights_without_syncing_them(teardown):
    _before, report, after = teardown
    assert report["rc"] == 0, failures(report)
    for name, state in after.items():
        assert not state["model"], f"{name}: {MODEL_DIR} is still there"
        assert not state["record"], f"{name}: {RECORD} is still there"
    ran = task_names(report)
    assert "Remove the model from the node" in ran
    for fetching in (
        "Copy the local model directory to the head",
        "Push the model from the head to the worker over the fast link",
        "Describe and check the head's copy",
    ):
        assert fetching not in ran, f"the teardown ran '{fetching}'"


def test_teardown_removes_every_container_the_collection_made(teardown):
    before, _report, after = teardown
    # Before: the serving group's watchdog on the head, beside the ranks' containers.
    assert "dgx-spark-watchdog" in before["spark-1"]["collection"], before["spark-1"]
    for name, state in after.items():
        assert state["containers"] == [], f"{name}: {state['containers']} left"
        assert state["collection"] == [], f"{name}: {state['collection']} left"


def test_teardown_keeps_the_images_and_the_host_preparation(teardown):
    before, _report, after = teardown
    for name in before:
        assert after[name]["images"] == before[name]["images"], name
        assert any(line.startswith(SERVING_ALIAS) for line in after[name]["images"]), name
        assert after[name]["comm_env"] == before[name]["comm_env"], name


# --- -e teardown_host_prep=true ---------------------------------------------------------

NETPLAN = "/etc/netplan/40-cx7.yaml"
KEPT = f"{NETPLAN}.dgx-spark-previous"
FIREWALL_FILE = "/etc/dgx-spark/firewall.nft"
HOME = "/home/spark"
# A file of the owner's at host_prep's path, as written by hand before the collection came.
OWNER_NETPLAN = (
    "# written by the owner\n"
    "network:\n  version: 2\n  ethernets:\n    cx7-owner:\n      dhcp4: true\n"
)
OWNER_HOSTS_LINE = "203.0.113.7 owner-box"
OWNER_KNOWN_HOSTS_NAME = "owner-box.example"
GENERATED = "(dgx_spark.cluster)"


def sudo_write(host, path: str, text: str, mode: str, append: bool = False) -> None:
    data = base64.b64encode(text.encode()).decode()
    op = ">>" if append else ">"
    host.check_output(f"echo {data} | base64 -d | sudo sh -c 'cat {op} {path}'")
    if not append:
        host.check_output(f"sudo chmod {mode} {path}")


def drop_lines(host, path: str, words: str) -> None:
    """Rewrite PATH in place without the lines holding WORDS: Docker bind-mounts /etc/hosts
    (a rename fails there), and the deploy user's files keep their owner."""
    host.run(
        f"sudo sh -c \"grep -vF '{words}' {path} > {path}.owner-test; "
        f'cat {path}.owner-test > {path}; rm -f {path}.owner-test"'
    )


def read(host, path: str) -> str | None:
    out = host.run(f"sudo cat {path}")
    return out.stdout if out.rc == 0 else None


def prep_state(host) -> dict:
    """What host_prep made and what the owner had, read on the node."""
    authorized = read(host, f"{HOME}/.ssh/authorized_keys") or ""
    known = read(host, f"{HOME}/.ssh/known_hosts") or ""
    return {
        "netplan": read(host, NETPLAN),
        "kept": read(host, KEPT),
        "table": host.run("sudo nft -s list table inet dgx_spark").rc == 0,
        "firewall_file": host.file(FIREWALL_FILE).exists,
        "comm_env": host.file(COMM_ENV).exists,
        "hosts_block": "dgx_spark.cluster host_prep" in host.file("/etc/hosts").content_string,
        "owner_hosts_line": OWNER_HOSTS_LINE in host.file("/etc/hosts").content_string,
        "known_hosts_block": "dgx_spark.cluster host_prep" in known,
        "owner_known_host": OWNER_KNOWN_HOSTS_NAME in known,
        "generated_keys": [line for line in authorized.splitlines() if line.endswith(GENERATED)],
        "owner_key": "owner@laptop" in authorized,
        "model": host.file(MODEL_DIR).exists and host.file(RECORD).exists,
        "watchdog": "dgx-spark-watchdog"
        in host.check_output("sudo docker ps -a --format '{{.Names}}'"),
    }


@pytest.fixture(scope="module")
def owner_key(tmp_path_factory) -> str:
    """A real public key for the owner's own line in authorized_keys."""
    key = tmp_path_factory.mktemp("owner") / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "owner@laptop", "-f", str(key)],
        check=True,
    )
    return key.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def host_prep_teardown(teardown, hosts, nodes, owner_key):
    """After the teardown above: the owner's netplan file at host_prep's path, a deploy.yml
    that keeps it and serves, the owner's own lines beside host_prep's, then the teardown
    with teardown_host_prep=true (and again, to show it changes nothing the second time)."""
    for host in hosts.values():
        # A run of this module that failed halfway may have left one.
        host.check_output(f"sudo rm -f {KEPT}")
        sudo_write(host, NETPLAN, OWNER_NETPLAN, "600")
    deployed = run_playbook("deploy.yml")
    assert deployed.rc == 0, deployed.failures() or deployed.raw[-4000:]
    assert _answers(nodes), "the pair does not serve after deploy.yml"
    for host in hosts.values():
        sudo_write(host, "/etc/hosts", f"{OWNER_HOSTS_LINE}\n", "644", append=True)
        sudo_write(host, f"{HOME}/.ssh/known_hosts", f"{OWNER_KNOWN_HOSTS_NAME} {owner_key}\n",
                   "644", append=True)  # fmt: skip
        sudo_write(host, f"{HOME}/.ssh/authorized_keys", f"{owner_key}\n", "600", append=True)
    before = {name: prep_state(host) for name, host in hosts.items()}
    report = playbook("playbooks/teardown.yml", "-e", "teardown_host_prep=true")
    after = {name: prep_state(host) for name, host in hosts.items()}
    again = run_playbook("playbooks/teardown.yml", "-e", "teardown_host_prep=true")
    yield before, report, after, again
    for host in hosts.values():
        for path, line in (("/etc/hosts", OWNER_HOSTS_LINE),
                           (f"{HOME}/.ssh/known_hosts", OWNER_KNOWN_HOSTS_NAME),
                           (f"{HOME}/.ssh/authorized_keys", "owner@laptop")):  # fmt: skip
            drop_lines(host, path, line)


@DRILL
def test_host_prep_kept_the_owners_netplan_file_and_made_its_own(host_prep_teardown):
    before, _report, _after, _again = host_prep_teardown
    for name, state in before.items():
        assert state["kept"] == OWNER_NETPLAN, f"{name}: {KEPT} is {state['kept']!r}"
        assert state["netplan"] and "ConnectX-7 twins of" in state["netplan"], name
        for made in ("table", "firewall_file", "comm_env", "hosts_block", "known_hosts_block",
                     "model"):  # fmt: skip
            assert state[made], f"{name}: no {made} before the teardown"
        assert len(state["generated_keys"]) == 2, f"{name}: {state['generated_keys']}"
    # The serving group's watchdog runs on the head (with the Ray executor only there).
    assert before["spark-1"]["watchdog"], before["spark-1"]


@DRILL
def test_teardown_host_prep_removes_what_host_prep_made(host_prep_teardown):
    _before, report, after, _again = host_prep_teardown
    assert report["rc"] == 0, failures(report)
    for name, state in after.items():
        for made in ("table", "firewall_file", "comm_env", "hosts_block", "known_hosts_block",
                     "watchdog"):  # fmt: skip
            assert not state[made], f"{name}: {made} is still there"
        assert state["generated_keys"] == [], f"{name}: {state['generated_keys']}"
    ran = task_names(report)
    assert "Remove the firewall's table" in ran
    messages = [
        str(res.get("msg", ""))
        for play in report["plays"]
        for task in play["tasks"]
        for res in task["hosts"].values()
    ]
    assert any("hardware-only: skipped netplan apply" in m for m in messages), messages


@DRILL
def test_teardown_host_prep_puts_the_owners_netplan_file_back(host_prep_teardown, hosts):
    _before, _report, after, _again = host_prep_teardown
    for name, state in after.items():
        assert state["netplan"] == OWNER_NETPLAN, f"{name}: {NETPLAN} is {state['netplan']!r}"
        assert state["kept"] is None, f"{name}: {KEPT} is still there"
        netplan = hosts[name].file(NETPLAN)
        assert (netplan.user, netplan.mode) == ("root", 0o600), name


@DRILL
def test_teardown_host_prep_keeps_the_weights_and_the_owners_lines(host_prep_teardown):
    _before, _report, after, _again = host_prep_teardown
    for name, state in after.items():
        assert state["model"], f"{name}: the weights went without teardown_remove_weights"
        for own in ("owner_hosts_line", "owner_known_host", "owner_key"):
            assert state[own], f"{name}: the owner's {own} went"


@DRILL
def test_a_second_teardown_host_prep_changes_nothing(host_prep_teardown):
    _before, _report, _after, again = host_prep_teardown
    assert again.rc == 0, again.failures() or again.raw[-4000:]
    changed = {host: n for host, n in again.changed().items() if host != "localhost"}
    assert set(changed.values()) == {0}, again.changed_tasks()


@DRILL
def test_a_deploy_brings_the_pair_back_serving(host_prep_teardown, hosts, nodes):
    """Last in this module: the modules after it need the pair serving."""
    run = run_playbook("deploy.yml")
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    assert _answers(nodes), "the pair does not serve after deploy.yml"
    for name, host in hosts.items():
        state = prep_state(host)
        assert state["table"] and state["comm_env"] and state["hosts_block"], name
        assert len(state["generated_keys"]) == 2, f"{name}: {state['generated_keys']}"
        # The owner's file was back at the path, so host_prep kept it again.
        assert state["kept"] == OWNER_NETPLAN, name
        # As a pair host_prep first prepared: its own file, nothing kept.
        host.check_output(f"sudo rm -f {KEPT}")
