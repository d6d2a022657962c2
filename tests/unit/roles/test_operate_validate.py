"""roles/operate/tasks/validate.yml, the entry point preflight and status, benchmark and logs
run first, against inventories/sparks on a local connection (nothing reaches its addresses)."""

from __future__ import annotations

import json

from support.role_entry import run_entry_point


def validate(tmp_path, **extra):
    return run_entry_point(tmp_path, "operate", "validate", "-e", json.dumps(extra))


def test_the_sparks_inventory_passes(tmp_path):
    proc = validate(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_bad_setting_is_refused_naming_it(tmp_path):
    proc = validate(tmp_path, operate_status_timeout=0, operate_benchmark_concurrency=[0])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "operate_status_timeout is 0; allowed: whole seconds 1-600" in out, out
    assert "operate_benchmark_concurrency is [0]" in out, out
