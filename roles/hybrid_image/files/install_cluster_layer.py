# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Install the cluster layer's Python packages into this image, offline.

Runs during the image build with the Python that has vLLM:

    python install_cluster_layer.py WHEELHOUSE REQUIREMENT...

* pip runs from its wheel in WHEELHOUSE, so the image needs no pip of its own, and nothing
  is fetched (--no-index).
* Every distribution the image already has is pinned at its installed version (a
  constraint each), except the ones named by the requirements: a requirement that would
  change one of the donor's packages fails the build and pip names the conflict, instead
  of silently replacing what the donor's vLLM was built against.

Standard library only: it runs under whatever Python the image has.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_VERSION = re.compile(r"^[0-9A-Za-z.+!_-]+$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if not match:
        raise SystemExit(f"install_cluster_layer: cannot read the requirement {requirement!r}")
    return canonical(match.group(1))


def installed_pins(skip: set[str]) -> list[str]:
    """name==version for every installed distribution not in ``skip`` (first one wins)."""
    pins: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        version = dist.version
        if not name or not version or not _VERSION.match(version):
            continue
        key = canonical(name)
        if key in skip or key in pins:
            continue
        pins[key] = version
    return [f"{key}=={version}" for key, version in sorted(pins.items())]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    wheelhouse, requirements = argv[1], argv[2:]
    pips = sorted(glob.glob(os.path.join(wheelhouse, "pip-*.whl")))
    if not pips:
        print(f"install_cluster_layer: no pip wheel in {wheelhouse}", file=sys.stderr)
        return 2
    pins = installed_pins({requirement_name(r) for r in requirements})
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(pins) + "\n")
        constraints = handle.name
    env = dict(
        os.environ,
        # The image's Python may be a distribution's own (PEP 668); this is its build.
        PIP_BREAK_SYSTEM_PACKAGES="1",
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_ROOT_USER_ACTION="ignore",
    )
    command = [
        sys.executable,
        os.path.join(pips[-1], "pip"),
        "install",
        "--no-index",
        "--find-links",
        wheelhouse,
        "--no-cache-dir",
        "--no-warn-script-location",
        "--constraint",
        constraints,
        *requirements,
    ]
    print(f"install_cluster_layer: {len(pins)} installed distributions pinned", flush=True)
    try:
        code = subprocess.call(command, env=env)
    finally:
        os.unlink(constraints)
    if code != 0:
        print(
            "install_cluster_layer: pip could not install "
            f"{' '.join(requirements)} without changing the image's own packages "
            "(see pip's message above)",
            file=sys.stderr,
        )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
