# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options and requirements of every module that runs a probe in an image on the node's
Docker (plugins/module_utils/image_run.py)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
requirements:
  - Docker SDK for Python (C(docker), Debian's C(python3-docker)) on the target node
  - access to the node's Docker daemon socket, usually with the task keyword C(become)
options:
  python:
    description:
      - The Python interpreter inside the image that has vLLM installed (in each image the
        module reads).
      - By default C($VIRTUAL_ENV/bin/python3) when the image sets C(VIRTUAL_ENV), then
        C(python3), then C(python), found through the image's C(PATH).
    type: str
  docker_host:
    description:
      - The Docker daemon on the node to talk to.
      - Falls back to the E(DOCKER_HOST) environment variable of the module's process.
    type: str
    default: unix:///var/run/docker.sock
  timeout:
    description:
      - Seconds a probe container may run (importing vLLM and torch) before the module gives
        up on it.
    type: int
    default: 300
"""
