"""A rerun of deploy.yml with nothing to do runs no stage, and anything that moved is seen.

playbooks/in_step.yml compares every node with the record its stages left there
(settings fingerprints, the collection's containers) and asks for one token; in step, every
stage ends at once; otherwise the run starts at the first stage anything moved in.
benchmarks/noop_rerun.py prints what that costs against a ping.
"""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import FROM_HOST_PREP, run_playbook

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
def in_step(deployed_pair):
    """The pair in step (deployed_pair: its in-step check, and the full run that records where
    it was out of step), then deploy.yml, which must find nothing to do."""
    again = run_playbook("deploy.yml")
    assert again.rc == 0, again.failures() or again.raw[-3000:]
    print(f"\ndeploy.yml with nothing to do: {again.seconds:.1f}s")
    return None, again


def test_a_rerun_with_nothing_to_do_runs_no_stage(in_step):
    _first, again = in_step
    assert again.in_step_report().startswith("In step"), again.in_step_report()
    assert again.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, again.changed_tasks()
    assert not ran(again) & set(STAGE_TASKS), ran(again) & set(STAGE_TASKS)
    # It still proved the endpoint answers.
    probes = [r for name, _h, r in again.results() if name == "Ask the pair for one token"]
    assert probes and probes[0]["healthy"] and not probes[0].get("skipped"), probes


def test_a_stage_run_alone_records_what_it_was_given(in_step):
    """host_prep.yml alone with a host_prep setting: host_prep's own record takes the value.
    Given the same value, the in-step check finds only the monitoring stage behind (it loads
    the firewall through host_prep's tasks, so it reads every host_prep setting too); without
    it, host_prep's record names the setting. Running host_prep.yml again with the
    inventory's value puts the record back: in step."""
    setting = "host_prep_peer_wait_s=31"
    alone = run_playbook("playbooks/host_prep.yml", "-e", setting)
    try:
        assert alone.rc == 0, alone.failures() or alone.raw[-3000:]
        assert "Record what this stage was given and left, for host_prep" in ran(alone)
        same = run_playbook("playbooks/in_step.yml", "-e", setting).in_step_report()
        assert same.splitlines() == [
            "Running the stages from monitoring on; those before it have nothing to do:",
            "spark-1: the monitoring stage's inputs changed: host_prep_peer_wait_s",
            "spark-2: the monitoring stage's inputs changed: host_prep_peer_wait_s",
        ], same
        plain = run_playbook("playbooks/in_step.yml").in_step_report()
        assert plain.splitlines() == [
            FROM_HOST_PREP,
            "spark-1: the host_prep stage's inputs changed: host_prep_peer_wait_s",
            "spark-2: the host_prep stage's inputs changed: host_prep_peer_wait_s",
        ], plain
    finally:
        back = run_playbook("playbooks/host_prep.yml")
    assert back.rc == 0, back.failures() or back.raw[-3000:]
    assert run_playbook("playbooks/in_step.yml").in_step_report().startswith("In step")


def test_a_stopped_container_puts_the_pair_out_of_step(in_step, hosts):
    head = hosts["spark-1"]
    head.check_output("sudo docker stop dgx-spark-watchdog")
    try:
        check = run_playbook("playbooks/in_step.yml")
    finally:
        head.check_output("sudo docker start dgx-spark-watchdog")
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    assert "dgx-spark-watchdog: not running" in check.in_step_report(), check.in_step_report()
    # The serving stage starts the watchdog: the run starts there.
    assert check.in_step_report().startswith(
        "Running the stages from serve on; those before it have nothing to do"
    ), check.in_step_report()


@pytest.mark.parametrize(
    ("setting", "said", "start"),
    [
        # Read first by the serving stage: the stages before it have nothing to do.
        ("vllm_serve_max_model_len=256",
         "the serve stage's inputs changed: vllm_serve_max_model_len",
         "Running the stages from serve on"),
        # The firewall opens the serving port: host_prep reads it first, so every stage.
        ("vllm_serve_port=8001",
         "the host_prep stage's inputs changed: vllm_serve_port", FROM_HOST_PREP),
    ],
)  # fmt: skip
def test_a_changed_setting_puts_the_pair_out_of_step(in_step, setting, said, start):
    check = run_playbook("playbooks/in_step.yml", "-e", setting)
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    assert said in check.in_step_report(), check.in_step_report()
    assert check.in_step_report().startswith(start), check.in_step_report()


def test_a_partial_run_is_never_taken_for_in_step(in_step):
    check = run_playbook("deploy.yml", "--tags", "model")
    assert check.rc == 0, check.failures() or check.raw[-3000:]
    assert check.in_step_report() == "Running the stages asked for.", check.in_step_report()
    assert "Describe and check the head's copy" in ran(check), sorted(ran(check))
    # Preflight checked the model stage's settings only, and host_prep's play ended at once.
    assert "Validate the settings of model_cache against its argument spec" in ran(check)
    assert not ran(check) & {
        "Validate the settings of host_prep against its argument spec",
        "Gather the network facts the links are checked against",
    }, sorted(ran(check))
    assert (
        "This run reaches the stages model: checking the settings of model_cache, "
        "deploy_state, operate." in check.messages()
    ), check.messages()[-3000:]


def test_drift_a_rerun_must_see_is_seen_and_repaired(in_step, hosts):
    """Hand edits no container shows: a flushed firewall table, an edited comm.env, a
    retagged serving alias and a weight shard changed in place on the worker (other bytes at
    the same size, so only its modification time tells). The in-step check names each, and
    the full run that follows repairs them and is in step again."""
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

    check = run_playbook("playbooks/in_step.yml")
    said = check.in_step_report()
    for line in (
        "spark-2: nftables table inet dgx_spark: differs since the last run",
        "spark-1: /etc/dgx-spark/comm.env: edited since the last run",
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
    assert again.in_step_report().startswith("In step"), again.in_step_report()
    assert again.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, again.changed_tasks()
    print(f"\ndrift: seen in {check.seconds:.1f}s, repaired by deploy.yml in {repair.seconds:.0f}s")


def rank_env(host) -> list[str]:
    return json.loads(
        host.check_output("sudo docker inspect --format '{{json .Config.Env}}' dgx-spark-ray")
    )


def test_a_file_host_prep_rewrites_is_named_for_the_stages_it_is_handed_to(in_step, hosts):
    """A setting only host_prep reads (host_prep_comm_env_extra) changes comm.env, which the
    Ray containers load at their start. The host_prep stage run alone with it writes the file
    and records its own inputs; the in-step check with the same setting then names the file for
    the ray stage (handed to it) on each node, and nothing for host_prep. No running container
    is touched. host_prep with the inventory's settings writes the file back as the ray stage
    last saw it: in step again. (The whole run, where the ray stage recreates the containers
    with the variable and the serve stage follows: tests/sim/test_container_settings.py, a
    drill.)"""
    extra = ["-e", json.dumps({"host_prep_comm_env_extra": {"NCCL_DEBUG": "WARN"}})]
    envs = {name: rank_env(host) for name, host in hosts.items()}
    try:
        prep = run_playbook("playbooks/host_prep.yml", *extra)
        assert prep.rc == 0, prep.failures() or prep.raw[-3000:]
        for host in hosts.values():
            assert "NCCL_DEBUG=WARN" in host.check_output("sudo cat /etc/dgx-spark/comm.env")
        said = run_playbook("playbooks/in_step.yml", *extra).in_step_report()
        for name in hosts:
            assert f"{name}: /etc/dgx-spark/comm.env: changed since the ray stage last ran" in (
                said
            ), said
        assert "host_prep stage" not in said, said
        assert {name: rank_env(host) for name, host in hosts.items()} == envs
    finally:
        back = run_playbook("playbooks/host_prep.yml")
    assert back.rc == 0, back.failures() or back.raw[-3000:]
    assert run_playbook("playbooks/in_step.yml").in_step_report().startswith("In step")


def test_a_shard_changed_at_its_size_and_time_is_seen_only_by_a_checksum(in_step, hosts):
    """What the record cannot see: a shard changed in place with its size and modification
    time put back (the record keeps those, not the bytes: reading 119 GB on every rerun would
    not take seconds). The rerun's check says in step; the model stage with
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

        check = run_playbook("playbooks/in_step.yml")
        assert check.rc == 0, check.failures() or check.raw[-3000:]
        assert check.in_step_report().startswith("In step"), check.in_step_report()

        verify = run_playbook("playbooks/model.yml", "-e", "model_cache_verify=checksum")
        assert verify.rc != 0, "the checksum run passed a shard whose bytes differ"
        (message,) = verify.failures()
        assert message.startswith("spark-2: "), message
        assert message.endswith(f"SHA-256 differs (1): {SHARD}"), message
    finally:
        worker.check_output(f"sudo cp -p {backup} {MODEL}/{SHARD} && sudo rm -f {backup}")
    assert worker.check_output(f"sudo sha256sum {MODEL}/{SHARD}").split()[0] == good
    assert shard_stat(worker) == before
