"""Tests for plugins/modules/vllm_args_check.py with a fake Docker client.

The fake runs the real probe under this test's Python against the fake ``vllm`` trees of
tests/unit/plugins/module_utils/test_vllm_args_probe.py, so the module, the probe and the
pure logic are exercised together.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


# --------------------------------------------------------------------------- cache_dir


@pytest.fixture
def model_dir(tmp_path):
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"max_position_embeddings": 2048}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    return model


def cached_args(model_dir, cache_dir, **more) -> dict:
    return {
        "image": IMAGE,
        "args": GOOD,
        "volumes": [f"{model_dir}:{MODEL}"],
        "cache_dir": str(cache_dir),
        **more,
    }


@pytest.fixture
def warned(monkeypatch) -> list[str]:
    """The module's warnings, as it gives them to AnsibleModule.warn (where they go from there
    depends on what else this test process imported of Ansible)."""
    said: list[str] = []
    monkeypatch.setattr(mod.AnsibleModule, "warn", lambda self, warning, **kw: said.append(warning))
    return said


def entries(cache_dir) -> list[str]:
    return sorted(p.name for p in cache_dir.glob("*.json")) if cache_dir.exists() else []


def test_an_acceptance_is_remembered_and_reused(client, capsys, tmp_path, model_dir, monkeypatch):
    cache = tmp_path / "state" / "args-accepted"
    code, first = run(cached_args(model_dir, cache), capsys)
    assert code == 0, first
    assert first["cached"] is False and first["refused"] is False
    assert len(client.created) == 1
    [name] = entries(cache)
    stored = json.loads((cache / name).read_text())
    assert stored["image_id"] == first["image_id"]
    assert stored["document"]["seconds"] == first["seconds"]

    def must_not_run(*args, **kwargs):
        raise AssertionError("the probe ran although its answer is remembered")

    monkeypatch.setattr(mod, "run_in_image", must_not_run)
    os.utime(cache / name, ns=(1, 1_000_000_000))
    code, again = run(cached_args(model_dir, cache), capsys)
    assert code == 0, again
    assert again["cached"] is True and again["changed"] is False
    # Marked as used, so the prune keeps it longer.
    assert (cache / name).stat().st_mtime_ns > 1_000_000_000
    assert len(client.created) == 1 and client.closed
    for field in ("image_id", "vllm_version", "problems", "registries", "model_config",
                  "seconds", "timings", "refused"):  # fmt: skip
        assert again[field] == first[field], field


def test_without_cache_dir_nothing_is_remembered(client, capsys, tmp_path):
    for _attempt in range(2):
        code, out = run({"image": IMAGE, "args": GOOD}, capsys)
        assert code == 0 and out["cached"] is False, out
    assert len(client.created) == 2


@pytest.mark.parametrize(
    "change",
    ["arg", "env", "file-size", "file-mtime", "new-file", "image"],
)
def test_a_change_asks_again(client, capsys, tmp_path, model_dir, change):
    cache = tmp_path / "cache"
    given = cached_args(model_dir, cache)
    assert run(given, capsys)[0] == 0
    if change == "arg":
        given["args"] = [*GOOD, "--seed", "8"]
    elif change == "env":
        given["env"] = {"VLLM_LOGGING_LEVEL": "DEBUG"}
    elif change == "file-size":
        (model_dir / "config.json").write_text('{"max_position_embeddings": 4096}')
    elif change == "file-mtime":
        stamp = (model_dir / "model.safetensors").stat().st_mtime_ns + 1_000_000_000
        os.utime(model_dir / "model.safetensors", ns=(stamp, stamp))
    elif change == "new-file":
        (model_dir / "tokenizer.json").write_text("{}")
    else:  # the tag moved to another image
        client.known[IMAGE] = FakeImage(
            "another", client.known[IMAGE].site, client.known[IMAGE].attrs["Config"]["Env"]
        )
    code, out = run(given, capsys)
    assert code == 0, out
    assert out["cached"] is False and len(client.created) == 2
    assert len(entries(cache)) == 2
    # Unchanged since, the new answer is reused in turn.
    code, out = run(given, capsys)
    assert out["cached"] is True and len(client.created) == 2


def test_a_refusal_is_not_remembered(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    given = cached_args(model_dir, cache, args=[MODEL, "--seed", "abc"])
    for expected_runs in (1, 2):
        code, out = run(given, capsys)
        assert code == 1 and out["refused"] is True and out["cached"] is False
        assert len(client.created) == expected_runs
    assert entries(cache) == []


def test_a_refusal_reported_without_failing_is_not_remembered(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    given = cached_args(
        model_dir, cache, args=[MODEL, "--reasoning-parser", "qwen9"], fail_on_refusal=False
    )
    code, out = run(given, capsys)
    assert code == 0 and out["refused"] is True and out["cached"] is False
    assert entries(cache) == []


def test_check_mode_reads_but_does_not_write(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    code, out = run(cached_args(model_dir, cache), capsys, check_mode=True)
    assert code == 0 and out["cached"] is False, out
    assert not cache.exists()
    # Written by a real run, then read in check mode, untouched.
    assert run(cached_args(model_dir, cache), capsys)[0] == 0
    [name] = entries(cache)
    os.utime(cache / name, ns=(1, 1_000_000_000))
    code, out = run(cached_args(model_dir, cache), capsys, check_mode=True)
    assert code == 0 and out["cached"] is True, out
    assert len(client.created) == 2
    assert (cache / name).stat().st_mtime_ns == 1_000_000_000


def test_a_corrupt_entry_is_ignored_then_replaced(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    assert run(cached_args(model_dir, cache), capsys)[0] == 0
    [name] = entries(cache)
    (cache / name).write_text('{"version": 1, "key": "trunc')
    code, out = run(cached_args(model_dir, cache), capsys)
    assert code == 0 and out["cached"] is False and len(client.created) == 2, out
    assert json.loads((cache / name).read_text())["document"]["vllm"] == "0.32.0"
    code, out = run(cached_args(model_dir, cache), capsys)
    assert out["cached"] is True and len(client.created) == 2


def test_a_remembered_answer_this_judge_refuses_is_asked_again(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    assert run(cached_args(model_dir, cache), capsys)[0] == 0
    [name] = entries(cache)
    entry = json.loads((cache / name).read_text())
    entry["document"]["registries"]["tool"]["names"] = ["hermes"]
    (cache / name).write_text(json.dumps(entry))
    code, out = run(cached_args(model_dir, cache), capsys)
    assert code == 0 and out["cached"] is False and len(client.created) == 2, out
    rewritten = json.loads((cache / name).read_text())["document"]
    assert "qwen3_coder" in rewritten["registries"]["tool"]["names"]


def test_at_most_32_entries_are_kept(client, capsys, tmp_path, model_dir):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = [f"{index:064x}.json" for index in range(40)]
    for age, name in enumerate(old):
        (cache / name).write_text("{}")
        os.utime(cache / name, ns=(1, 1_000_000_000 * (age + 1)))
    assert run(cached_args(model_dir, cache), capsys)[0] == 0
    kept = entries(cache)
    assert len(kept) == 32
    new = [n for n in kept if n not in old]
    assert len(new) == 1
    # The newest 31 of the old ones stay beside the new entry.
    assert sorted(set(kept) - set(new)) == old[-31:]


def test_an_unwritable_cache_warns_and_answers(client, capsys, tmp_path, model_dir, warned):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out = run(cached_args(model_dir, blocker / "cache"), capsys)
    assert code == 0 and out["refused"] is False and out["cached"] is False, out
    assert len(warned) == 1 and warned[0].startswith("cannot remember vLLM's answer in")


def test_a_file_written_while_the_probe_runs_is_not_remembered(
    client, capsys, tmp_path, model_dir, monkeypatch, warned
):
    cache = tmp_path / "cache"
    real = mod.run_in_image

    def run_and_write(*args, **kwargs):
        found = real(*args, **kwargs)
        (model_dir / "config.json").write_text('{"max_position_embeddings": 99999}')
        return found

    monkeypatch.setattr(mod, "run_in_image", run_and_write)
    code, out = run(cached_args(model_dir, cache), capsys)
    assert code == 0 and out["cached"] is False, out
    assert entries(cache) == []
    assert warned == [
        f"{IMAGE} or a file below a volume changed while vLLM was asked; "
        "this answer is not remembered"
    ]


def test_a_named_volume_is_not_remembered(client, capsys, tmp_path):
    cache = tmp_path / "cache"
    given = {"image": IMAGE, "args": GOOD, "volumes": ["models:/models"], "cache_dir": str(cache)}
    for _attempt in range(2):
        code, out = run(given, capsys)
        assert code == 0 and out["cached"] is False, out
    assert len(client.created) == 2 and entries(cache) == []
