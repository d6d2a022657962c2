"""plugins/module_utils/image_run.py: a probe's container asks for the devices it is given (on a
Spark the GPU, as the ranks' containers do) in the form the Docker API takes."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import image_run
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    PROBE_MARKER,
)

SPARK_GPU = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]


def test_the_sparks_gpu_request_reaches_the_api_as_docker_container_sends_it():
    (request,) = image_run.device_requests(SPARK_GPU)
    assert dict(request) == {
        "Driver": "nvidia",
        "Count": -1,
        "DeviceIDs": [],
        "Capabilities": [["gpu"]],
        "Options": {},
    }


class _Container:
    def __init__(self):
        self.removed = False

    def start(self):
        pass

    def wait(self, timeout):
        return {"StatusCode": 0}

    def logs(self, stdout, stderr):
        return f'{PROBE_MARKER}{{"versions": {{"vllm": "0.32.0"}}}}\n'.encode() if stdout else b""

    def remove(self, force):
        self.removed = True


class _Client:
    def __init__(self):
        self.created = {}
        self.container = _Container()

    @property
    def containers(self):
        return self

    def create(self, image, **kwargs):
        self.created = {"image": image, **kwargs}
        return self.container


@pytest.mark.parametrize("devices", [[], SPARK_GPU])
def test_a_probe_container_takes_the_devices_only_when_asked(devices):
    client = _Client()
    probe = {"entrypoint": lambda py: [py, "-c", "pass"], "command": ["x"], "timeout": 5,
             "label": "test", "device_requests": devices}  # fmt: skip
    assert image_run.run_once(client, "sha256:abc", "python3", probe) == {
        "versions": {"vllm": "0.32.0"}
    }
    assert client.created["network_disabled"] is True
    assert client.container.removed
    if devices:
        assert [dict(r) for r in client.created["device_requests"]] == [
            dict(r) for r in image_run.device_requests(SPARK_GPU)
        ]
    else:
        assert "device_requests" not in client.created
