"""tools/phases.py: the timed phases of make demo / make test / .ci/run, and the table
read back from a log."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "phases.py"
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
[phase] lint+sanity: 900.0 s (ok, beside the others at the lowest priority)
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
        "  lint+sanity",
    ]
    text = phases.table(rows)
    # 301.2 + 95 + 421 + 1800: the parallel phases, the one beside them at the lowest priority
    # and the sim's steps are shown, not summed.
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


# The child's session, process group and nice value, and its autogroup's where the kernel has
# one (``/autogroup-N nice K``). A process that never left the boot's session (CI's runner,
# session id 0 in its namespace) is in no autogroup: the file is there but empty.
SHOW = (
    "import os; a = open('/proc/self/autogroup').read().split() "
    "if os.path.exists('/proc/self/autogroup') else []; "
    "print(os.getsid(0), os.getpgid(0), os.getpriority(os.PRIO_PROCESS, 0), (a or ['-'])[-1])"
)


def test_the_lowest_priority_runs_in_a_session_of_its_own_shown_beside(tmp_path):
    log = tmp_path / "phases.log"
    env = {"DGX_SPARK_PHASES": str(log), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--lowest-priority", "lint", "--",
         sys.executable, "-c", SHOW],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "[phase] lint: started (beside the others at the lowest priority)"
    sid, pgid, nice, group_nice = lines[1].split()
    # Its own session, led by the command itself: not this test's.
    assert sid == pgid != str(os.getsid(0))
    assert int(nice) == 19
    assert group_nice in ("19", "-"), lines[1]
    assert lines[-1].endswith(" s (ok, beside the others at the lowest priority)")
    assert phases.parse(log.read_text())[0][0] == "  lint"
    # Without the option the command stays in the caller's session, at its priority.
    plain = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "unit", "--", sys.executable, "-c", SHOW],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[1].split()[0] == str(os.getsid(0))


def test_stopping_a_lowest_priority_phase_stops_its_whole_session(tmp_path):
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "run", "--lowest-priority", "long", "--",
         "sh", "-c", f"sleep 300 & echo $! > {marker}; wait"],
        stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()):
        assert time.monotonic() < deadline, "the phase's command did not start"
        time.sleep(0.1)
    sleeper = int(marker.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            break
        stat = Path(f"/proc/{sleeper}/stat")
        # A zombie waiting for its parent is gone too.
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the phase's grandchild {sleeper} outlived the phase")
