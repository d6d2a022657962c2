"""A run of deploy.yml is a no-op or a converge, and anything that moved is named.

playbooks/noop.yml (the converge role) compares every node with the record the last converge
left there (the settings themselves, the collection, the containers, images, host files,
weights and firewall table) and asks for one token: a no-op ends every play at once; anything
else converges, every stage idempotent. benchmarks/noop_rerun.py prints what a no-op costs
against a ping.
"""

from __future__ import annotations

import shlex

import pytest
from conftest import CONVERGE, NOOP, converge, run_playbook

STAGE_TASKS = (  # one task of each stage that a full run always runs
    "Validate the settings of host_prep against its argument spec",
    "Start the Ray container",
    "Ask the running pair for one token",
)


def ran(run) -> set[str]:
    return {name for name, _h, r in run.results() if not r.get("skipped")}


MODEL = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
SHARD = "model-00002-of-00002.safetensors"


def shard_stat(host) -> tuple[int, int]:
    """The worker shard's size and modification time (ns): what the record keeps of it."""
    script = f"import os; s = os.stat('{MODEL}/{SHARD}'); print(s.st_size, s.st_mtime_ns)"
    size, mtime = host.check_output(f"sudo python3 -c {shlex.quote(script)}").split()
    return int(size), int(mtime)


def overwrite_middle(host) -> None:
    """Eight bytes in the middle of the shard (its weights, past the header) made other ones:
    the same size, new bytes, a new modification time."""
    script = (
        "import os\n"
        f"p = '{MODEL}/{SHARD}'\n"
        "with open(p, 'r+b') as f:\n"
        "    f.seek(os.path.getsize(p) // 2)\n"
        "    old = f.read(8)\n"
        "    f.seek(-8, 1)\n"
        "    f.write(bytes(b ^ 0xFF for b in old))\n"
    )
    host.check_output(f"sudo python3 -c {shlex.quote(script)}")


@pytest.fixture(scope="module")
def noop(sim, nodes):
    """The pair as a converge leaves it (conftest's converge: a no-op, or a repair of what an
    earlier module left); then deploy.yml, which must be a no-op. That a whole converge changes
    only what a setting moved is test_firewall's (its two converges change the firewall's two
    tasks and the record alone, and touch no rank); molecule's default reruns deploy.yml as a
    no-op, and its verify compares the serving container's start."""
    converge("test_rerun", nodes)
    again = run_playbook("deploy.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
    print(f"\ndeploy.yml with nothing to do: {again.seconds:.1f}s")
    return again


def test_a_rerun_with_nothing_to_do_is_a_no_op_and_restarts_nothing(noop, hosts):
    assert noop.noop_report().startswith(NOOP), noop.noop_report()
    assert noop.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, noop.changed_tasks()
    assert not ran(noop) & set(STAGE_TASKS), ran(noop) & set(STAGE_TASKS)
    # It still proved the endpoint answers.
    probes = [r for name, _h, r in noop.results() if name == "Ask the pair for one token"]
    assert probes and probes[0]["healthy"] and not probes[0].get("skipped"), probes


def test_a_tagged_run_compares_nothing_and_records_nothing(noop, hosts):
    """--tags model: the run reaches the model stage alone, converges it, and leaves the record
    as the last converge wrote it: the next full run is still a no-op."""
    record = "sudo stat -c %Y /var/lib/dgx-spark/converged.json"
    before = {name: host.check_output(record) for name, host in hosts.items()}
    check = run_playbook("deploy.yml", "--tags", "model")
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    assert "this run names --tags or --skip-tags" in check.noop_report(), check.noop_report()
    assert "Describe and check the head's copy" in ran(check), sorted(ran(check))
    # Preflight checked every role's settings; the other stages' plays ended at once.
    assert "Validate the settings of host_prep against its argument spec" in ran(check)
    assert "Write the communication environment file" not in ran(check), sorted(ran(check))
    assert {name: host.check_output(record) for name, host in hosts.items()} == before
    assert run_playbook("playbooks/noop.yml").noop_report().startswith(NOOP)


def test_a_stopped_container_is_named_and_the_run_converges(noop, hosts):
    head = hosts["spark-1"]
    head.check_output("sudo docker stop dgx-spark-watchdog")
    try:
        check = run_playbook("playbooks/noop.yml")
    finally:
        head.check_output("sudo docker start dgx-spark-watchdog")
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    said = check.noop_report()
    assert said.startswith(CONVERGE) and "spark-1: dgx-spark-watchdog: not running" in said, said


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("vllm_serve_watchdog_interval=12", "vllm_serve_watchdog_interval: 10 -> 12"),
        # A role default the inventory does not set: the record has no value of it.
        ("vllm_serve_port=8001", "vllm_serve_port: set to 8001 (not set at the last converge)"),
    ],
)  # fmt: skip
def test_a_changed_setting_is_named_with_its_old_and_new_value(noop, setting, said):
    check = run_playbook("playbooks/noop.yml", "-e", setting)
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    report = check.noop_report()
    assert report.startswith(CONVERGE), report
    assert f"spark-1: {said}" in report.splitlines(), report
    assert f"spark-2: {said}" in report.splitlines(), report


def test_drift_a_rerun_must_see_is_seen_and_repaired(noop, hosts):
    """Hand edits no container shows: a flushed firewall table, an edited comm.env, a
    retagged serving alias and a weight shard changed in place on the worker (other bytes at
    the same size, so only its modification time tells). The no-op check names each, the
    converge that follows repairs them, and the next run is a no-op again."""
    head, worker = hosts["spark-1"], hosts["spark-2"]
    alias = "dgx-spark/vllm-serving:current"
    model, shard = MODEL, SHARD
    size = shard_stat(worker)[0]
    good_alias = worker.check_output(f"sudo docker image inspect --format '{{{{.Id}}}}' {alias}")
    good_shard = head.check_output(f"sudo sha256sum {model}/{shard}").split()[0]
    good_env = head.check_output("sudo cat /etc/dgx-spark/comm.env")
    good_table = worker.check_output("sudo nft -s list table inet dgx_spark")
    assert "reject" in good_table, good_table

    worker.check_output("sudo nft flush table inet dgx_spark")
    head.check_output("sudo sh -c 'echo \"# edited by hand\" >> /etc/dgx-spark/comm.env'")
    worker.check_output(f"sudo docker tag vllm-node:0.14.1-ray2.60.0 {alias}")  # another image
    overwrite_middle(worker)
    assert shard_stat(worker)[0] == size
    assert worker.check_output(f"sudo sha256sum {model}/{shard}").split()[0] != good_shard

    check = run_playbook("playbooks/noop.yml")
    said = check.noop_report()
    assert said.startswith(CONVERGE), said
    for line in (
        "spark-2: nftables table inet dgx_spark: differs since the last converge",
        "spark-1: /etc/dgx-spark/comm.env: edited since the last converge",
        f"spark-2: {alias} is sha256:",
        f"spark-2: /var/lib/dgx-spark/models: tiny-qwen3-moe/{shard} changed",
    ):
        assert line in said, said
    assert f"but dgx-spark-ray runs {good_alias[:19]}" in said, said

    repair = run_playbook("deploy.yml")
    assert repair.rc == 0, repair.failures() or repair.raw[-3000:]
    assert worker.check_output("sudo nft -s list table inet dgx_spark") == good_table
    assert head.check_output("sudo cat /etc/dgx-spark/comm.env") == good_env
    assert worker.check_output(f"sudo docker image inspect --format '{{{{.Id}}}}' {alias}") == (
        good_alias
    )
    assert worker.check_output(f"sudo sha256sum {model}/{shard}").split()[0] == good_shard
    again = run_playbook("deploy.yml")
    assert again.noop_report().startswith(NOOP), again.noop_report()
    assert again.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, again.changed_tasks()
    print(f"\ndrift: seen in {check.seconds:.1f}s, repaired by deploy.yml in {repair.seconds:.0f}s")


def test_a_shard_changed_at_its_size_and_time_is_seen_only_by_a_checksum(noop, hosts):
    """What the record cannot see: a shard changed in place with its size and modification
    time put back (the record keeps those, not the bytes: reading 119 GB on every rerun would
    not take seconds). The rerun's check says no-op; the model stage with
    model_cache_verify=checksum reads every byte and names the file. The shard is put back."""
    head, worker = hosts["spark-1"], hosts["spark-2"]
    good = head.check_output(f"sudo sha256sum {MODEL}/{SHARD}").split()[0]
    before = shard_stat(worker)
    backup = "/var/lib/dgx-spark/test-rerun-shard"
    worker.check_output(f"sudo cp -p {MODEL}/{SHARD} {backup}")
    try:
        overwrite_middle(worker)
        worker.check_output(f"sudo touch -r {backup} {MODEL}/{SHARD}")
        assert shard_stat(worker) == before
        assert worker.check_output(f"sudo sha256sum {MODEL}/{SHARD}").split()[0] != good

        check = run_playbook("playbooks/noop.yml")
        assert check.rc == 0, check.failures() or check.raw[-3000:]
        assert check.noop_report().startswith(NOOP), check.noop_report()

        verify = run_playbook("playbooks/model.yml", "-e", "model_cache_verify=checksum")
        assert verify.rc != 0, "the checksum run passed a shard whose bytes differ"
        (message,) = verify.failures()
        assert message.startswith("spark-2: "), message
        assert message.endswith(f"SHA-256 differs (1): {SHARD}"), message
    finally:
        worker.check_output(f"sudo cp -p {backup} {MODEL}/{SHARD} && sudo rm -f {backup}")
    assert worker.check_output(f"sudo sha256sum {MODEL}/{SHARD}").split()[0] == good
    assert shard_stat(worker) == before
