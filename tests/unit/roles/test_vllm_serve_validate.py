"""roles/vllm_serve/tasks/validate.yml as deploy.yml runs it before any change, here against
inventories/sparks on a local connection (nothing reaches the inventory's addresses): the key
rule of real Sparks and the watchdog's ranges, each refusal naming its variable."""

from __future__ import annotations

import subprocess

import pytest
from support.role_entry import run_entry_point


def validate(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return run_entry_point(tmp_path, "vllm_serve", "validate", *extra)


def outcome(proc: subprocess.CompletedProcess, task: str) -> str:
    """The first word a task's result printed for the head (ok, fatal, ...), or ''.

    The checks after these two read the machine's own memory as a Spark's (a local connection
    here), so a run's overall result says nothing about them; each task's own line does."""
    out = proc.stdout
    marker = f"TASK [dgx_spark.cluster.vllm_serve : {task}]"
    if marker not in out:
        return ""
    after = out.split(marker, 1)[1].split("TASK [", 1)[0]
    for line in after.splitlines():
        if line.startswith(("ok:", "fatal:", "skipping:", "changed:")):
            return line.split(":", 1)[0]
    return ""


KEY_TASK = "Require an API key on real Sparks"
WATCHDOG_TASK = "Check the watchdog's settings"


def test_the_sparks_inventory_as_shipped_needs_its_key(tmp_path):
    proc = validate(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert outcome(proc, KEY_TASK) == "fatal", out
    assert "vllm_serve_api_key is empty, so anyone who reaches port 8000" in out, out
    assert "vllm_serve_allow_unauthenticated: true" in out, out


@pytest.mark.parametrize(
    "extra",
    [("-e", "vllm_serve_api_key=sk-vaulted"), ("-e", "vllm_serve_allow_unauthenticated=true")],
    ids=["key", "opt-out"],
)
def test_a_key_or_the_opt_out_passes(tmp_path, extra):
    proc = validate(tmp_path, *extra)
    assert outcome(proc, KEY_TASK) == "ok", proc.stdout + proc.stderr
    assert outcome(proc, WATCHDOG_TASK) == "ok", proc.stdout + proc.stderr
    assert "vllm_serve_api_key is empty" not in proc.stdout


def test_a_watchdog_interval_of_zero_is_refused(tmp_path):
    proc = validate(
        tmp_path, "-e", "vllm_serve_api_key=sk-vaulted", "-e", '{"vllm_serve_watchdog_interval": 0}'
    )
    out = proc.stdout + proc.stderr
    assert outcome(proc, KEY_TASK) == "ok", out
    assert outcome(proc, WATCHDOG_TASK) == "fatal", out
    assert "vllm_serve_watchdog_interval is 0; allowed: whole seconds 2-600" in out, out
