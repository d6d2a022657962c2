"""stage_record: the one module that writes a stage's record on a node (the record's shape and
reader are tested in test_deployment_record.py)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deployment_record as dr
from ansible_collections.dgx_spark.cluster.plugins.modules import stage_record
from support.modules import run_module

INPUTS = {"image_id": "sha256:" + "a" * 64, "comm": "0123456789abcdef"}
KEPT = {"checked_at": "2026-12-04T23:00:00+00:00", "backend": "gloo"}


def test_writes_once_then_leaves_the_same_record(tmp_path, capsys):
    path = tmp_path / "state" / "collective.json"
    args = {"path": str(path), "inputs": INPUTS, "kept": KEPT}
    code, out = run_module(stage_record, args, capsys)
    assert code == 0 and out["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    written = dr.read_stage_record(path.read_text())
    assert written == out["record"] == dr.stage_record(INPUTS, **KEPT)
    assert dr.inputs_changed(written, INPUTS) == []
    assert dr.inputs_changed(written, {**INPUTS, "comm": "f" * 16}) == ["comm"]
    assert os.listdir(path.parent) == ["collective.json"]  # no temporary file left
    code, out = run_module(stage_record, args, capsys)
    assert code == 0 and out["changed"] is False


def test_check_mode_reports_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "link-check.json"
    path.write_text(json.dumps(dr.stage_record({"mtu": 1500}, checked_at="then")))
    before = path.read_text()
    args = {"path": str(path), "inputs": {"mtu": 9000}, "kept": {"checked_at": "now"}}
    code, out = run_module(stage_record, args, capsys, check_mode=True)
    assert code == 0 and out["changed"] is True and out["record"]["inputs"] == {"mtu": 9000}
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"mode": "rw-r--r--"}, "mode is 'rw-r--r--'; allowed: an octal string"),
        ({"kept": {"digest": "x", "inputs": {}}}, "kept names digest, inputs: the record's own"),
    ],
)
def test_bad_options_fail_before_writing(tmp_path, capsys, args, words):
    path = tmp_path / "record.json"
    code, out = run_module(stage_record, {"path": str(path), "inputs": INPUTS, **args}, capsys)
    assert code == 1 and words in out["msg"] and not path.exists()
