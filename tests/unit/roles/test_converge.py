"""roles/converge, deploy.yml's one decision (no-op or converge): its entry points against
inventories/sparks on a local connection (nothing reaches its addresses), the older names of
its settings refused, and the role reading no other role's files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from support.role_entry import run_entry_point

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "converge"
# The roles whose serving settings (vllm_serve's, hybrid_image's) converge and operate read
# from the inventory or spark_defaults, never from those roles' files.
READERS = ("converge", "operate")


def run(tmp_path, entry, **extra):
    proc = run_entry_point(tmp_path, "converge", entry, "-e", json.dumps(extra))
    return proc, proc.stdout + proc.stderr


def test_the_sparks_inventory_passes_validate(tmp_path):
    proc, out = run(tmp_path, "validate")
    assert proc.returncode == 0, out


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("operate_deployment_record", "/srv/deployed.json", "converge_record_file"),
        ("operate_in_step_timeout", 60, "converge_noop_timeout"),
        ("deploy_state_record_file", "/srv/deployed.json", "converge_record_file"),
        ("deploy_state_in_step_timeout", 60, "converge_noop_timeout"),
    ],
)
def test_an_older_name_is_refused_naming_the_new_one(tmp_path, old, value, new):
    proc, out = run(tmp_path, "validate", **{old: value})
    assert proc.returncode != 0, out
    assert f"{old} is no longer read" in out and f"set {new} instead" in out, out


def test_a_bad_timeout_is_refused_naming_it(tmp_path):
    proc, out = run(tmp_path, "validate", converge_noop_timeout=0)
    assert proc.returncode != 0, out
    assert "converge_noop_timeout is 0; allowed: whole seconds 1-600" in out, out


def test_a_run_with_deploy_full_compares_nothing_and_says_why_it_converges(tmp_path):
    """-e deploy_full=true: no record is read, no token asked, and the guard's fact is false."""
    proc, out = run(tmp_path, "main", deploy_full=True)
    assert proc.returncode == 0, out
    assert "deploy_full is true" in out and "Converge: every stage runs, because" in out, out
    for task in ("Compare each node with the last converge's record",
                 "Ask the pair for one token"):  # fmt: skip
        assert re.search(rf"TASK \[[^]]*{task}\][^\n]*\n(skipping: [^\n]*\n)+", out), out


def test_record_writes_nothing_in_check_mode(tmp_path):
    record = tmp_path / "converged.json"
    given = {"settings": {}, "common": {}}
    extra = {"converge_record_file": str(record), "_converge_given": given}
    proc = run_entry_point(tmp_path, "converge", "record", "--check", "-e", json.dumps(extra))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(
        r"TASK \[[^]]*Record what this converge was given and left\][^\n]*\n(skipping: [^\n]*\n)+",
        out,
    ), out
    assert not record.exists()


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "full"),
    [
        (["all"], [], True),
        # Molecule's converge: tags no task carries, every stage still runs.
        (["all"], ["molecule-notest", "notest"], True),
        # Molecule's idempotence run skips one more, which no task carries either: the rerun
        # is compared with the converge's record (a no-op when nothing moved).
        (["all"], ["molecule-notest", "notest", "molecule-idempotence-notest"], True),
        (["all"], ["molecule-notest", "host_prep"], False),
        (["serve"], [], False),
        (["host_prep_firewall"], [], False),
    ],
)
def test_what_counts_as_a_full_run(run_tags, skip_tags, full):
    """One definition of "nothing skipped but Molecule's tags" that both the no-op check and
    the record read (_converge_full_run)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    facts = {"ansible_run_tags": run_tags, "ansible_skip_tags": skip_tags,
             "_converge_full_run": trust_as_template(role_vars["_converge_full_run"])}  # fmt: skip
    templar = Templar(loader=DataLoader(), variables=facts)
    assert templar.template(trust_as_template("{{ _converge_full_run | bool }}")) is full


def test_deploy_yml_decides_once_and_records_last_and_every_stage_play_obeys_the_guard():
    """noop.yml after the controller judged the settings, the record the last play; every stage play
    and preflight start with the guard, which reads the role's converge_noop; the record is
    written only on a full run, not in check mode, from what the run was given at its start."""
    deploy = yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text())
    imports = [entry.get("ansible.builtin.import_playbook") for entry in deploy]
    assert imports[:4] == ["check_inventory.yml", "settings.yml", "noop.yml", "preflight.yml"]
    last = deploy[-1]
    assert last["tasks"][-1]["ansible.builtin.include_role"]["tasks_from"] == "record"
    assert last["pre_tasks"][0]["ansible.builtin.import_tasks"] == "tasks/noop_guard.yml"
    (guard,) = yaml.safe_load((ROOT / "playbooks/tasks/noop_guard.yml").read_text())
    assert guard["ansible.builtin.meta"] == "end_play"
    assert "converge_noop | default(false) | bool" in guard["when"]
    stages = [entry["tags"][0] for entry in deploy if entry.get("ansible.builtin.import_playbook")
              and entry.get("tags")]  # fmt: skip
    assert stages == ["host_prep", "images", "model", "ray", "serve", "monitoring"]
    assert set(stages) == set(guard["vars"]["_stage_roles"])
    for name in [*stages, "preflight"]:
        for play in yaml.safe_load((ROOT / "playbooks" / f"{name}.yml").read_text()):
            if "hosts" in play and play["hosts"] == "sparks":
                first = play["pre_tasks"][0]
                assert first["ansible.builtin.import_tasks"] == "tasks/noop_guard.yml", name
                assert first.get("vars", {}).get("deploy_stage") == (
                    None if name == "preflight" else name
                )
    (write,) = [t for t in yaml.safe_load((ROLE / "tasks/record.yml").read_text())
                if "dgx_spark.cluster.converge_record" in t]  # fmt: skip
    assert write["when"] == "_converge_full_run | bool and not ansible_check_mode"
    assert write["dgx_spark.cluster.converge_record"]["settings"] == (
        "{{ _converge_given.settings }}"
    )


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
