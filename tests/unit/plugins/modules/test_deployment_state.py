"""deployment_state: the module reads Docker, files and tables, and records or compares
(the comparison itself is tested in test_deployment_record.py); with state=kept it writes a
check's own record (the record's shape and reader are tested there too)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deployment_record as dr
from ansible_collections.dgx_spark.cluster.plugins.modules import deployment_state
from support.modules import run_module

OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64


def inspected(name, cid="c1", running=True, image=OLD, component="ray"):
    return {"Name": f"/{name}", "Id": cid, "Image": image, "RestartCount": 0,
            "Config": {"Labels": {"dgx_spark.cluster.component": component}},
            "State": {"Running": running, "StartedAt": "2026-11-30T10:00:00Z"}}  # fmt: skip


class FakeDocker:
    """docker.from_env() of the module, answering from a list of inspect answers."""

    containers_now: list[dict] = []
    errors = deployment_state.docker.errors if deployment_state.docker else None

    @classmethod
    def from_env(cls):
        return cls()

    @property
    def api(self):
        return self

    def containers(self, all, filters):  # noqa: A002 - docker SDK's own argument names
        assert all and filters == {"label": "dgx_spark.cluster.component"}
        return [{"Id": c["Id"]} for c in self.containers_now]

    def inspect_container(self, cid):
        return next(c for c in self.containers_now if c["Id"] == cid)

    images_now: dict[str, str] = {}

    def inspect_image(self, ref):
        if ref not in self.images_now:
            raise self.errors.NotFound(ref)
        return {"Id": self.images_now[ref]}


def test_record_then_compare_round_trip(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(deployment_state.docker, "from_env", FakeDocker.from_env)
    FakeDocker.containers_now = [
        inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2", component="vllm")
    ]  # fmt: skip
    FakeDocker.images_now = {"alias:current": OLD, "donor:1": NEW}
    comm_env = tmp_path / "comm.env"
    comm_env.write_text("A=1\n")
    weights = tmp_path / "models"
    weights.mkdir()
    (weights / "w.safetensors").write_bytes(b"w")
    path = str(tmp_path / "state" / "deployed.json")
    stages = ("host_prep", "images", "model", "ray", "serve")
    fingerprint = {stage: {stage[0]: stage} for stage in stages}
    left = {"host_prep": {"files": [str(comm_env)], "tables": []},
            "images": {"images": ["alias:current", "donor:1", "absent:1"]},
            "model": {"trees": [str(weights)]},
            "ray": {"components": ["ray"]},
            "serve": {"components": ["vllm", "ray"]}}  # fmt: skip
    args = {"path": path, "fingerprint": fingerprint, "left": left,
            "serving_image": "alias:current"}  # fmt: skip
    rc, result = run_module(deployment_state, args, capsys)
    assert rc == 0 and not result["in_step"] and not result["changed"]
    assert result["stages"] == ["host_prep"]  # no record yet
    # Each stage records what it was given and what it left; a run that ended after model.
    record = {stage: {**args, "state": "recorded", "stage": stage} for stage in stages}
    rc, result = run_module(deployment_state, record["host_prep"], capsys, check_mode=True)
    assert result["changed"] and not os.path.exists(path)
    rc, result = run_module(deployment_state, record["host_prep"], capsys)
    assert result["changed"] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # The directory it made stays passable: the default one holds the weights' directory,
    # which the SSH user's rsync copies between the nodes.
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    for stage in ("images", "model"):
        assert run_module(deployment_state, record[stage], capsys)[1]["changed"]
    rc, result = run_module(deployment_state, args, capsys)
    assert result["reasons"] == [
        "no record of the ray stage on this node",
        "no record of the serve stage on this node",
        "dgx-spark-ray: not there at the last run",
        "dgx-spark-vllm: not there at the last run",
    ]
    assert result["stages"] == ["ray", "serve"]
    assert run_module(deployment_state, record["ray"], capsys)[1]["changed"]
    serve = record["serve"]
    rc, result = run_module(deployment_state, serve, capsys)
    assert result["changed"]
    rc, result = run_module(deployment_state, serve, capsys)
    assert not result["changed"]
    rc, result = run_module(deployment_state, args, capsys)
    assert result["in_step"] and result["reasons"] == [] and result["stages"] == []
    with open(path, encoding="utf-8") as handle:
        assert list(json.load(handle)["stages"]) == sorted(stages)
    rc, result = run_module(deployment_state, {**serve, "stage": "monitoring"}, capsys)
    assert rc == 1 and result["msg"] == (
        "the fingerprint and left must both have an entry for stage 'monitoring'"
    )
    FakeDocker.containers_now[1] = inspected(
        "dgx-spark-vllm", "c2", running=False, component="vllm"
    )
    rc, result = run_module(deployment_state, args, capsys)
    assert not result["in_step"] and result["reasons"] == ["dgx-spark-vllm: not running"]
    assert result["stages"] == ["serve"]
    changed = {**args, "fingerprint": {**fingerprint, "serve": {"s": "t"}}}
    assert run_module(deployment_state, changed, capsys)[1]["reasons"] == [
        "the serve stage's inputs changed: s",
        "dgx-spark-vllm: not running",
    ]
    FakeDocker.containers_now[1] = inspected("dgx-spark-vllm", "c2", component="vllm")
    assert run_module(deployment_state, args, capsys)[1]["in_step"]
    # The alias moved (images.yml), a host file was edited, a weight replaced.
    FakeDocker.images_now["alias:current"] = NEW
    comm_env.write_text("A=2\n")
    (weights / "w.safetensors").write_bytes(b"ww")
    rc, result = run_module(deployment_state, args, capsys)
    assert result["images"] == {"alias:current": NEW, "donor:1": NEW, "absent:1": ""}
    assert result["reasons"] == [
        "alias:current is sha256:222222222222 but dgx-spark-ray runs sha256:111111111111",
        "alias:current is sha256:222222222222 but dgx-spark-vllm runs sha256:111111111111",
        "alias:current is sha256:222222222222 (was sha256:111111111111 at the last run)",
        f"{comm_env}: edited since the last run",
        f"{weights}: w.safetensors changed, appeared or went since the last run",
    ]
    assert result["stages"] == ["ray", "images", "host_prep", "model"]  # host_prep: the file


def test_what_a_stage_is_handed_is_kept_apart_from_what_it_leaves(tmp_path, capsys, monkeypatch):
    """The ray stage is handed host_prep's comm.env: its record keeps a digest of it, but a
    ray stage run alone after a hand edit leaves the file host_prep's difference; once
    host_prep wrote it anew, the ray stage is the one that differs."""
    monkeypatch.setattr(deployment_state.docker, "from_env", FakeDocker.from_env)
    FakeDocker.containers_now = [inspected("dgx-spark-ray")]
    FakeDocker.images_now = {}
    comm_env = tmp_path / "comm.env"
    comm_env.write_text("A=1\n")
    path = str(tmp_path / "deployed.json")
    left = {"host_prep": {"files": [str(comm_env)]},
            "ray": {"components": ["ray"], "handed": {"files": [str(comm_env)]}}}  # fmt: skip
    args = {"path": path, "fingerprint": {"host_prep": {}, "ray": {}}, "left": left}

    def record(stage):
        return run_module(deployment_state, {**args, "state": "recorded", "stage": stage}, capsys)

    def compare():
        result = run_module(deployment_state, args, capsys)[1]
        return result["stages"], result["reasons"]

    record("host_prep")
    record("ray")
    assert compare() == ([], [])
    comm_env.write_text("A=2\n")
    edited = (["host_prep"], [f"{comm_env}: edited since the last run"])
    assert compare() == edited
    assert record("ray")[1]["changed"]  # its handed digest, not host_prep's file
    assert compare() == edited
    record("host_prep")
    assert compare() == ([], [])
    comm_env.write_text("A=3\n")
    record("host_prep")
    assert compare() == (["ray"], [f"{comm_env}: changed since the ray stage last ran"])


# state=kept: a check's own record (host_prep's link check, the collective, the weights).
INPUTS = {"image_id": "sha256:" + "a" * 64, "comm": "0123456789abcdef"}
KEPT = {"checked_at": "2026-12-04T23:00:00+00:00", "backend": "gloo"}


def test_kept_writes_once_then_leaves_the_same_record(tmp_path, capsys):
    path = tmp_path / "state" / "collective.json"
    args = {"path": str(path), "inputs": INPUTS, "kept": KEPT}
    code, out = run_module(deployment_state, {**args, "state": "kept"}, capsys)
    assert code == 0 and out["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755  # the weights may lie below it
    written = dr.read_stage_record(path.read_text())
    assert written == out["record"] == dr.stage_record(INPUTS, **KEPT)
    assert dr.inputs_changed(written, INPUTS) == []
    assert dr.inputs_changed(written, {**INPUTS, "comm": "f" * 16}) == ["comm"]
    assert os.listdir(path.parent) == ["collective.json"]  # no temporary file left
    code, out = run_module(deployment_state, {**args, "state": "kept"}, capsys)
    assert code == 0 and out["changed"] is False


def test_kept_in_check_mode_reports_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "link-check.json"
    path.write_text(json.dumps(dr.stage_record({"mtu": 1500}, checked_at="then")))
    before = path.read_text()
    args = {"path": str(path), "inputs": {"mtu": 9000}, "kept": {"checked_at": "now"}}
    code, out = run_module(deployment_state, {**args, "state": "kept"}, capsys, check_mode=True)
    assert code == 0 and out["changed"] is True and out["record"]["inputs"] == {"mtu": 9000}
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"mode": "rw-r--r--"}, "mode is 'rw-r--r--'; allowed: an octal string"),
        ({"kept": {"digest": "x", "inputs": {}}}, "kept names digest, inputs: the record's own"),
    ],
)
def test_kept_with_bad_options_fails_before_writing(tmp_path, capsys, args, words):
    path = tmp_path / "record.json"
    code, out = run_module(
        deployment_state, {"path": str(path), "inputs": INPUTS, "state": "kept", **args}, capsys
    )
    assert code == 1 and words in out["msg"] and not path.exists()
