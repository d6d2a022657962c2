"""The Sparks' GPU request, as community.docker sends it to Docker.

The sim's nodes have no NVIDIA container runtime, so no test there creates a container with
``spark_container_device_requests``: here the sparks inventory's value goes through
community.docker's own option spec (the validation docker_container applies) and its own
conversion into the API's ``HostConfig.DeviceRequests``, which is what the NVIDIA runtime reads
(``--gpus all`` on the command line sends the same request). Every container that takes the
setting is listed, so a new one that forgets it fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.community.docker.plugins.module_utils.module_container import (
    base,
    docker_api,
)

ROOT = Path(__file__).resolve().parents[3]
SPARKS = ROOT / "inventories" / "sparks" / "group_vars" / "all" / "cluster.yml"
# The containers the ranks run in, and the probe that reads the serving image on a node.
TAKERS = [
    "roles/ray_cluster/tasks/container.yml",
    "roles/vllm_serve/tasks/container.yml",
    "roles/ray_cluster/tasks/probe.yml",
    "roles/host_prep/tasks/verify_nccl_torch.yml",
]


def what_community_docker_sends(value: list[dict]) -> list[dict]:
    """docker_container's validation of ``device_requests``, then its API conversion."""
    (option,) = base.OPTION_DEVICE_REQUESTS.options
    spec = {
        option.name: {
            "type": "list",
            "elements": "dict",
            "options": option.ansible_suboptions,
        }
    }
    validated = ArgumentSpecValidator(spec).validate({option.name: value})
    assert not validated.error_messages, validated.error_messages
    return docker_api._preprocess_device_requests(
        None, None, None, validated.validated_parameters[option.name]
    )


def test_the_sparks_request_every_gpu_through_nvidia_runtime():
    value = yaml.safe_load(SPARKS.read_text(encoding="utf-8"))["spark_container_device_requests"]
    assert what_community_docker_sends(value) == [
        {
            "Driver": "nvidia",
            "Count": -1,
            "DeviceIDs": None,
            "Capabilities": [["gpu"]],
            "Options": None,
        }
    ]


def test_a_request_community_docker_refuses_is_caught():
    with pytest.raises(AssertionError, match="count"):
        what_community_docker_sends(
            [{"driver": "nvidia", "count": "all", "capabilities": [["gpu"]]}]
        )


@pytest.mark.parametrize("path", TAKERS)
def test_every_container_of_the_ranks_takes_the_request(path):
    text = (ROOT / path).read_text(encoding="utf-8")
    assert 'device_requests: "{{ spark_container_device_requests | default(omit) }}"' in text


def _module_calls(module: str):
    for path in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        for task in _flat(yaml.safe_load(path.read_text(encoding="utf-8")) or []):
            if module in task:
                yield path.relative_to(ROOT), task["name"], task[module]


def _flat(tasks):
    for task in tasks:
        yield task
        yield from _flat(task.get("block") or [])


def test_every_probe_that_imports_in_an_image_takes_the_gpu_request():
    """The registry's imports and the image report start the image's torch and vLLM: on a
    Spark they meet the GPU as the ranks will."""
    calls = [
        (path, name, args)
        for path, name, args in _module_calls("dgx_spark.cluster.vllm_registry_info")
        if args.get("mode") == "import" or args.get("report")
    ]
    assert len(calls) >= 4, calls
    for path, name, args in calls:
        assert args.get("device_requests") == (
            "{{ spark_container_device_requests | default([]) }}"
        ), f"{path}: {name}"
