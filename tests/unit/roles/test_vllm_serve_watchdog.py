"""roles/vllm_serve/files/dgx_spark_watchdog.py: when the head's watchdog restarts or gives up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "roles/vllm_serve/files/dgx_spark_watchdog.py"
# Installed beside the script on the node (watchdog.yml); here, where the collection keeps it.
sys.path.insert(0, str(REPO / "plugins/module_utils"))
_spec = importlib.util.spec_from_file_location("dgx_spark_watchdog", SOURCE)
watchdog = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = watchdog  # dataclasses look their module up there
_spec.loader.exec_module(watchdog)


def watch(**overrides):
    settings = {"failures": 3, "grace": 600, "max_restarts": 2, "window": 1800, **overrides}
    return watchdog.Watch(**settings)


def run(w, probes, started_at=0.0, start=10_000.0, step=30.0):
    """Verdicts of successive probes (True: answered) every ``step`` seconds."""
    return [w.decide(start + i * step, ok, started_at) for i, ok in enumerate(probes)]


def test_three_misses_in_a_row_restart_once():
    assert run(watch(), [True, False, False, False, False]) == [
        "ok", "wait", "wait", "restart", "wait",
    ]  # fmt: skip


def test_an_answer_between_misses_starts_counting_again():
    assert run(watch(), [False, False, True, False, False, False]) == [
        "wait", "wait", "ok", "wait", "wait", "restart",
    ]  # fmt: skip


def test_no_judgement_while_the_group_starts():
    w = watch()
    # Started 100 s before the first probe, grace 600 s: misses do not count yet.
    assert run(w, [False] * 5, started_at=9_900.0) == ["wait"] * 5
    assert w.misses == 0


def test_the_grace_ends_once_the_started_group_has_served():
    w = watch()
    # Started 100 s before the first probe; it answered once, then stopped answering.
    assert run(w, [True, False, False, False], started_at=9_900.0) == [
        "ok", "wait", "wait", "restart",
    ]  # fmt: skip


def test_the_grace_ends_once_the_started_server_is_up():
    w = watch()
    # Started 100 s before the first probe; /health answers but completions never do (a
    # rank froze right after the start): judged at once, not 600 s later.
    verdicts = [w.decide(10_000.0 + i * 30, False, 9_900.0, up=True) for i in range(3)]
    assert verdicts == ["wait", "wait", "restart"]


def test_an_up_server_from_before_the_start_does_not_end_the_grace():
    w = watch()
    assert w.decide(9_800.0, False, 9_000.0, up=True) == "wait"
    # Restarted at 9 900 s; not up again yet: waiting, not counting.
    assert run(w, [False] * 4, started_at=9_900.0) == ["wait"] * 4
    assert w.misses == 1


def test_a_stopped_container_counts_as_missing():
    assert run(watch(), [False, False, False], started_at=None) == ["wait", "wait", "restart"]


def test_it_gives_up_loudly_and_resumes_once_the_pair_serves():
    w = watch(max_restarts=2)
    verdicts = run(w, [False] * 9)
    assert verdicts == ["wait", "wait", "restart", "wait", "wait", "restart",
                        "wait", "wait", "give-up"]  # fmt: skip
    assert w.gave_up == "2 restarts in 1800 s did not bring the endpoint back"
    assert run(w, [False], start=20_000.0) == ["give-up"]
    assert run(w, [True], start=20_030.0) == ["ok"] and w.gave_up == ""


@pytest.mark.parametrize(("window", "expected"), [(100, "restart"), (1800, "give-up")])
def test_old_restarts_leave_the_window(window, expected):
    w = watch(max_restarts=1, window=window)
    assert run(w, [False] * 3) == ["wait", "wait", "restart"]
    assert run(w, [False] * 3, start=10_000.0 + 400) == ["wait", "wait", expected]


def test_it_probes_often_only_while_a_start_has_shown_nothing():
    w = watch()
    assert not w.starting(10_000.0, None)  # not running: no start to watch
    assert w.starting(10_000.0, 9_990.0)  # just started, nothing seen yet
    assert w.decide(10_001.0, False, 9_990.0) == "wait"
    assert w.starting(10_002.0, 9_990.0)
    assert w.decide(10_003.0, True, 9_990.0) == "ok"  # served once: the grace is over
    assert not w.starting(10_004.0, 9_990.0)
    # A later start begins a new grace, even right after the group served.
    assert w.starting(10_010.0, 10_005.0)
    assert not w.starting(10_005.0 + 600.0, 10_005.0)  # the grace ran out


# --------------------------------------------------------------------------- stalls


def test_a_start_that_progresses_keeps_its_grace_past_the_stall_time():
    """Started at 0, stall 900, ceiling 3600: progress every 600 s keeps the grace."""
    w = watch(grace=3600, stall=900)
    verdicts = []
    for now in range(30, 3500, 30):
        w.last_progress = float(now - now % 600)
        verdicts.append(w.decide(float(now), False, 0.0))
    assert set(verdicts) == {"wait"} and w.misses == 0


def test_a_start_without_progress_is_judged_after_the_stall_time():
    w = watch(grace=3600, stall=900)
    w.last_progress = 100.0
    assert w.starting(999.0, 0.0)
    assert not w.starting(1000.0, 0.0)
    assert [w.decide(1000.0 + i * 30, False, 0.0) for i in range(3)] == ["wait", "wait", "restart"]


def test_the_ceiling_ends_the_grace_of_a_start_that_still_progresses():
    w = watch(grace=3600, stall=900)
    w.last_progress = 3590.0
    assert w.starting(3599.0, 0.0)
    assert not w.starting(3600.0, 0.0)


# --------------------------------------------------------------------------- busy, not dead


def test_a_busy_server_is_not_restarted_until_the_bound():
    """The probe waits in a full queue; /metrics shows work: wait, up to busy_limit."""
    w = watch(busy_limit=300)
    verdicts = [w.decide(10_000.0 + i * 30, False, 0.0, busy="6 requests running")
                for i in range(14)]  # fmt: skip
    # Three misses make a restart; busy from the 3rd probe (10 060 s) until 10 360 s.
    assert verdicts == ["wait", "wait"] + ["busy"] * 10 + ["restart", "wait"]
    assert w.restarts == [10_360.0]


def test_a_busy_server_that_answers_again_is_watched_afresh():
    w = watch(busy_limit=300)
    assert run(w, [False] * 3) == ["wait", "wait", "restart"]
    w = watch(busy_limit=300)
    got = [w.decide(10_000.0 + i * 30, ok, 0.0, busy=busy)
           for i, (ok, busy) in enumerate([(False, "x"), (False, "x"), (False, "x"), (True, ""),
                                           (False, "x"), (False, "x"), (False, "x")])]  # fmt: skip
    assert got == ["wait", "wait", "busy", "ok", "wait", "wait", "busy"]
    # The bound counts from the latest busy spell, not the first.
    assert w.busy_since == 10_180.0


def test_a_server_that_stops_working_is_restarted_at_the_next_probe():
    w = watch(busy_limit=600)
    got = [w.decide(10_000.0 + i * 30, False, 0.0, busy=b) for i, b in enumerate(["", "", "x", ""])]
    assert got == ["wait", "wait", "busy", "restart"]


def test_a_frozen_rank_is_restarted_when_it_is_today():
    """No tokens, nothing running, no answer: three misses, as without the metrics."""
    w = watch(busy_limit=600)
    got = [w.decide(10_000.0 + i * 30, False, 0.0, busy="") for i in range(4)]
    assert got == run(watch(), [False] * 4) == ["wait", "wait", "restart", "wait"]


def test_a_container_stopped_on_purpose_stays_stopped():
    w = watch()
    got = [w.decide(10_000.0 + i * 30, False, None, stopped=True) for i in range(6)]
    assert got == ["stopped"] * 6 and w.restarts == []


def _inspect(status, running=False, restarting=False, policy="unless-stopped"):
    return {
        "State": {"Status": status, "Running": running, "Restarting": restarting,
                  "StartedAt": "2026-12-04T10:00:00.123456789Z"},
        "HostConfig": {"RestartPolicy": {"Name": policy}},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (_inspect("running", running=True), (1796378400, False)),
        # docker stop: exited, and the policy does not bring it back.
        (_inspect("exited"), (None, True)),
        (_inspect("exited", policy="always"), (None, True)),
        # A crash under unless-stopped: Docker is restarting it.
        (_inspect("restarting", restarting=True), (None, False)),
        # No policy that restarts: a container that exited is missing, as before.
        (_inspect("exited", policy="no"), (None, False)),
        (_inspect("created"), (None, False)),
        ({}, (None, False)),
    ],
)
def test_the_container_state_read_from_docker_inspect(info, expected):
    assert watchdog.read_state(info) == expected


def test_docker_log_frames_are_joined():
    frame = b"\x01\x00\x00\x00\x00\x00\x00\x04abc\n" + b"\x02\x00\x00\x00\x00\x00\x00\x02d\n"
    assert watchdog.demux(frame) == "abc\nd\n"
    assert watchdog.demux(b"plain text\n") == "plain text\n"


def test_the_command_line_carries_the_stall(monkeypatch, tmp_path):
    seen = {}

    class Stop(Exception):
        pass

    def fake_watch(*args, **kwargs):
        seen.update(kwargs, args=args)
        raise Stop

    monkeypatch.setattr(watchdog, "Watch", fake_watch)
    with pytest.raises(Stop):
        watchdog.main(["--model=m", f"--state={tmp_path}/s.json", "--grace=3600", "--stall=120"])
    assert seen["stall"] == 120.0 and seen["args"][1] == 3600.0


def _installed_beside_the_script() -> list[Path]:
    """The files watchdog.yml copies into the watchdog's directory, read from the task file."""
    import yaml

    tasks = yaml.safe_load((REPO / "roles/vllm_serve/tasks/watchdog.yml").read_text())
    files = []
    for task in tasks:
        copy = task.get("ansible.builtin.copy")
        if not copy:
            continue
        for item in task.get("loop", [None]):
            if "src" in copy:
                src = copy["src"]
                path = Path(src) if "/" in src else REPO / "roles/vllm_serve/files" / src
            else:
                # A module_utils file, by its name: lookup('...module_utils_source', item).
                assert "module_utils_source', item)" in copy["content"], copy
                path = REPO / "plugins/module_utils" / f"{item}.py"
            files.append(path.resolve())
    return files


def _run_installed(tmp_path, args: list[str], leave_out: str = "", code: str = ""):
    """The script (or ``code`` beside it) run by a bare Python from a directory that holds only
    what watchdog.yml installs, less ``leave_out``: no collection on the path (-S leaves
    site-packages out)."""
    import shutil
    import subprocess

    installed = _installed_beside_the_script()
    assert SOURCE.resolve() in installed and len(installed) >= 2, installed
    for path in installed:
        if path.name != leave_out:
            shutil.copy(path, tmp_path / path.name)
    command = ["-c", code] if code else [str(tmp_path / SOURCE.name)]
    return subprocess.run(
        [sys.executable, "-I", "-S", *command, *args],
        capture_output=True, text=True, check=False, cwd=tmp_path, timeout=60,
    )  # fmt: skip


def test_the_script_starts_from_what_the_role_installs(tmp_path):
    """The node runs the script with the image's bare Python from what watchdog.yml installs."""
    got = _run_installed(tmp_path, ["--help"])
    assert got.returncode == 0, got.stderr
    assert "--max-restarts" in got.stdout


@pytest.mark.parametrize(
    "left_out",
    [
        "vllm_start.py",
        "setting_ranges.py",
        "vllm_log.py",
        "vllm_client.py",
        "vllm_health.py",
        "vllm_metrics.py",
    ],
)
def test_without_any_installed_module_the_script_does_not_start(tmp_path, left_out):
    """Each file watchdog.yml installs is needed: the test above fails when one is left out."""
    assert left_out in {path.name for path in _installed_beside_the_script()}
    got = _run_installed(tmp_path, ["--help"], leave_out=left_out)
    assert got.returncode != 0
    assert f"No module named '{left_out.removesuffix('.py')}'" in got.stderr, got.stderr


def test_the_installed_script_asks_the_endpoint_with_the_key(tmp_path):
    """probe() and health() through the installed client, against a stand-in on loopback."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, self.headers.get("Authorization"), raw and json.loads(raw)))
            tokens = 1 if self.headers.get("Authorization") == "Bearer k" else 0
            body = json.dumps({"choices": [{"text": " x"}], "usage": {"completion_tokens": tokens}})
            self.send_response(200 if self.path != "/v1/completions" or tokens else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer  # noqa: N815

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    code = (
        "import sys; sys.path.insert(0, '.'); import dgx_spark_watchdog as w; "
        "print(w.probe(sys.argv[1], 'k', 'm', 5), w.probe(sys.argv[1], 'bad', 'm', 5), "
        "w.health(sys.argv[1], 5), w.health('http://127.0.0.1:9', 5))"
    )
    try:
        got = _run_installed(tmp_path, [url], code=code)
    finally:
        server.shutdown()
        server.server_close()
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["True", "False", "True", "False"]
    body = {"model": "m", "prompt": "ping", "max_tokens": 1, "temperature": 0}
    assert seen == [("/v1/completions", "Bearer k", body), ("/v1/completions", "Bearer bad", body),
                    ("/health", None, b"")]  # fmt: skip


def test_sigterm_ends_the_watchdog_at_once(tmp_path):
    """`docker stop` sends SIGTERM to the script, its container's PID 1: it must end then, not
    after Docker's 10 s. The script runs its loop until signalled, against a stand-in Docker
    socket that knows no container and an endpoint that is not there."""
    import shutil
    import signal
    import socketserver
    import subprocess
    import threading
    import time
    from http.server import BaseHTTPRequestHandler

    class NoContainer(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def address_string(self):
            return "docker.sock"

    docker = socketserver.ThreadingUnixStreamServer(str(tmp_path / "docker.sock"), NoContainer)
    threading.Thread(target=docker.serve_forever, args=(0.05,), daemon=True).start()
    for path in _installed_beside_the_script():
        shutil.copy(path, tmp_path / path.name)
    argv = [sys.executable, "-I", "-S", str(tmp_path / SOURCE.name), "--model", "m",
            "--state", str(tmp_path / "state.json"),
            "--docker-socket", str(tmp_path / "docker.sock"), "--url", "http://127.0.0.1:9",
            "--interval", "60", "--start-interval", "60"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "state.json").exists(), "the loop never wrote its state"
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        asked = time.monotonic()
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - asked < 2
    finally:
        proc.kill()
        proc.wait()
        docker.shutdown()
        docker.server_close()
