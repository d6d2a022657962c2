"""tools/sim_test_runs.py: the sim tests' Ansible runs, summed by module and by what ran."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("sim_test_runs", ROOT / "tools" / "sim_test_runs.py")
sim_test_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim_test_runs)


def run(test: str, argv: list[str], start: float, seconds: float, tasks: int = 10, rc: int = 0):
    return {"test": test, "phase": "call", "argv": argv, "start": start, "seconds": seconds,
            "rc": rc, "tasks": tasks, "ran": 2 * tasks}  # fmt: skip


def log(*entries: dict) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


def test_the_log_gives_the_last_sessions_start_end_and_runs_and_skips_a_torn_line():
    older = run("test_pair.py::test_a", ["deploy.yml"], 50.0, 5.0)
    first = run("test_upgrade.py::test_b", ["deploy.yml"], 110.0, 30.0)
    second = run("test_upgrade.py::test_b", ["playbooks/noop.yml"], 150.0, 4.0)
    text = (
        log({"session": 0.0}, older, {"ended": 60.0}, {"session": 100.0}, first)
        + '{"test": "test_upgrade.py::test_c", "argv": ["deploy'  # torn by a killed session
        + "\n"
        + log(second)
    )
    assert sim_test_runs.read_log(text) == (100.0, None, [first, second])
    assert sim_test_runs.read_log(text + log({"ended": 200.0}))[1] == 200.0


def test_a_run_is_named_by_its_playbook_and_scope_not_its_settings():
    kind = sim_test_runs.kind
    assert kind(["deploy.yml"]) == "deploy.yml"
    assert kind(["deploy.yml", "-e", "deploy_full=true"]) == "deploy.yml (every stage)"
    assert kind(["deploy.yml", "--tags", "serve", "-e", "vllm_serve_port=8001"]) == (
        "deploy.yml --tags serve"
    )
    assert kind(["playbooks/model.yml", "-e", "model_cache_dir=/srv/m"]) == "playbooks/model.yml"
    # A wrapper the test wrote in its temporary directory: its name, not the path.
    assert kind(["/tmp/pytest-of-root/pytest-3/test_x0/hardware.yml", "--skip-tags", "t"]) == (
        "hardware.yml --skip-tags t"
    )
    assert kind(["sparks", "-m", "ansible.builtin.copy", "-a", "src=a dest=b"]) == (
        "sparks -m ansible.builtin.copy"
    )


def test_the_log_keeps_extra_variables_by_name_but_true_and_false():
    argv = ["deploy.yml", "-e", "vllm_serve_api_key=sk-secret", "-e", "deploy_full=true",
            "--extra-vars", '{"a": 1}', "-e", "@vars.yml", "--tags", "serve"]  # fmt: skip
    assert sim_test_runs.masked(argv) == [
        "deploy.yml", "-e", "vllm_serve_api_key=...", "-e", "deploy_full=true",
        "--extra-vars", "...", "-e", "...", "--tags", "serve",
    ]  # fmt: skip
    assert sim_test_runs.kind(sim_test_runs.masked(argv)) == "deploy.yml --tags serve (every stage)"


def test_the_summary_sums_by_module_and_kind_longest_first_with_the_share_inside_ansible():
    runs = [
        run("test_upgrade.py::test_b", ["deploy.yml"], 110.0, 240.0, tasks=420),
        run("test_upgrade.py::test_b", ["deploy.yml"], 400.0, 8.0, tasks=30),
        run("test_serving.py::test_c", ["deploy.yml", "--tags", "serve"], 500.0, 60.0, tasks=90),
        run("test_pair.py::test_a", ["sparks", "-m", "ansible.builtin.ping"], 600.0, 2.0, 1, rc=2),
    ]
    text = sim_test_runs.summary(100.0, runs, now=1100.0, top=2)
    lines = text.splitlines()
    # 310 s of Ansible in a session of 1000 s; 541 tasks; 1082 results on hosts.
    assert lines[0] == (
        "4 Ansible runs took 310 s of the session's 1000 s (31 %); tasks reached 541, "
        "task results on hosts 1082."
    )
    by_module = lines[lines.index(next(x for x in lines if x.startswith("by test module"))) + 1 :]
    assert by_module[0].split() == ["test_upgrade", "2", "248", "225"]
    assert by_module[1].split() == ["test_serving", "1", "60", "90"]
    by_kind = lines[lines.index(next(x for x in lines if x.startswith("by what ran"))) + 1 :]
    assert by_kind[0].split() == ["deploy.yml", "2", "248", "225"]
    assert by_kind[1].split()[:4] == ["deploy.yml", "--tags", "serve", "1"]
    longest = lines[lines.index("the 2 longest runs:") + 1 :]
    assert len(longest) == 2
    assert longest[0].split()[:2] == ["240", "s"] and "test_upgrade.py::test_b" in longest[0]
    assert "deploy.yml --tags serve, 90 tasks, rc 0" in longest[1]


def test_a_session_shorter_than_its_runs_is_never_below_them_and_no_run_is_said_plainly():
    runs = [run("test_pair.py::test_a", ["deploy.yml"], 100.0, 50.0)]
    # No session line (a log cut at its start): the first run's start stands in; a clock
    # that reads less than the runs add up to still gives at most 100 %.
    assert "took 50 s of the session's 50 s (100 %)" in sim_test_runs.summary(None, runs, 120.0)
    assert sim_test_runs.summary(0.0, [], 10.0) == "No Ansible run is on record for this session."


def test_the_command_line_reads_a_log_and_says_when_there_is_none(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    assert sim_test_runs.main([str(path)]) == 2
    assert "no such log" in capsys.readouterr().err
    path.write_text(
        log(
            {"session": 0.0},
            run("test_pair.py::test_a", ["deploy.yml"], 10.0, 20.0),
            {"ended": 40.0},
        )
    )
    assert sim_test_runs.main([str(path)]) == 0
    assert "1 Ansible runs took 20 s of the session's 40 s (50 %)" in capsys.readouterr().out
