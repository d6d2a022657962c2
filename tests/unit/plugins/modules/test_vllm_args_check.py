"""Tests for plugins/modules/vllm_args_check.py with a fake Docker client.

The fake runs the real probe under this test's Python against the fake ``vllm`` trees of
tests/unit/plugins/module_utils/test_vllm_args_probe.py, so the module, the probe and the
pure logic are exercised together.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import docker
import pytest
import requests
from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_args_check as mod
from docker.errors import APIError, DockerException, ImageNotFound
from support.modules import run_module

_spec = importlib.util.spec_from_file_location(
    "fake_vllm_trees", Path(__file__).parents[1] / "module_utils" / "test_vllm_args_probe.py"
)
trees = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trees)

NODE = "spark-1"
IMAGE = "dgx-spark/vllm-serving:current"
OLD = "vllm-node:0.11.0"
MODEL = trees.MODEL
GOOD = trees.GOOD


class FakeImage:
    def __init__(self, name: str, site: Path, env: list[str]):
        self.id = "sha256:" + (name.encode().hex() * 8)[:64]
        self.site = site
        self.attrs = {"Config": {"Env": env}}


class FakeContainer:
    def __init__(self, client, image, entrypoint, command, **kwargs):
        self.client, self.image, self.entrypoint, self.command = client, image, entrypoint, command
        self.kwargs = kwargs
        self.proc = None
        self.removed = False

    def start(self):
        if self.entrypoint[0] not in self.client.pythons:
            raise APIError(
                '400 Client Error: Bad Request ("failed to create shim task: OCI runtime create '
                "failed: runc create failed: unable to start container process: exec: "
                f'"{self.entrypoint[0]}": executable file not found in $PATH: unknown")'
            )
        self.proc = subprocess.run(
            [sys.executable, "-S", *self.entrypoint[1:], *self.command],
            env={"PYTHONPATH": str(self.image.site), **self.kwargs["environment"]},
            capture_output=True,
            check=False,
            timeout=60,
        )

    def wait(self, timeout):
        if self.client.hang:
            raise requests.exceptions.ConnectionError(f"Read timed out. (read timeout={timeout})")
        return {"StatusCode": self.proc.returncode}

    def logs(self, stdout=True, stderr=True):
        return (self.proc.stdout if stdout else b"") + (self.proc.stderr if stderr else b"")

    def remove(self, force=False):
        self.removed = force


class FakeClient:
    def __init__(self, images: dict[str, FakeImage]):
        self.known = images
        self.pythons = {"python3", "/opt/vllm/bin/python3"}
        self.hang = False
        self.created: list[FakeContainer] = []
        self.closed = False
        client = self

        class Images:
            def get(self, name):
                if name not in client.known:
                    raise ImageNotFound(f'404 Client Error: Not Found ("No such image: {name}")')
                return client.known[name]

        class Containers:
            def create(self, image_id, **kwargs):
                image = next(i for i in client.known.values() if i.id == image_id)
                container = FakeContainer(client, image, **kwargs)
                client.created.append(container)
                return container

        self.images, self.containers = Images(), Containers()

    def close(self):
        self.closed = True


@pytest.fixture
def client(tmp_path, monkeypatch):
    fake = FakeClient(
        {
            IMAGE: FakeImage(IMAGE, trees.make_vllm(tmp_path, "new"),
                             ["PATH=/opt/vllm/bin:/usr/bin", "VIRTUAL_ENV=/opt/vllm"]),
            OLD: FakeImage(OLD, trees.make_vllm(tmp_path, "old", "0.11.0"), ["PATH=/usr/bin"]),
        }
    )  # fmt: skip
    monkeypatch.setattr(docker, "DockerClient", lambda **kwargs: fake)
    monkeypatch.setattr(mod.socket, "gethostname", lambda: NODE)
    return fake


def run(args: dict, capsys, check_mode: bool = False) -> tuple[int, dict]:
    return run_module(mod, args, capsys, check_mode)


def test_accepted(client, capsys):
    code, out = run(
        {"image": IMAGE, "args": GOOD, "env": {"HF_HUB_OFFLINE": 1},
         "volumes": ["/var/lib/dgx-spark/models:/var/lib/dgx-spark/models"]},
        capsys,
    )  # fmt: skip
    assert code == 0, out
    assert out["changed"] is False
    assert out["refused"] is False and out["problems"] == []
    assert out["vllm_version"] == "0.32.0"
    assert "qwen3_coder" in out["registries"]["tool"]["names"]
    container = client.created[0]
    assert container.entrypoint[0] == "/opt/vllm/bin/python3"
    assert container.kwargs["network_disabled"] is True
    assert container.kwargs["environment"] == {"HF_HUB_OFFLINE": "1"}
    assert container.kwargs["volumes"] == ["/var/lib/dgx-spark/models:/var/lib/dgx-spark/models:ro"]
    assert container.removed and client.closed


def test_check_mode_asks_too(client, capsys):
    code, out = run({"image": IMAGE, "args": GOOD}, capsys, check_mode=True)
    assert code == 0 and len(client.created) == 1, out


@pytest.mark.parametrize("image", [IMAGE, OLD])
def test_refusals_name_the_settings(client, capsys, image):
    args = [MODEL, "--seed", "abc", "--reasoning-parser", "qwen9",
            "--enable-auto-tool-choice", "--tool-call-parser", "nope"]  # fmt: skip
    code, out = run({"image": image, "args": args}, capsys)
    assert code == 1
    assert out["failed"] is True and out["refused"] is True
    # argparse stops at the first bad argument; the registries still judge the names.
    by_setting = {p["setting"]: p for p in out["problems"]}
    assert by_setting["vllm_serve_extra_args"]["message"] == (
        "argument --seed: invalid int value: 'abc'"
    )
    assert "vllm_serve_tool_call_parser" in by_setting
    assert out["msg"].startswith(f"{NODE}: vLLM {out['vllm_version']} in {image} refuses")
    assert "vllm_serve_extra_args (--seed): argument --seed" in out["msg"]


def test_reported_without_failing(client, capsys):
    args = [MODEL, "--reasoning-parser", "qwen9"]
    code, out = run({"image": IMAGE, "args": args, "fail_on_refusal": False}, capsys)
    assert code == 0, out
    assert out["refused"] is True
    assert [p["setting"] for p in out["problems"]] == ["vllm_serve_reasoning_parser"]


def test_missing_image(client, capsys):
    code, out = run({"image": "nope:1", "args": GOOD}, capsys)
    assert code == 1
    assert out["msg"].startswith("image nope:1 is not on node spark-1")


def test_no_python_in_image(client, capsys):
    client.pythons = set()
    code, out = run({"image": IMAGE, "args": GOOD}, capsys)
    assert code == 1
    assert (
        "has no Python to run the probe with (tried /opt/vllm/bin/python3, python3, python)"
        in (out["msg"])
    )


def test_probe_that_hangs(client, capsys):
    client.hang = True
    code, out = run({"image": IMAGE, "args": GOOD, "timeout": 5}, capsys)
    assert code == 1
    assert "did not finish within 5s" in out["msg"]
    assert client.created[0].removed


def test_unreachable_daemon(monkeypatch, capsys):
    def refuse(**kwargs):
        raise DockerException("Error while fetching server API version: connection refused")

    monkeypatch.setattr(docker, "DockerClient", refuse)
    code, out = run({"image": IMAGE, "args": GOOD}, capsys)
    assert code == 1
    assert "cannot reach the Docker daemon at unix:///var/run/docker.sock" in out["msg"]
