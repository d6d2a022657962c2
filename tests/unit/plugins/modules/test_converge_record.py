"""converge_record: the module reads Docker, files and tables, and records or compares (the
comparison itself is tested in test_converge_record_lib.py)."""

from __future__ import annotations

import json
import os
import stat

from ansible_collections.dgx_spark.cluster.plugins.modules import converge_record
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
    errors = converge_record.docker.errors if converge_record.docker else None

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


def test_compare_then_record_then_compare_round_trip(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(converge_record.docker, "from_env", FakeDocker.from_env)
    FakeDocker.containers_now = [
        inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2", component="vllm")
    ]  # fmt: skip
    FakeDocker.images_now = {"alias:current": OLD, "donor:1": NEW}
    comm_env = tmp_path / "comm.env"
    comm_env.write_text("A=1\n")
    weights = tmp_path / "models"
    weights.mkdir()
    (weights / "w.safetensors").write_bytes(b"w")
    path = str(tmp_path / "state" / "converged.json")
    left = {"files": [str(comm_env)], "tables": [], "trees": [str(weights)],
            "images": ["alias:current", "donor:1", "absent:1"]}  # fmt: skip
    args = {"path": path, "settings": {"vllm_serve_max_model_len": 512}, "common": {"c": 1},
            "left": left, "serving_image": "alias:current"}  # fmt: skip
    rc, result = run_module(converge_record, args, capsys)
    assert rc == 0 and not result["noop"] and not result["changed"]
    assert result["reasons"] == ["no record of a converge on this node"]
    assert result["recorded_at"] == ""
    rc, result = run_module(converge_record, {**args, "state": "present"}, capsys, check_mode=True)
    assert result["changed"] and not os.path.exists(path)
    rc, result = run_module(converge_record, {**args, "state": "present"}, capsys)
    assert result["changed"] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # The directory it made stays passable: the default one holds the weights' directory,
    # which the SSH user's rsync copies between the nodes.
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    assert os.listdir(os.path.dirname(path)) == ["converged.json"]  # no temporary file left
    with open(path, encoding="utf-8") as handle:
        written = json.load(handle)
    assert written["inputs"]["settings"] == {"vllm_serve_max_model_len": 512}
    assert written["at"] == result["recorded_at"]
    rc, result = run_module(converge_record, args, capsys)
    assert result["noop"] and result["reasons"] == [] and result["recorded_at"] == written["at"]
    # A converge that changed nothing leaves the record, and its time, as they are.
    rc, result = run_module(converge_record, {**args, "state": "present"}, capsys)
    assert not result["changed"] and result["recorded_at"] == written["at"]
    FakeDocker.containers_now[1] = inspected(
        "dgx-spark-vllm", "c2", running=False, component="vllm"
    )
    changed = {**args, "settings": {"vllm_serve_max_model_len": 256}}
    assert run_module(converge_record, changed, capsys)[1]["reasons"] == [
        "vllm_serve_max_model_len: 512 -> 256",
        "dgx-spark-vllm: not running",
    ]
    FakeDocker.containers_now[1] = inspected("dgx-spark-vllm", "c2", component="vllm")
    assert run_module(converge_record, args, capsys)[1]["noop"]
    # The alias moved (images.yml run alone), a host file was edited, a weight replaced.
    FakeDocker.images_now["alias:current"] = NEW
    comm_env.write_text("A=2\n")
    (weights / "w.safetensors").write_bytes(b"ww")
    rc, result = run_module(converge_record, args, capsys)
    assert result["reasons"] == [
        "alias:current is sha256:222222222222 but dgx-spark-ray runs sha256:111111111111",
        "alias:current is sha256:222222222222 but dgx-spark-vllm runs sha256:111111111111",
        "alias:current is sha256:222222222222 (was sha256:111111111111 at the last converge)",
        f"{comm_env}: edited since the last converge",
        f"{weights}: w.safetensors changed, appeared or went since the last converge",
    ]


def test_left_naming_an_unknown_kind_fails_before_anything_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(converge_record.docker, "from_env", FakeDocker.from_env)
    args = {"path": str(tmp_path / "c.json"), "settings": {}, "common": {},
            "left": {"components": ["ray"]}, "state": "present"}  # fmt: skip
    rc, result = run_module(converge_record, args, capsys)
    assert (
        rc == 1 and result["msg"] == "left names components; allowed: images, files, trees, tables"
    )
    assert not (tmp_path / "c.json").exists()
