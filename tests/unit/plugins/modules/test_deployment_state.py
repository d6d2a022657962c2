"""deployment_state: what a node's record of the last full run says against the node now."""

from __future__ import annotations

import os
import stat

import pytest
from ansible_collections.dgx_spark.cluster.plugins.modules import deployment_state
from support.modules import run_module


def inspected(name, cid="c1", running=True, started="2026-11-30T10:00:00Z", restarts=0):
    return {"Name": f"/{name}", "Id": cid, "Image": "sha256:img", "RestartCount": restarts,
            "State": {"Running": running, "StartedAt": started}}  # fmt: skip


NOW = deployment_state.snapshot([inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2")])


def test_the_same_fingerprint_and_containers_are_in_step():
    assert deployment_state.compare({"fingerprint": "f", "containers": NOW}, "f", NOW) == []


def test_no_record_is_out_of_step():
    assert deployment_state.compare(None, "f", NOW) == ["no record of a full deploy on this node"]


LATER = "2026-11-30T11:00:00Z"
MOVED = "dgx-spark-vllm: restarted or changed since the last full deploy"


@pytest.mark.parametrize(
    ("vllm", "extra", "reason"),
    [
        (None, [], "dgx-spark-vllm: gone"),
        ({"cid": "c3"}, [], "dgx-spark-vllm: recreated"),
        ({"cid": "c2", "running": False}, [], "dgx-spark-vllm: not running"),
        ({"cid": "c2", "started": LATER}, [], MOVED),
        ({"cid": "c2", "restarts": 1}, [], MOVED),
        ({"cid": "c2"}, [inspected("dgx-spark-watchdog", "c9")],
         "dgx-spark-watchdog: not there at the last full deploy"),
    ],
)  # fmt: skip
def test_a_container_that_moved_is_named(vllm, extra, reason):
    now = [inspected("dgx-spark-ray"), *extra]
    if vllm is not None:
        now.append(inspected("dgx-spark-vllm", **vllm))
    record = {"fingerprint": "f", "containers": NOW}
    assert deployment_state.compare(record, "f", deployment_state.snapshot(now)) == [reason]


def test_a_changed_fingerprint_is_named():
    reasons = deployment_state.compare({"fingerprint": "old", "containers": NOW}, "new", NOW)
    assert reasons == ["the settings, inventory or collection changed since the last full deploy"]


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


def test_record_then_compare_round_trip(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(deployment_state.docker, "from_env", FakeDocker.from_env)
    FakeDocker.containers_now = [inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2")]
    path = str(tmp_path / "state" / "deployed.json")
    args = {"path": path, "fingerprint": "f"}
    rc, result = run_module(deployment_state, args, capsys)
    assert rc == 0 and not result["in_step"] and not result["changed"]
    rc, result = run_module(
        deployment_state, {**args, "state": "recorded"}, capsys, check_mode=True
    )
    assert result["changed"] and not os.path.exists(path)
    rc, result = run_module(deployment_state, {**args, "state": "recorded"}, capsys)
    assert result["changed"] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    rc, result = run_module(deployment_state, {**args, "state": "recorded"}, capsys)
    assert not result["changed"]
    rc, result = run_module(deployment_state, args, capsys)
    assert result["in_step"] and result["reasons"] == []
    FakeDocker.containers_now[1] = inspected("dgx-spark-vllm", "c2", running=False)
    rc, result = run_module(deployment_state, args, capsys)
    assert not result["in_step"] and result["reasons"] == ["dgx-spark-vllm: not running"]
