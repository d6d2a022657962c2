# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which libnccl the ranks load: the serving image's or the node's (``spark_nccl_library``).

Preflight reads the NCCL version in the serving image (what its torch reports) and on each node
(the version in the file name of the node's libnccl). :func:`choose` decides from those strings
alone, so the decision is tested without a Spark:

* ``image`` / ``host``: the owner's explicit choice; it stands, with a warning where the chosen
  library is in the range with public hang reports on GB10 pairs, and refused only where a node
  has no library to load (``host`` without a libnccl on that node);
* ``auto``: the image's, unless it is in that range and every node offers one newer than the
  image's and outside the range (the same version on every node): then the node's. Where the
  image's is in the range and no node's is out of it, the run is refused with the source, and
  goes on only with an explicit ``image`` or ``host``.

Pure standard library, no Ansible imports.
"""

from __future__ import annotations

import re

MODES = ("auto", "image", "host")
# NCCL 2.28.x on two GB10 Sparks at TP=2: ranks wedged in a collective after 20-26 minutes under
# load (https://github.com/vllm-project/vllm/issues/42354) and recurring kernel hangs
# (https://github.com/vllm-project/vllm/issues/41725); the versions reported are 2.28.3 and 2.28.9.
HANG_RANGE = ((2, 28), (2, 29))  # [2.28.0, 2.29.0)
# The version the public reports on GB10 recommend (project issue #43; SIM.md's first-run facts).
RECOMMENDED_NCCL = (2, 30, 7)
SOURCES = (
    "https://github.com/vllm-project/vllm/issues/42354",
    "https://github.com/vllm-project/vllm/issues/41725",
)
_VERSION = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)")
_FILE_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")


def version_tuple(text) -> tuple[int, int, int] | None:
    """``2.28.9``, ``2.28.9+cuda13.0`` or ``2.28.9 from /path`` -> (2, 28, 9); None otherwise
    (None, '', ``none in torch (...)``: no NCCL known)."""
    match = _VERSION.match(str(text or ""))
    return tuple(int(p) for p in match.groups()) if match else None


def file_version(path) -> str:
    """The version a libnccl's real file name carries (``libnccl.so.2.28.9`` -> ``2.28.9``), ''
    when it carries none (``libnccl.so.2``)."""
    match = _FILE_VERSION.search(str(path or ""))
    return match.group(1) if match else ""


def in_hang_range(version) -> bool:
    """Whether a version (string or tuple) is in the range with public hang reports on GB10."""
    parsed = version if isinstance(version, tuple) else version_tuple(version)
    return bool(parsed) and HANG_RANGE[0] <= parsed[:2] < HANG_RANGE[1]


def _shown(version: tuple | None) -> str:
    return ".".join(map(str, version)) if version else "none"


def _range() -> str:
    return f"{HANG_RANGE[0][0]}.{HANG_RANGE[0][1]}.x"


def _why() -> str:
    recommended = ".".join(map(str, RECOMMENDED_NCCL))
    return (
        f"NCCL {_range()} has public reports of TP=2 ranks wedging in a collective on two GB10 "
        f"Sparks (vLLM issues 42354 and 41725; NCCL >= {recommended} recommended)"
    )


def choose(image_version, host_versions: dict, mode: str = "auto") -> dict:
    """Which library the ranks load, given the image's NCCL version and each node's.

    ``image_version``: the serving image's (``"2.28.9"``; None or '' when it has none, e.g. a
    CPU build). ``host_versions``: node -> the node's version (None or '' when the node has no
    libnccl). ``mode``: ``spark_nccl_library``.

    Returns ``{passed, library, message, warnings, image, hosts}``: ``library`` is ``image`` or
    ``host`` (None when refused); ``message`` one line a user can act on; ``warnings`` what the
    run goes on with despite the reports.
    """
    if mode not in MODES:
        raise ValueError(f"spark_nccl_library is {mode!r}; one of {', '.join(MODES)}")
    image = version_tuple(image_version)
    hosts = {str(node): version_tuple(v) for node, v in sorted((host_versions or {}).items())}
    seen = f"the image's NCCL {_shown(image)}; " + ", ".join(
        f"{node}'s {_shown(v)}" for node, v in hosts.items()
    )
    result = {"image": _shown(image), "hosts": {n: _shown(v) for n, v in hosts.items()}}

    def done(passed, library, message, warnings=()):
        return {**result, "passed": passed, "library": library, "message": message,
                "warnings": list(warnings)}  # fmt: skip

    if mode == "image":
        warnings = (
            [f"the ranks load the image's NCCL {_shown(image)}: {_why()}"]
            if (in_hang_range(image))
            else []
        )
        return done(True, "image", f"spark_nccl_library: image: the image's ({seen})", warnings)
    if mode == "host":
        missing = [node for node, v in hosts.items() if v is None]
        if missing:
            return done(
                False, None,
                f"spark_nccl_library: host, but {', '.join(missing)} has no libnccl whose version "
                f"its file name says ({seen}): install the node's NCCL (libnccl2) or set "
                "spark_nccl_library: image",
            )  # fmt: skip
        warnings = [
            f"{node} loads its own NCCL {_shown(v)}: {_why()}"
            for node, v in hosts.items()
            if in_hang_range(v)
        ]
        if len(set(hosts.values())) > 1:
            warnings.append(f"the nodes' NCCL versions differ ({seen})")
        return done(True, "host", f"spark_nccl_library: host: each node's ({seen})", warnings)
    # auto
    if not in_hang_range(image):
        why = (
            f"its version is outside the {_range()} range with public hang reports"
            if image
            else "its version is unknown (no NCCL in its torch), so there is nothing to weigh"
        )
        return done(True, "image", f"spark_nccl_library: auto chose the image's: {why} ({seen})")
    offered = set(hosts.values())
    newer = bool(hosts) and all(v is not None and not in_hang_range(v) and v > image
                                for v in hosts.values())  # fmt: skip
    if newer and len(offered) == 1:
        return done(
            True, "host",
            f"spark_nccl_library: auto chose the nodes' NCCL {_shown(next(iter(offered)))} over "
            f"the image's {_shown(image)}: {_why()} ({seen})",
        )  # fmt: skip
    if newer:
        reason = "the nodes offer different versions, so the ranks would run different NCCLs"
    else:
        reason = "no node offers one newer and outside that range"
    return done(
        False, None,
        f"spark_nccl_library: auto refuses to start the ranks: {_why()}; {reason} ({seen}). "
        "Install NCCL >= "
        f"{'.'.join(map(str, RECOMMENDED_NCCL))} on the nodes, or choose explicitly: "
        "spark_nccl_library: host (vLLM issue 42354 reports the DGX OS build of 2.28.9 ran a "
        "60-minute soak clean where the pip wheel's 2.28.9 wedged) or spark_nccl_library: image. "
        f"Sources: {' '.join(SOURCES)}",
    )  # fmt: skip


def choose_pair(image_versions: dict, host_versions: dict, mode: str = "auto") -> dict:
    """:func:`choose` for the pair, from what preflight read on every node.

    ``image_versions``: node -> what the serving image's probe printed there (None where the
    image is not on that node yet: the images stage builds it after preflight). ``host_versions``
    as for :func:`choose`.

    Adds ``pending`` to the result: True where ``auto`` has no image to weigh because a node
    lacks it; then ``library`` is None and the run goes on (the choice is made where the image
    is). Where the nodes' images report different NCCL versions, ``auto`` refuses and an
    explicit ``image`` goes on with a warning.
    """
    absent = sorted(str(node) for node, v in (image_versions or {}).items() if v is None)
    known = {str(node): version_tuple(v) for node, v in (image_versions or {}).items()
             if v is not None}  # fmt: skip
    if mode == "auto" and (absent or not known):
        where = ", ".join(absent) or "any node"
        return {
            "passed": True, "pending": True, "library": None, "warnings": [],
            "image": "not built", "hosts": {n: _shown(version_tuple(v))
                                            for n, v in sorted((host_versions or {}).items())},
            "message": (
                f"spark_nccl_library: auto cannot weigh the serving image's NCCL yet: the image is "
                f"not on {where} (the images stage builds it); the choice is made once it is"
            ),
        }  # fmt: skip
    versions = set(known.values())
    image = next(iter(versions)) if len(versions) == 1 else None
    result = choose(_shown(image) if image else None, host_versions, mode)
    if len(versions) > 1:
        differ = "the serving image's NCCL differs between the nodes (" + ", ".join(
            f"{node}'s {_shown(v)}" for node, v in sorted(known.items())
        ) + ")"  # fmt: skip
        if mode == "auto":
            message = (
                f"spark_nccl_library: auto refuses to start the ranks: {differ}; rebuild the "
                "image (playbooks/images.yml) so every node holds the same one, or choose "
                "spark_nccl_library: image or host"
            )
            result = {**result, "passed": False, "library": None, "message": message}
        else:
            result = {**result, "warnings": [*result["warnings"], differ]}
    return {**result, "pending": False}
