"""Tests for plugins/modules/vllm_registry_info.py with a fake Docker client.

The fake runs the real probe script under this test's Python against a fake ``vllm`` tree,
so the module, the probe and the pure logic are exercised together; Docker's failures are
the real exception classes of the docker SDK with the messages the daemon really sends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import docker
import pytest
import requests
from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_registry_info as mod
from docker.errors import APIError, DockerException, ImageNotFound
from support.modules import run_module

NODE = "spark-1"
IMAGE = "vllm-donor:0.32.0-cpu"
OTHER = "vllm-node:0.14.1-ray2.60.0"
REGISTRY = textwrap.dedent(
    """
    _TEXT_GENERATION_MODELS = {
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    }
    _MULTIMODAL_MODELS = {
        "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
    }
    _VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_MULTIMODAL_MODELS}
    """
)
OLD_REGISTRY = textwrap.dedent(
    """
    _TEXT_GENERATION_MODELS = {
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    }
    _VLLM_MODELS = {**_TEXT_GENERATION_MODELS}
    """
)


def write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_site(root: Path, registry: str | None, models: dict[str, str]) -> Path:
    site = root / "site"
    site.mkdir(parents=True)
    if registry is None:
        return site
    write(site / "vllm" / "__init__.py")
    write(site / "vllm" / "model_executor" / "__init__.py")
    write(site / "vllm" / "model_executor" / "models" / "__init__.py")
    write(site / "vllm" / "model_executor" / "models" / "registry.py", registry)
    for name, text in models.items():
        write(site / "vllm" / "model_executor" / "models" / f"{name}.py", text)
    write(site / "vllm-0.32.0.dist-info" / "METADATA", "Name: vllm\nVersion: 0.32.0\n")
    return site


class FakeImage:
    def __init__(self, name: str, site: Path, env: list[str]):
        self.id = "sha256:" + (name.encode().hex() * 8)[:64]
        self.site = site
        self.attrs = {"Config": {"Env": env}}


class FakeContainer:
    def __init__(self, client: FakeClient, image: FakeImage, entrypoint, command, **kwargs):
        self.client, self.image, self.entrypoint, self.command = client, image, entrypoint, command
        self.kwargs = kwargs
        self.proc: subprocess.CompletedProcess | None = None
        self.removed = False

    def start(self):
        python = self.entrypoint[0]
        if python not in self.client.pythons:
            raise APIError(
                '400 Client Error: Bad Request ("failed to create shim task: OCI runtime create '
                "failed: runc create failed: unable to start container process: exec: "
                f'"{python}": executable file not found in $PATH: unknown")'
            )
        self.proc = subprocess.run(
            [sys.executable, "-S", *self.entrypoint[1:], *self.command],
            env={"PYTHONPATH": str(self.image.site)},
            capture_output=True,
            check=False,
            timeout=60,
        )

    def wait(self, timeout):
        self.client.waited_with = timeout
        if self.client.hang:
            raise requests.exceptions.ConnectionError(f"Read timed out. (read timeout={timeout})")
        return {"StatusCode": self.proc.returncode}

    def logs(self, stdout=True, stderr=True):
        return (self.proc.stdout if stdout else b"") + (self.proc.stderr if stderr else b"")

    def remove(self, force=False):
        self.removed = force


class FakeClient:
    def __init__(self, images: dict[str, FakeImage], pythons=("python3",), hang=False):
        self.known = images
        self.pythons = set(pythons)
        self.hang = hang
        self.created: list[FakeContainer] = []
        self.closed = False
        self.waited_with = None
        client = self

        class Images:
            def get(self, name):
                by_id = {i.id: i for i in client.known.values()}
                if name not in client.known and name not in by_id:
                    raise ImageNotFound(f'404 Client Error: Not Found ("No such image: {name}")')
                return client.known.get(name) or by_id[name]

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
def images(tmp_path):
    donor = make_site(
        tmp_path / "donor",
        REGISTRY,
        {
            "qwen3_moe": "class Qwen3MoeForCausalLM:\n    pass\n",
            "qwen3_5": "import torchvision  # noqa\n",
        },
    )
    old = make_site(
        tmp_path / "old", OLD_REGISTRY, {"qwen3_moe": "class Qwen3MoeForCausalLM:\n    pass\n"}
    )
    return {
        IMAGE: FakeImage(IMAGE, donor, ["PATH=/opt/vllm/bin:/usr/bin", "VIRTUAL_ENV=/opt/vllm"]),
        OTHER: FakeImage(OTHER, old, ["PATH=/usr/bin"]),
        "debian:bookworm": FakeImage("debian", make_site(tmp_path / "plain", None, {}), []),
        "broken:1": FakeImage(
            "broken", make_site(tmp_path / "broken", "_VLLM_MODELS = f()\n", {}), []
        ),
    }


@pytest.fixture
def client(images, monkeypatch):
    fake = FakeClient(images)
    seen = {}

    def connect(**kwargs):
        seen.update(kwargs)
        return fake

    monkeypatch.setattr(docker, "DockerClient", connect)
    monkeypatch.setattr(mod.socket, "gethostname", lambda: NODE)
    fake.connect_args = seen
    return fake


def run(args: dict, capsys, check_mode: bool = False) -> tuple[int, dict]:
    return run_module(mod, args, capsys, check_mode)


# --------------------------------------------------------------------------- results


def test_static_read(client, capsys):
    archs = ["Qwen3_5MoeForConditionalGeneration", "Nope"]
    code, out = run({"image": IMAGE, "architectures": archs}, capsys)
    assert code == 0, out
    assert out["changed"] is False
    assert out["node"] == NODE
    assert out["image_id"] == client.images.get(IMAGE).id
    assert out["versions"]["vllm"] == "0.32.0"
    assert out["versions"]["torch"] is None
    assert out["vllm_path"].endswith("/site/vllm")
    assert list(out["architectures"]) == [
        "Qwen3MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    ]
    assert {a: c["status"] for a, c in out["checked"].items()} == {
        "Qwen3_5MoeForConditionalGeneration": "present",
        "Nope": "missing",
    }
    assert "Qwen3_5MoeForConditionalGeneration  present" in out["table"]
    assert out["table"].startswith(f"{IMAGE} on {NODE} (sha256:")
    assert "comparison" not in out
    # VIRTUAL_ENV's python is tried first, then python3 through PATH; both containers go.
    assert [c.entrypoint[0] for c in client.created] == ["/opt/vllm/bin/python3", "python3"]
    assert all(c.removed for c in client.created)
    assert all(c.kwargs["network_disabled"] for c in client.created)
    assert client.closed
    assert client.connect_args["base_url"] == "unix:///var/run/docker.sock"
    assert client.waited_with == 300


def test_docker_host_comes_from_the_environment(client, capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    code, _out = run({"image": IMAGE}, capsys)
    assert code == 0
    assert client.connect_args["base_url"] == "unix:///run/other.sock"


def test_import_read_reports_the_real_exception_without_failing(client, capsys):
    archs = ["Qwen3MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Nope"]
    code, out = run({"image": IMAGE, "architectures": archs, "mode": "import"}, capsys)
    assert code == 0, out
    assert out.get("failed") is not True
    checked = out["checked"]
    assert checked["Qwen3MoeForCausalLM"]["status"] == "present"
    assert checked["Qwen3_5MoeForConditionalGeneration"] == {
        "status": "import_error",
        "module": "vllm.model_executor.models.qwen3_5",
        "class": "Qwen3_5MoeForConditionalGeneration",
        "file": "vllm/model_executor/models/qwen3_5.py",
        "file_present": True,
        "message": "ModuleNotFoundError: No module named 'torchvision'",
    }
    assert checked["Nope"]["status"] == "missing"
    assert "  -> ModuleNotFoundError: No module named 'torchvision'" in out["table"]


def test_compare_to(client, capsys):
    code, out = run({"image": IMAGE, "compare_to": OTHER}, capsys)
    assert code == 0, out
    comparison = out["comparison"]
    assert list(comparison["architectures"]["only_in_image"]) == [
        "Qwen3_5MoeForConditionalGeneration"
    ]
    assert comparison["architectures"]["only_in_compare_to"] == {}
    assert comparison["model_files"] == {
        "only_in_image": ["vllm/model_executor/models/qwen3_5.py"],
        "only_in_compare_to": [],
    }
    assert comparison["compare_to"]["image"] == OTHER
    assert comparison["compare_to"]["image_id"] == client.images.get(OTHER).id


def test_check_mode_reads_the_same(client, capsys):
    code, out = run(
        {"image": IMAGE, "architectures": ["Qwen3MoeForCausalLM"]}, capsys, check_mode=True
    )
    assert code == 0, out
    assert out["changed"] is False
    assert out["checked"]["Qwen3MoeForCausalLM"]["status"] == "present"


def test_explicit_python_is_the_only_one_tried(client, capsys):
    code, out = run({"image": IMAGE, "python": "/opt/conda/bin/python"}, capsys)
    assert code == 1
    assert out["msg"] == (
        f"image {IMAGE} on node {NODE} has no Python to run the probe with (tried "
        "/opt/conda/bin/python); name the interpreter that has vLLM with the python option"
    )
    assert [c.entrypoint[0] for c in client.created] == ["/opt/conda/bin/python"]
    assert client.created[0].removed


# --------------------------------------------------------------------------- errors


def test_image_not_on_the_node(client, capsys):
    code, out = run({"image": "vllm-missing:1"}, capsys)
    assert code == 1
    assert out["failed"] is True
    assert out["msg"].startswith("image vllm-missing:1 is not on node spark-1: load or pull it")
    assert out["node"] == NODE
    assert client.created == []


def test_compare_to_image_not_on_the_node(client, capsys):
    code, out = run({"image": IMAGE, "compare_to": "old:1"}, capsys)
    assert code == 1
    assert out["msg"].startswith("image old:1 is not on node spark-1")


def test_no_vllm_in_the_image(client, capsys):
    code, out = run({"image": "debian:bookworm"}, capsys)
    assert code == 1
    assert out["msg"].startswith(f"image debian:bookworm on node {NODE} has no vLLM: ")
    assert "finds no 'vllm' package" in out["msg"]
    assert out["msg"].endswith("name it with the python option")
    assert all(c.removed for c in client.created)


def test_registry_not_parseable(client, capsys):
    code, out = run({"image": "broken:1"}, capsys)
    assert code == 1
    assert out["msg"].startswith(f"image broken:1 on node {NODE} (vLLM 0.32.0): ")
    assert (
        "registry.py cannot be read as vLLM's model registry: cannot evaluate _VLLM_MODELS"
        in out["msg"]
    )


def test_probe_timeout(client, capsys):
    client.hang = True
    code, out = run({"image": OTHER, "timeout": 5}, capsys)
    assert code == 1
    assert out["msg"].startswith(f"image {OTHER} on node {NODE}, probe run with python3: ")
    assert "did not finish within 5s" in out["msg"]
    assert client.created[-1].removed


def test_probe_without_an_answer(client, capsys, images):
    # A stdlib module shadowed on sys.path: the probe dies before it can answer.
    write(images[OTHER].site / "json.py", "raise ImportError('json is broken here')\n")
    code, out = run({"image": OTHER}, capsys)
    assert code == 1
    assert "the probe exited with status 1 without an answer" in out["msg"]
    assert "json is broken here" in out["msg"]


def test_docker_daemon_unreachable(monkeypatch, capsys):
    def refuse(**kwargs):
        raise DockerException(
            "Error while fetching server API version: ('Connection aborted.', "
            "FileNotFoundError(2, 'No such file or directory'))"
        )

    monkeypatch.setattr(docker, "DockerClient", refuse)
    monkeypatch.setattr(mod.socket, "gethostname", lambda: NODE)
    code, out = run({"image": IMAGE, "docker_host": "unix:///nowhere.sock"}, capsys)
    assert code == 1
    assert out["msg"].startswith(
        f"cannot reach the Docker daemon at unix:///nowhere.sock on node {NODE}: Error while "
    )
    assert "become: true" in out["msg"]


def test_docker_api_error_mid_run(client, capsys, monkeypatch):
    def broken(name):
        raise APIError('500 Server Error: Internal Server Error ("disk full")')

    monkeypatch.setattr(client.images, "get", broken)
    code, out = run({"image": IMAGE}, capsys)
    assert code == 1
    assert out["msg"].startswith(f"Docker on node {NODE} failed while reading {IMAGE}: 500 Server")
    assert client.closed


def test_docker_sdk_missing(monkeypatch, capsys):
    monkeypatch.setattr(mod, "HAS_DOCKER", False)
    monkeypatch.setattr(mod, "DOCKER_IMPORT_ERROR", "Traceback: No module named 'docker'")
    code, out = run({"image": IMAGE}, capsys)
    assert code == 1
    assert "Failed to import the required Python library (docker)" in out["msg"]
    assert out["missing_library"] == "docker"


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ({}, "missing required arguments: image"),
        ({"image": IMAGE, "mode": "run"}, "value of mode must be one of: static, import"),
    ],
)
def test_argument_errors(client, capsys, args, pattern):
    code, out = run(args, capsys)
    assert code == 1
    assert pattern in out["msg"]


def test_platform_modules_and_registry_source(client, capsys):
    code, out = run(
        {"image": IMAGE, "modules": ["json", "no_such_module"], "registry_source": True}, capsys
    )
    assert code == 0, out
    assert out["platform"]["machine"] and len(out["platform"]["libc"]) == 2
    assert out["modules"]["json"]["error"] is None
    assert out["modules"]["no_such_module"] == {
        "version": None,
        "error": "ModuleNotFoundError: No module named 'no_such_module'",
    }
    assert out["registry_source"] == REGISTRY
    _code, plain = run({"image": IMAGE}, capsys)
    assert "modules" not in plain and "registry_source" not in plain


def test_report_and_its_refusal_on_the_roce_path(client, capsys, tmp_path):
    comm_env = tmp_path / "comm.env"
    comm_env.write_text("NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0\nNCCL_IB_DISABLE=0\n")
    args = {"image": IMAGE, "architectures": ["Qwen3_5MoeForConditionalGeneration"]}
    code, out = run({**args, "report": True, "comm_env_file": str(comm_env)}, capsys)
    assert code == 0, out
    report = out["report"]
    assert report["vllm"] == "0.32.0" and report["image"] == IMAGE
    assert report["image_id"] == client.images.get(IMAGE).id
    assert report["wanted"] == {"Qwen3_5MoeForConditionalGeneration": "present"}
    assert report["architectures"] == ["Qwen3MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"]
    # The fake image is this machine's file system: its libibverbs decides.
    if report["libibverbs"] is None:
        (refusal,) = out["refusals"]
        assert refusal.startswith(f"{NODE}: the serving image {IMAGE} has no libibverbs")
    else:
        assert out["refusals"] == []
    # Sockets only, or no comm.env: nothing to refuse.
    comm_env.write_text("NCCL_IB_DISABLE=1\n")
    _code, sockets = run({**args, "report": True, "comm_env_file": str(comm_env)}, capsys)
    assert sockets["refusals"] == []
    _code, missing = run({**args, "report": True, "comm_env_file": str(tmp_path / "no")}, capsys)
    assert missing["refusals"] == []
    _code, plain = run(args, capsys)
    assert "report" not in plain and "refusals" not in plain


# --------------------------------------------------------------------------- stamp_dir


def _started(client) -> int:
    """Probe containers that ran (a missing Python's container never ran the probe)."""
    return sum(1 for c in client.created if c.proc is not None)


def _stamps(directory: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def test_a_stamp_answers_the_same_request_without_a_container(client, capsys, tmp_path):
    stamps = tmp_path / "stamps"
    args = {"image": IMAGE, "architectures": ["Qwen3MoeForCausalLM"], "stamp_dir": str(stamps)}
    code, first = run(args, capsys)
    assert code == 0, first
    assert (first["from_stamp"], first["reason"]) == (False, "runs: no stamp")
    assert _started(client) == 1
    [(name, stamp)] = _stamps(stamps).items()
    image_id = client.images.get(IMAGE).id
    assert name.startswith(f"registry-{image_id[7:19]}-static-")
    assert stamp["inputs"] == {
        "image_id": image_id,
        "probe": stamp["inputs"]["probe"],
        "mode": "static",
        "imports": [],
        "modules": [],
        "report": False,
        "python": None,
        "device_requests": [],
    }
    assert stamp["result"]["vllm_path"] == first["vllm_path"]
    assert (stamps / f"{name}.json").stat().st_mode & 0o777 == 0o600
    assert stamps.stat().st_mode & 0o777 == 0o700
    code, second = run(args, capsys)
    assert code == 0, second
    assert _started(client) == 1
    assert second["from_stamp"] is True
    assert second["reason"].startswith(f"skipped: {name} passed {stamp['passed_at']} (just now)")
    strip = ("from_stamp", "reason")
    assert {k: v for k, v in second.items() if k not in strip} == {
        k: v for k, v in first.items() if k not in strip
    }


@pytest.mark.parametrize(
    "base, change",
    [
        ({"mode": "import"}, {"architectures": ["Qwen3_5MoeForConditionalGeneration"]}),
        ({}, {"mode": "import"}),
        ({}, {"modules": ["ray"]}),
        ({}, {"report": True}),
        ({}, {"python": "python3"}),
        ({}, {"device_requests": [{"driver": "nvidia", "count": -1}]}),
    ],
    ids=["import-architectures", "mode", "modules", "report", "python", "device_requests"],
)
def test_another_request_runs_the_probe_again_and_keeps_both(
    client, capsys, tmp_path, base, change
):
    args = {
        "image": IMAGE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "stamp_dir": str(tmp_path / "stamps"),
        **base,
    }
    assert run(args, capsys)[0] == 0
    code, out = run({**args, **change}, capsys)
    assert code == 0, out
    assert (out["from_stamp"], out["reason"]) == (False, "runs: no stamp")
    assert _started(client) == 2
    assert len(_stamps(tmp_path / "stamps")) == 2
    assert run(args, capsys)[1]["from_stamp"] is True


def test_static_reads_answer_other_architectures_from_the_same_stamp(client, capsys, tmp_path):
    """A static read's document is the registry's text: which architectures are asked about is
    judged from it, so the question does not take another container."""
    args = {
        "image": IMAGE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "stamp_dir": str(tmp_path / "stamps"),
    }
    assert run(args, capsys)[0] == 0
    code, out = run({**args, "architectures": ["Nope"]}, capsys)
    assert code == 0, out
    assert _started(client) == 1 and out["from_stamp"] is True
    assert out["checked"]["Nope"]["status"] == "missing"


def test_a_new_probe_runs_again_and_says_so(client, capsys, tmp_path):
    args = {"image": IMAGE, "stamp_dir": str(tmp_path / "stamps")}
    assert run(args, capsys)[0] == 0
    [(name, stamp)] = _stamps(tmp_path / "stamps").items()
    stamp["inputs"]["probe"] = "0" * 16
    (tmp_path / "stamps" / f"{name}.json").write_text(json.dumps(stamp))
    code, out = run(args, capsys)
    assert code == 0, out
    assert _started(client) == 2
    assert out["reason"].startswith(f"runs: probe changed from {'0' * 16} to ")


def test_a_rebuilt_image_runs_again_and_the_gone_ones_stamps_go(client, images, capsys, tmp_path):
    args = {"image": IMAGE, "stamp_dir": str(tmp_path / "stamps")}
    assert run(args, capsys)[0] == 0
    assert run({**args, "image": OTHER}, capsys)[0] == 0
    client.known[IMAGE] = FakeImage(
        "rebuilt", images[IMAGE].site, images[IMAGE].attrs["Config"]["Env"]
    )
    (tmp_path / "stamps" / "link-check.json").write_text("{}")
    code, out = run(args, capsys)
    assert code == 0, out
    assert _started(client) == 3 and out["reason"] == "runs: no stamp"
    assert out["image_id"] == client.known[IMAGE].id
    kept = {s["inputs"]["image_id"] for s in _stamps(tmp_path / "stamps").values() if s}
    assert kept == {client.known[IMAGE].id, client.known[OTHER].id}
    assert (tmp_path / "stamps" / "link-check.json").exists()


def test_compare_to_stamps_both_images(client, capsys, tmp_path):
    args = {"image": IMAGE, "compare_to": OTHER, "stamp_dir": str(tmp_path / "stamps")}
    code, first = run(args, capsys)
    assert code == 0, first
    assert _started(client) == 2
    code, second = run(args, capsys)
    assert code == 0, second
    assert _started(client) == 2
    assert second["comparison"]["compare_to"]["reason"].startswith("skipped: registry-")
    assert second["comparison"]["architectures"] == first["comparison"]["architectures"]


def test_check_mode_reads_stamps_and_writes_none(client, capsys, tmp_path):
    args = {"image": IMAGE, "stamp_dir": str(tmp_path / "stamps")}
    assert run(args, capsys, check_mode=True)[0] == 0
    assert not (tmp_path / "stamps").exists()
    assert run(args, capsys)[0] == 0
    assert _started(client) == 2
    code, out = run(args, capsys, check_mode=True)
    assert code == 0, out
    assert _started(client) == 2 and out["from_stamp"] is True


def test_a_stamp_without_vllm_is_read_from_the_image_again(client, capsys, tmp_path):
    args = {"image": IMAGE, "stamp_dir": str(tmp_path / "stamps")}
    assert run(args, capsys)[0] == 0
    [entry] = list((tmp_path / "stamps").iterdir())
    text = entry.read_text()
    assert '"vllm_path"' in text
    entry.write_text(text.replace('"vllm_path"', '"vllm_path_gone"'))
    code, out = run(args, capsys)
    assert code == 0, out
    assert _started(client) == 2
    assert out["reason"] == f"runs: {entry.stem} holds no probe document this reader takes"
    assert '"vllm_path_gone"' not in entry.read_text()


def test_an_image_without_vllm_is_never_stamped(client, capsys, tmp_path):
    code, out = run({"image": "debian:bookworm", "stamp_dir": str(tmp_path / "stamps")}, capsys)
    assert code == 1
    assert "finds no 'vllm' package" in out["msg"]
    assert not (tmp_path / "stamps").exists()


def test_without_stamp_dir_every_call_runs(client, capsys):
    for _ in range(2):
        code, out = run({"image": IMAGE}, capsys)
        assert code == 0, out
        assert (out["from_stamp"], out["reason"]) == (False, "runs: no stamp_dir")
    assert _started(client) == 2
