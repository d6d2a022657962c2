"""deploy.yml --check --diff runs to the end on the serving pair, says what a real run would
change, and changes nothing (issue #45).

With one serving setting changed (vllm_serve_max_model_len), a real run would restart the
serving group; in check mode the run converges as the real run would, and must get through
every stage (the read-only probes carry check_mode: false), report the changes, and leave each
node as it was: the containers and what they were started with, the images, the files the
collection writes under /etc, its record and stamps, and the firewall table.
"""

from __future__ import annotations

import json

import pytest
from conftest import CONVERGE, NOOP, _answers, on_node, run_playbook

SETTING = "vllm_serve_max_model_len=256"
# What the collection writes on a node that a check-mode run must leave alone. The watchdog's
# state folder is left out: the running watchdog writes it on its own.
PATHS = (
    "/etc/dgx-spark",
    "/etc/netplan",
    "/etc/systemd/system/dgx-spark-firewall.service",
    "/var/lib/dgx-spark/converged.json",
    "/var/lib/dgx-spark/stamps",
    "/var/lib/dgx-spark/vllm",
)
LIST_FILES = (
    "find {paths} -xdev -printf '%y %m %u:%g %p\\n' 2>/dev/null | sort; "
    "find {paths} -xdev -type f -exec sha256sum {{}} + 2>/dev/null | sort"
)


def containers(node) -> dict[str, dict]:
    """Every container on the node: name -> what it runs and was started with."""
    ids = on_node(node, "docker", "ps", "-aq", "--no-trunc").stdout.split()
    found = {}
    for attrs in json.loads(on_node(node, "docker", "inspect", *ids).stdout) if ids else []:
        found[attrs["Name"].lstrip("/")] = {
            "id": attrs["Id"],
            "image": attrs["Image"],
            "env": sorted(attrs["Config"]["Env"] or []),
            "labels": attrs["Config"]["Labels"] or {},
            "cmd": attrs["Config"]["Cmd"],
            "running": attrs["State"]["Running"],
            "started": attrs["State"]["StartedAt"],
            "restarts": attrs["RestartCount"],
        }
    return found


def snapshot(node) -> dict:
    images = on_node(
        node, "docker", "images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"
    ).stdout
    files = on_node(node, "sh", "-c", LIST_FILES.format(paths=" ".join(PATHS))).stdout
    table = on_node(node, "nft", "-s", "list", "table", "inet", "dgx_spark", check=False)
    return {
        "containers": containers(node),
        "images": sorted(images.splitlines()),
        "files": files.splitlines(),
        "firewall": table.stdout if table.returncode == 0 else f"absent: {table.stderr.strip()}",
    }


@pytest.fixture(scope="module")
def checked(deployed_pair):
    """The pair's state, the check-mode run with a changed setting, and the state after."""
    before = {node.name: snapshot(node) for node in deployed_pair}
    run = run_playbook("deploy.yml", "--check", "--diff", "-e", SETTING, timeout=1800)
    after = {node.name: snapshot(node) for node in deployed_pair}
    print(f"\ndeploy.yml --check --diff -e {SETTING}: {run.seconds:.0f}s, changed {run.changed()}")
    return before, run, after


def test_check_mode_runs_to_the_end_and_reports_the_changes(checked):
    _before, run, _after = checked
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    assert not run.failures(), run.failures()
    # The no-op check judges a check run as the real run: it converges, naming the setting.
    said = run.noop_report()
    # The profile gives the context, so the record holds no value of the role's own setting.
    assert said.splitlines()[:2] == [
        CONVERGE,
        "spark-1: vllm_serve_max_model_len: set to 256 (not set at the last converge)",
    ]
    ran = {name for name, _host, res in run.results() if not res.get("skipped")}
    assert "Gather the network facts the links are checked against" in ran, sorted(ran)
    # The serving group would restart with the new setting: the head says so.
    assert run.changed()["spark-1"] > 0, run.changed_tasks()
    changed = {task.split(": ", 1)[1] for task in run.changed_tasks()}
    assert changed & {"Run the serving container", "Write the launcher"}, sorted(changed)
    # Every play ran to its end on both nodes: none was cut short by a failed or unreachable host.
    for node in ("spark-1", "spark-2"):
        assert run.stats[node]["failures"] == 0 and run.stats[node]["unreachable"] == 0, run.stats


def test_check_mode_changes_nothing_on_the_nodes(checked):
    before, _run, after = checked
    for node, state in before.items():
        for part in ("containers", "images", "files", "firewall"):
            assert after[node][part] == state[part], f"{node}: {part} changed in check mode"


def test_the_pair_still_serves_and_the_next_run_is_a_no_op(checked, deployed_pair):
    assert _answers(deployed_pair), "the pair does not answer after the check-mode run"
    again = run_playbook("playbooks/noop.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
    assert again.noop_report().startswith(NOOP), again.noop_report()
