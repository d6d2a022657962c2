"""Tests for plugins/modules/model_manifest.py, run as Ansible runs it, on tmp_path trees."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp
from ansible_collections.dgx_spark.cluster.plugins.modules import model_manifest as mod
from support.modules import run_module

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"a": 1}', "model.safetensors": b"\x00" * 100}


def hf_repo(root: Path) -> Path:
    (root / "blobs").mkdir(parents=True)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, data in FILES.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return root


def run(args: dict, capsys, check_mode: bool = False) -> tuple[int, dict]:
    return run_module(mod, args, capsys, check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
def test_describes_an_hf_cache_repo(tmp_path, capsys, check_mode):
    root = hf_repo(tmp_path / "models--org--tiny")
    code, out = run({"path": str(root)}, capsys, check_mode)
    assert code == 0
    assert out["changed"] is False
    assert out["exists"] is True
    assert out["layout"] == "hf_cache"
    assert out["model_dir"] == str(root / "snapshots" / COMMIT)
    assert out["manifest"] == {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in FILES.items()
    }
    assert out["total_bytes"] == 108
    assert out["ok"] is True
    assert out["free_bytes"] > 0


def test_verifies_against_an_expected_manifest(tmp_path, capsys):
    root = hf_repo(tmp_path / "head")
    head = run({"path": str(root)}, capsys)[1]
    code, out = run({"path": str(root), "expected": head["manifest"]}, capsys)
    assert code == 0 and out["ok"] is True and out["missing_bytes"] == 0


def test_copy_without_blobs_fails_naming_the_dangling_links(tmp_path, capsys):
    root = hf_repo(tmp_path / "head")
    head = run({"path": str(root)}, capsys)[1]
    for blob in (root / "blobs").iterdir():
        blob.unlink()
    code, out = run({"path": str(root), "expected": head["manifest"]}, capsys)
    assert code == 1
    assert out["failed"] is True
    assert "dangling symlinks, blobs not copied (2): config.json, model.safetensors" in out["msg"]
    assert out["problems"]["dangling"] == ["config.json", "model.safetensors"]


def test_report_only_gives_the_missing_bytes(tmp_path, capsys):
    expected = {"config.json": {"size": 8}, "model.safetensors": {"size": 100}}
    code, out = run(
        {
            "path": str(tmp_path / "not-yet"),
            "expected": expected,
            "fail_on_mismatch": False,
            "checksum": False,
        },
        capsys,
    )
    assert code == 0
    assert out["exists"] is False and out["layout"] == "absent" and out["model_dir"] is None
    assert out["missing_bytes"] == 108


def test_absent_model_fails_when_verifying(tmp_path, capsys):
    code, out = run(
        {"path": str(tmp_path / "nope"), "expected": {"config.json": {"size": 1}}}, capsys
    )
    assert code == 1
    assert out["msg"].endswith("no model here")


def test_ambiguous_snapshot_fails_with_advice(tmp_path, capsys):
    root = hf_repo(tmp_path / "head")
    (root / "refs" / "main").unlink()
    (root / "snapshots" / ("f" * 40)).mkdir()
    code, out = run({"path": str(root)}, capsys)
    assert code == 1
    assert "name the snapshot's commit as the revision" in out["msg"]


def test_a_record_spares_reading_unchanged_files(tmp_path, capsys):
    root = hf_repo(tmp_path / "head")
    record = tmp_path / "record.json"
    code, first = run({"path": str(root), "record": str(record)}, capsys)
    assert code == 0 and (first["hashed"], first["reused"]) == (2, 0)
    assert all("mtime_ns" in entry for entry in first["manifest"].values())
    made = {"model_dir": first["model_dir"]}, {"files": first["manifest"]}, datetime.now(UTC)
    record.write_text(json.dumps(stamp.make("weights-head", *made)))
    again = run({"path": str(root), "record": str(record)}, capsys)[1]
    assert (again["hashed"], again["reused"]) == (0, 2)
    assert again["manifest"] == first["manifest"]
    asked = run({"path": str(root), "record": str(record), "trust_record": False}, capsys)[1]
    assert (asked["hashed"], asked["reused"]) == (2, 0)
    assert asked["manifest"] == first["manifest"]
