# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a probe script in a throw-away container of an image on a node's Docker.

Shared by ``vllm_registry_info`` (what the image's vLLM registers) and ``vllm_args_check``
(what the image's vLLM accepts): connect to the daemon, find the image, try each candidate
Python of the image until one exists, run the probe with no network, and read its JSON
answer. Every failure becomes an ``ImageRunError`` whose message names the node and the
image and says what to do.
"""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    ProbeError,
    is_missing_executable,
    parse_probe_output,
    python_candidates,
)

try:
    import docker
    from docker.errors import APIError, DockerException, ImageNotFound
    from requests.exceptions import RequestException
except ImportError:  # the modules report the missing library themselves
    docker = None
    APIError = DockerException = ImageNotFound = RequestException = Exception

API_TIMEOUT = 60
PROBE_LABEL = "dgx_spark.cluster.probe"


class ImageRunError(Exception):
    """A failure to report with fail_json; the message names the node and the image."""


def decode(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data or ""


def connect(docker_host: str, node: str):
    """A client of the node's Docker daemon, or an error that says how to reach it."""
    try:
        return docker.DockerClient(base_url=docker_host, version="auto", timeout=API_TIMEOUT)
    except DockerException as exc:
        raise ImageRunError(
            f"cannot reach the Docker daemon at {docker_host} on node {node}: {exc}. "
            "Check that dockerd runs there and that the task may use its socket "
            "(become: true, or membership of the docker group)"
        ) from exc


def run_once(client, image_id: str, python: str, probe: dict) -> dict:
    """Run the probe once in a throw-away container; returns its JSON document.

    ``probe``: ``entrypoint`` (a function of the Python), ``command``, ``timeout``, ``label``
    and optionally ``environment`` and ``volumes``. Raises FileNotFoundError when ``python``
    does not exist in the image.
    """
    extra = {key: probe[key] for key in ("environment", "volumes") if key in probe}
    if probe.get("device_requests"):
        extra["device_requests"] = device_requests(probe["device_requests"])
    container = client.containers.create(
        image_id,
        entrypoint=probe["entrypoint"](python),
        command=probe["command"],
        network_disabled=True,
        labels={PROBE_LABEL: probe["label"]},
        **extra,
    )
    try:
        try:
            container.start()
        except APIError as exc:
            if is_missing_executable(str(exc)):
                raise FileNotFoundError(python) from exc
            raise
        try:
            exit_code = container.wait(timeout=probe["timeout"]).get("StatusCode")
        except RequestException as exc:
            timeout = probe["timeout"]
            raise ProbeError(f"the probe did not finish within {timeout}s ({exc})") from exc
        stdout = decode(container.logs(stdout=True, stderr=False))
        stderr = decode(container.logs(stdout=False, stderr=True))
        return parse_probe_output(stdout, stderr, exit_code)
    finally:
        container.remove(force=True)


def device_requests(requests: list[dict]) -> list:
    """The Docker SDK's device requests from community.docker's form of them (driver, count,
    device_ids, capabilities, options), as docker_container sends them to the API."""
    return [
        docker.types.DeviceRequest(
            driver=r.get("driver") or "",
            count=r.get("count") if r.get("count") is not None else 0,
            device_ids=r.get("device_ids") or [],
            capabilities=r.get("capabilities") or [],
            options=r.get("options") or {},
        )
        for r in requests
    ]


def image_id_of(client, image: str) -> str | None:
    """The ID the node's Docker gives ``image``, or None when it has no such image (the probe's
    run then says so)."""
    try:
        return client.images.get(image).id
    except ImageNotFound:
        return None


def run_in_image(client, node: str, image: str, python: str, probe: dict, missing: str):
    """(image ID, probe document), trying the image's Pythons in turn (``python`` first when
    set). ``missing`` says how to get the image onto the node when it is not there."""
    try:
        found = client.images.get(image)
    except ImageNotFound as exc:
        raise ImageRunError(
            f"image {image} is not on node {node}: {missing}, or check the name with "
            "`docker image ls` there"
        ) from exc
    candidates = python_candidates((found.attrs.get("Config") or {}).get("Env"), python)
    for candidate in candidates:
        try:
            return found.id, run_once(client, found.id, candidate, probe)
        except FileNotFoundError:
            continue
        except ProbeError as exc:
            raise ImageRunError(
                f"image {image} on node {node}, probe run with {candidate}: {exc}"
            ) from exc
    raise ImageRunError(
        f"image {image} on node {node} has no Python to run the probe with (tried "
        f"{', '.join(candidates)}); name the interpreter that has vLLM with the python option"
    )
