"""benchmarks/phases.py: the timed phases of make demo / make test / .ci/run, and the table
read back from a log."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "phases.py"
spec = importlib.util.spec_from_file_location("phases", SCRIPT)
phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(phases)

LOG = """\
[phase] ci-bootstrap: 301.2 s (ok)
[phase] venv: 95.0 s (ok)
[phase] checks: 300.5 s (ok, within checks+sim-up)
[sim] vllm-donor:0.32.0-cpu: built in 145s
[sim] vllm-donor:0.32.0-cpu: loaded into spark-1, spark-2 in 105s
[phase] sim-up: 420.0 s (ok, within checks+sim-up)
[phase] checks+sim-up: 421.0 s (ok)
[phase] sim-test: 1800.0 s (failed, rc 1)
"""


def test_the_table_sums_only_the_outer_phases():
    rows = phases.parse(LOG)
    assert [name for name, _s, _h in rows] == [
        "ci-bootstrap",
        "venv",
        "  checks",
        "  sim: vllm-donor:0.32.0-cpu (built)",
        "  sim: vllm-donor:0.32.0-cpu (loaded into spark-1, spark-2)",
        "  sim-up",
        "checks+sim-up",
        "sim-test",
    ]
    text = phases.table(rows)
    # 301.2 + 95 + 421 + 1800: the parallel phases and the sim's steps are shown, not summed.
    assert text.splitlines()[-1].split()[-2:] == ["2617.2", "43.6"]
    assert "failed, rc 1" in text


def test_an_empty_log_says_so():
    assert phases.table(phases.parse("no phases here\n")) == "no phases found"


def test_a_phase_is_timed_logged_and_keeps_its_exit_status(tmp_path):
    log = tmp_path / "phases.log"
    env = {"DGX_SPARK_PHASES": str(log), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "demo-step", "--", "sh", "-c", "echo hi; exit 3"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 3
    lines = run.stdout.splitlines()
    assert lines[0] == "[phase] demo-step: started" and lines[1] == "hi"
    assert lines[-1].startswith("[phase] demo-step: ") and lines[-1].endswith(" s (failed, rc 3)")
    # Only the closing line goes to the log; a nested phase names its parent.
    assert log.read_text() == lines[-1] + "\n"
    nested = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "inner", "--", "true"],
        capture_output=True, text=True, check=False,
        env={**env, "DGX_SPARK_PHASE_PARENT": "outer"},
    )  # fmt: skip
    assert nested.stdout.splitlines()[-1].endswith("(ok, within outer)")


def test_begin_empties_the_log_unless_an_outer_script_began_it(tmp_path):
    log = tmp_path / "phases.log"
    log.write_text("[phase] ci-bootstrap: 1.0 s (ok)\n")
    env = {"DGX_SPARK_PHASES": str(log), "PATH": "/usr/bin:/bin"}
    outer = {**env, "DGX_SPARK_PHASES_OUTER": "1"}
    subprocess.run([sys.executable, str(SCRIPT), "begin"], env=outer, check=True)
    assert log.read_text() != ""
    subprocess.run([sys.executable, str(SCRIPT), "begin"], env=env, check=True)
    assert log.read_text() == ""
