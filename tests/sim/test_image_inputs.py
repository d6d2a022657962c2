"""The serving image's inputs on the simulated pair: preflight refuses missing, moved or
Ray-less inputs on every node before any change, naming the variable, the node and what to
do; a base whose own vLLM imports the wanted architectures is served as it is, and then the
donor is neither required nor pulled. The cases that need the donor take the older base
(vllm-node:0.14.1), which cannot import the tiny model's architecture."""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import load_changed_image, on_node, run_ansible, sim_images
from conftest import playbook_report as playbook

ALIAS = "dgx-spark/vllm-serving:current"
TEST_NAME = "dgx-spark/vllm-serving-inputs-test"
OLDER_BASE = ("-e", "hybrid_image_base=vllm-node:0.14.1-ray2.60.0")


def results(report: dict):
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                yield task["task"]["name"].split(" : ", 1)[-1], host, res


def failures(report: dict) -> dict[str, str]:
    return {host: str(res.get("argument_errors") or res.get("msg")) for _n, host, res in
            results(report) if res.get("failed")}  # fmt: skip


def image_id(host, ref: str) -> str:
    got = host.run(f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    return got.stdout.strip() if got.rc == 0 else ""


ANOTHER_ID = "sha256:" + "a" * 64
BAD_INPUTS = {
    "unknown strategy (the spec)": (
        ["-e", "hybrid_image_strategy=fancy"],
        "value of hybrid_image_strategy must be one of: overlay, transplant, got: fancy",
    ),
    "donor missing where the base needs it": (
        [*OLDER_BASE, "-e", "hybrid_image_donor=nosuch/donor:1"],
        "hybrid_image_donor (nosuch/donor:1) is not on this node: pull it on the node",
    ),
    "base pinned to another image": (
        ["-e", f"hybrid_image_base_id={ANOTHER_ID}"],
        f"but hybrid_image_base_id pins {ANOTHER_ID}: load the pinned image on",
    ),
    "pin that is not an image ID": (
        ["-e", "hybrid_image_donor_id=latest"],
        "hybrid_image_donor_id (latest) must be an image ID, sha256: and 64 hex digits",
    ),
    "Ray without token authentication (the overlay's)": (
        [*OLDER_BASE, "-e", "hybrid_image_ray_version=2.49.0"],
        "has Ray 2.49.0; the cluster's token authentication (RAY_AUTH_MODE=token) needs Ray "
        "2.52.0 or newer",
    ),
    "pull asked for, registry out of reach": (
        [*OLDER_BASE, "-e", "hybrid_image_donor=nosuch/donor:1", "-e", "hybrid_image_pull=true"],
        "could not pull: Error pulling ",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_preflight_refuses_bad_image_inputs_on_every_node(sim, case):
    extra, words = BAD_INPUTS[case]
    # Preflight as deploy.yml --tags images runs it: every role's settings, read-only.
    report = playbook("playbooks/preflight.yml", "--tags", "images", *extra)
    assert report["rc"] != 0
    failed = failures(report)
    assert sorted(failed) == ["spark-1", "spark-2"], failed
    for host, message in failed.items():
        assert words in message, message
        if "spec" not in case:
            assert message.startswith(f"{host}: ") or f"\n{host}: " in message, message
    assert {h: s["changed"] for h, s in report["stats"].items() if h != "localhost"} == {
        "spark-1": 0,
        "spark-2": 0,
    }


def test_a_base_that_serves_as_it_is_needs_no_donor(sim):
    """The sim's base imports the tiny model's architecture, as a Spark owner's vllm-node imports
    Qwen3.5: preflight passes with the donor absent from every node and never asks for it (a
    pull would fail here, as the pair reaches no registry)."""
    absent = "nosuch/donor:1"
    report = playbook(
        "playbooks/preflight.yml", "--tags", "images",
        *("-e", f"hybrid_image_donor={absent}", "-e", "hybrid_image_pull=true"),
    )  # fmt: skip
    assert report["rc"] == 0, failures(report)
    said = {host: res.get("msg", "") for name, host, res in results(report)
            if name.startswith("Require the base, the donor where it is needed")}  # fmt: skip
    assert sorted(said) == ["spark-1", "spark-2"], said
    for message in said.values():
        assert "imports Qwen3MoeForCausalLM itself, so the donor is not needed" in message, message
    pulls = [res for name, _h, res in results(report) if name.startswith("Pull the donor")]
    assert pulls and all(res.get("skipped") for res in pulls), pulls


NO_SDK_VENV = "/tmp/dgxsim-test-nosdk"


@pytest.fixture
def python_without_docker_sdk(sim):
    """A venv on every node that sees the system's packages (requests, which community.docker
    needs) except the Docker SDK: a module named docker that fails to import shadows
    python3-docker, as on a node before host_prep installed it."""
    shadow = shlex.quote("raise ImportError('the Docker SDK is shadowed by the test')")
    make = (
        f"python3 -m venv --without-pip --system-site-packages {NO_SDK_VENV} && "
        f"for d in {NO_SDK_VENV}/lib/python3*/site-packages; do echo {shadow} > $d/docker.py; done"
    )
    try:
        made = run_ansible("sparks", "ansible.builtin.shell", make)
        assert all(res.get("rc") == 0 for res in made.values()), made
        yield f"{NO_SDK_VENV}/bin/python3"
    finally:
        run_ansible("sparks", "ansible.builtin.file", f"path={NO_SDK_VENV} state=absent")


def test_preflight_without_the_docker_sdk_leaves_the_base_to_the_images_stage(
    python_without_docker_sdk, tmp_path
):
    """Preflight runs before host_prep installs the Docker SDK: the images' presence is still
    checked (community.docker needs only requests), and the base's read waits for the images
    stage, whose role validates again where it waited (roles/hybrid_image/tasks/main.yml)."""
    # Host variables of a second inventory, not -e: the controller's own tasks keep its Python.
    nodes = {"all": {"hosts": {}}}
    for host in ("spark-1", "spark-2"):
        nodes["all"]["hosts"][host] = {"ansible_python_interpreter": python_without_docker_sdk}
    (tmp_path / "nosdk.yml").write_text(json.dumps(nodes))
    report = playbook("playbooks/preflight.yml", "-i", str(tmp_path / "nosdk.yml"))
    assert report["rc"] == 0, failures(report)
    ran = {(name, host): res for name, host, res in results(report) if not res.get("skipped")}
    for host in ("spark-1", "spark-2"):
        read = ran[("Read the base's Python, Ray and vLLM registry", host)]
        assert read["missing_library"] == "docker", read
        said = ran[("Note a base read that waits for the Docker SDK", host)]["msg"]
        assert said.startswith(f"{host}: no Docker SDK for Python yet"), said
    assert {h: s["changed"] for h, s in report["stats"].items() if h != "localhost"} == {
        "spark-1": 0,
        "spark-2": 0,
    }


def test_base_served_as_it_is_must_be_the_same_image_on_every_node(pair_with_images, hosts, nodes):
    """A base under one name that is another image on each node (here the sim's base on the
    head, the same layers with another configuration on the worker, as a node rebuilt on its
    own would have): serving it would run mixed versions, and the role refuses before moving
    any alias."""
    mixed = "dgxsim-test/base:mixed"
    test_alias = f"{TEST_NAME}:current"
    on_node(nodes[0], "docker", "tag", sim_images.CLUSTER_IMAGE, mixed)
    load_changed_image(nodes[1:], sim_images.CLUSTER_IMAGE, mixed, {"dgxsim.test": "mixed"})
    ids = {name: image_id(host, mixed) for name, host in hosts.items()}
    assert "" not in ids.values() and len(set(ids.values())) == 2, ids
    try:
        report = playbook(
            "playbooks/images.yml",
            *("-e", f"hybrid_image_base={mixed}", "-e", f"hybrid_image_name={TEST_NAME}"),
        )
        assert report["rc"] != 0
        (message,) = failures(report).values()
        assert f"The nodes have different images under {mixed}" in message, message
        assert "pin it with hybrid_image_base_id" in message
        for name, host in hosts.items():
            assert image_id(host, test_alias) == "", f"{name}: the alias moved"
    finally:
        for host in hosts.values():
            host.run(f"docker image rm {test_alias} {mixed}")


def test_base_that_imports_the_architectures_is_served_as_it_is(pair_with_images, hosts):
    """The sim's base (Ray 2.60, vLLM 0.32 CPU in the system Python) knows the wanted
    architectures: the alias (under a test name) points at it on every node, and nothing is
    built and the donor is not read."""
    test_alias = f"{TEST_NAME}:current"
    try:
        report = playbook("playbooks/images.yml", "-e", f"hybrid_image_name={TEST_NAME}")
        assert report["rc"] == 0, failures(report)
        ran = {name for name, _host, res in results(report) if not res.get("skipped")}
        assert "Point the serving alias at the base" in ran
        assert "Build the image under its unverified tag" not in ran
        assert "Read the donor's model registry against the base's" not in ran
        said = " ".join(str(res.get("msg", "")) for _n, _h, res in results(report))
        assert "imports Qwen3MoeForCausalLM itself: it is served as it is" in said
        for host in hosts.values():
            assert image_id(host, test_alias) == image_id(host, sim_images.CLUSTER_IMAGE) != ""
    finally:
        for host in hosts.values():
            host.run(f"docker image rm {test_alias}")
