"""roles/deploy_state, deploy.yml's bookkeeping: its entry points against inventories/sparks
on a local connection (nothing reaches its addresses), the operate role's old names of its
settings refused, and the role reading no other role's files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from support.role_entry import run_entry_point

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "deploy_state"
# The roles whose serving settings (vllm_serve's, hybrid_image's) deploy_state and operate read
# from the inventory or spark_defaults, never from those roles' files.
READERS = ("deploy_state", "operate")


def run(tmp_path, entry, **extra):
    proc = run_entry_point(tmp_path, "deploy_state", entry, "-e", json.dumps(extra))
    return proc, proc.stdout + proc.stderr


def test_the_sparks_inventory_passes_validate(tmp_path):
    proc, out = run(tmp_path, "validate")
    assert proc.returncode == 0, out


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("operate_deployment_record", "/srv/deployed.json", "deploy_state_record_file"),
        ("operate_in_step_timeout", 60, "deploy_state_in_step_timeout"),
    ],
)
def test_an_old_operate_name_is_refused_naming_the_new_one(tmp_path, old, value, new):
    proc, out = run(tmp_path, "validate", **{old: value})
    assert proc.returncode != 0, out
    assert f"{old} is no longer read" in out and f"set {new} instead" in out, out


def test_a_bad_timeout_is_refused_naming_it(tmp_path):
    proc, out = run(tmp_path, "validate", deploy_state_in_step_timeout=0)
    assert proc.returncode != 0, out
    assert "deploy_state_in_step_timeout is 0; allowed: whole seconds 1-600" in out, out


def test_in_step_refuses_an_old_name_before_it_asks_anything(tmp_path):
    """deploy.yml's in-step check runs before preflight: it validates first."""
    proc, out = run(tmp_path, "in_step", operate_deployment_record="/srv/deployed.json")
    assert proc.returncode != 0, out
    assert "set deploy_state_record_file instead" in out, out
    assert "Fingerprint what this run was given" not in out, out


def test_in_step_on_a_run_that_is_not_full_compares_nothing_and_runs_the_stages(tmp_path):
    """-e deploy_full=true: no record is read, no token asked, and the guard's fact is false."""
    proc, out = run(tmp_path, "in_step", deploy_full=True)
    assert proc.returncode == 0, out
    assert "Running the stages asked for." in out, out
    for task in ("Compare each node with the record its stages wrote",
                 "Ask the pair for one token"):  # fmt: skip
        assert re.search(rf"TASK \[[^]]*{task}\][^\n]*\n(skipping: [^\n]*\n)+", out), out


def test_record_needs_its_stage_and_writes_nothing_in_check_mode(tmp_path):
    """The record entry point is a stage's: without deploy_stage it is refused by its spec; in
    check mode it writes nothing."""
    proc, out = run(tmp_path, "record")
    assert proc.returncode != 0, out
    assert "missing required arguments: deploy_stage" in out, out
    record = tmp_path / "deployed.json"
    proc = run_entry_point(tmp_path, "deploy_state", "record", "--check", "-e",
                           json.dumps({"deploy_stage": "ray",
                                       "deploy_state_record_file": str(record)}))  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(
        r"TASK \[[^]]*Record what this stage was given and left, for ray\][^\n]*\n"
        r"(skipping: [^\n]*\n)+",
        out,
    ), out
    assert not record.exists()


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "check", "full", "whole"),
    [
        (["all"], [], False, True, True),
        # Molecule's converge: tags no task carries, every stage still runs.
        (["all"], ["molecule-notest", "notest"], False, True, True),
        (["all"], ["notest", "vllm_serve"], False, False, False),
        # The stage's own tag reaches all of it (the stage here is serve); another tag does not.
        (["serve"], [], False, False, True),
        (["host_prep_firewall"], [], False, False, False),
        # Check mode is compared as the real run would be; no stage records in check mode.
        (["all"], [], True, True, False),
    ],
)
def test_what_counts_as_a_full_run_and_as_a_whole_stage(run_tags, skip_tags, check, full, whole):
    """One definition of "nothing skipped but Molecule's tags" that both the in-step check
    (_deploy_state_full_run) and a stage's record (_deploy_state_whole_stage) read."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    names = ("_deploy_state_skips_none", "_deploy_state_full_run", "_deploy_state_whole_stage")
    facts = {"ansible_run_tags": run_tags, "ansible_skip_tags": skip_tags,
             "ansible_check_mode": check, "deploy_stage": "serve",
             **{name: trust_as_template(role_vars[name]) for name in names}}  # fmt: skip
    templar = Templar(loader=DataLoader(), variables=facts)
    assert templar.template(trust_as_template("{{ _deploy_state_full_run | bool }}")) is full
    assert templar.template(trust_as_template("{{ _deploy_state_whole_stage | bool }}")) is whole


def test_every_stage_records_itself_at_its_end_and_the_guard_reads_the_roles_fact():
    """The last play of every stage playbook ends with tasks/stage_record.yml for its own
    stage; the guard before every stage reads the in-step fact and fingerprints a stage run
    alone."""
    guard = (ROOT / "playbooks/tasks/in_step_guard.yml").read_text()
    assert "deploy_state_in_step | default(false) | bool" in guard
    assert "tasks_from: fingerprint" in guard
    stages = [
        entry["tags"][0]
        for entry in yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text())
        if entry.get("tags")
    ]
    assert stages == ["host_prep", "images", "model", "ray", "serve", "monitoring"]
    for stage in stages:
        plays = yaml.safe_load((ROOT / "playbooks" / f"{stage}.yml").read_text())
        last = plays[-1]["post_tasks"][-1]
        assert last["ansible.builtin.import_tasks"] == "tasks/stage_record.yml", stage
        assert last["vars"] == {"deploy_stage": stage}
        assert all("post_tasks" not in play for play in plays[:-1]), stage
    (record,) = yaml.safe_load((ROOT / "playbooks/tasks/stage_record.yml").read_text())
    assert record["ansible.builtin.include_role"]["tasks_from"] == "record"
    writes = [t for t in yaml.safe_load((ROLE / "tasks/record.yml").read_text())
              if "dgx_spark.cluster.deployment_state" in t]  # fmt: skip
    assert [t["when"] for t in writes] == ["_deploy_state_whole_stage | bool"]
    facts = [
        t["ansible.builtin.set_fact"]
        for t in yaml.safe_load((ROLE / "tasks/in_step.yml").read_text())
        if "ansible.builtin.set_fact" in t
    ]
    assert any("deploy_state_in_step" in f for f in facts)
    left = yaml.safe_load((ROLE / "vars/main.yml").read_text())["_deploy_state_left"]
    assert list(left) == stages


def test_a_later_stage_asks_again_at_its_turn_only_where_in_step_allows_it():
    """The guard enters the role's gate entry point only in a run in_step.yml gated (a full
    run that started at an earlier stage for a record's difference: not a silent endpoint,
    not check mode), and ends the stage on the gate's answer."""
    guard = yaml.safe_load((ROOT / "playbooks/tasks/in_step_guard.yml").read_text())
    (gate,) = [t for t in guard if t.get("ansible.builtin.include_role", {}).get("tasks_from")
               == "gate"]  # fmt: skip
    assert "deploy_state_gated | default(false) | bool" in gate["when"]
    assert "deploy_stage != deploy_state_first_stage | default('')" in gate["when"]
    ends = [t for t in guard if t.get("ansible.builtin.meta") == "end_play"]
    assert any("deploy_state_stage_in_step" in t["when"] for t in ends)
    assert guard.index(gate) < guard.index(ends[-1])
    (said,) = [
        t["ansible.builtin.set_fact"]
        for t in yaml.safe_load((ROLE / "tasks/in_step.yml").read_text())
        if "deploy_state_gated" in t.get("ansible.builtin.set_fact", {})
    ]
    gated = said["deploy_state_gated"]
    assert "not ansible_check_mode" in gated and "not _silent" in gated
    assert "_deploy_state_in_step is not skipped" in gated
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    assert specs["gate"]["options"]["deploy_stage"]["required"]


def scalars(node) -> list[str]:
    """Every key and scalar of a loaded YAML document, as text (comments are not in it)."""
    if isinstance(node, dict):
        return [text for key, value in node.items() for text in (str(key), *scalars(value))]
    if isinstance(node, list):
        return [text for item in node for text in scalars(item)]
    return [] if node is None else [str(node)]


@pytest.mark.parametrize("role", READERS)
def test_the_bookkeeping_and_operate_read_no_other_roles_files(role):
    """The settings they share with vllm_serve and hybrid_image come from spark_defaults."""
    for path in sorted((ROOT / "roles" / role).glob("*/**/*.yml")):
        rel = path.relative_to(ROOT)
        for text in scalars(yaml.safe_load(path.read_text())):
            assert not re.search(r"role_path\W*/\.\.", text), f"{rel} leaves its role: {text}"
            assert not re.search(r"roles/|/(defaults|vars)/", text), f"{rel} names a file: {text}"
            assert text != "ansible.builtin.include_vars", f"{rel} loads variables from a file"


def test_a_read_of_another_roles_defaults_is_found():
    task = {"ansible.builtin.include_vars": {"file": "{{ role_path }}/../x/defaults/main.yml"}}
    texts = scalars(yaml.safe_load(yaml.safe_dump([{"name": "Read", **task}])))
    assert "ansible.builtin.include_vars" in texts
    assert any(re.search(r"role_path\W*/\.\.", t) for t in texts)
    assert not re.search(r"role_path\W*/\.\.", "{{ role_path ~ '/files/plot.py' }}")
