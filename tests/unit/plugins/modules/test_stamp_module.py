"""Tests for plugins/modules/stamp.py, run as Ansible runs it, on tmp_path."""

from __future__ import annotations

import json

import pytest
from ansible_collections.dgx_spark.cluster.plugins.modules import stamp as mod
from support.modules import run_module

INPUTS = {"image_id": "sha256:" + "a" * 64, "comm": "0123456789abcdef"}


def run(args: dict, capsys, check_mode: bool = False) -> tuple[int, dict]:
    return run_module(mod, args, capsys, check_mode)


def test_check_present_check_absent(tmp_path, capsys):
    base = {"name": "collective", "dir": str(tmp_path / "stamps"), "inputs": INPUTS}
    code, out = run(base, capsys)
    assert code == 0
    assert out["valid"] is False and out["msg"] == "runs: no stamp" and out["stamp"] is None
    assert not (tmp_path / "stamps").exists()

    code, out = run({**base, "state": "present", "result": {"transport": "IB"}}, capsys, True)
    assert out["changed"] is True and not (tmp_path / "stamps").exists()
    code, out = run({**base, "state": "present", "result": {"transport": "IB"}}, capsys)
    assert code == 0 and out["changed"] is True
    written = json.loads((tmp_path / "stamps" / "collective.json").read_text())
    assert written["inputs"] == INPUTS and written["result"] == {"transport": "IB"}

    code, out = run({**base, "state": "present", "result": {"transport": "IB"}}, capsys)
    assert out["changed"] is False and out["stamp"] == written

    code, out = run(base, capsys, check_mode=True)
    assert out["valid"] is True and out["reason"].startswith("skipped: collective passed ")
    assert out["reason"].endswith("with these inputs: transport=IB")

    code, out = run({**base, "inputs": {**INPUTS, "comm": "fedcba9876543210"}}, capsys)
    assert out["valid"] is False
    assert out["reason"] == "runs: comm changed from 0123456789abcdef to fedcba9876543210"
    assert out["differences"] == ["comm: 0123456789abcdef -> fedcba9876543210"]

    code, out = run({"name": "x", "dir": base["dir"], "state": "listed"}, capsys)
    assert list(out["stamps"]) == ["collective"] and out["lines"][0].startswith("collective: ")

    code, out = run({**base, "state": "absent"}, capsys, check_mode=True)
    assert out["changed"] is True and (tmp_path / "stamps" / "collective.json").exists()
    code, out = run({**base, "state": "absent"}, capsys)
    assert out["changed"] is True and not (tmp_path / "stamps" / "collective.json").exists()
    code, out = run({**base, "state": "absent"}, capsys)
    assert out["changed"] is False


def test_trees_are_inputs(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    base = {"name": "weights", "dir": str(tmp_path / "s"), "trees": [str(model)]}
    run({**base, "state": "present"}, capsys)
    code, out = run(base, capsys)
    assert out["valid"] is True and list(out["inputs"]) == [f"tree {model}"]
    (model / "config.json").write_text('{"a": 1}')
    code, out = run(base, capsys)
    assert out["valid"] is False and out["reason"].startswith(f"runs: tree {model} changed from ")


def test_an_incomplete_tree_is_never_stamped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        mod, "tree_fingerprint", lambda p: {"exists": True, "complete": False, "entries": []}
    )
    base = {"name": "weights", "dir": str(tmp_path / "s"), "trees": ["/x"]}
    code, out = run({**base, "state": "present"}, capsys)
    assert out["changed"] is False and "could not be read whole" in out["msg"]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("args", [{"name": "../x"}, {"state": "check"}])
def test_refusals(tmp_path, capsys, args):
    code, out = run({"dir": str(tmp_path), **args}, capsys)
    assert code == 1 and out["failed"]
