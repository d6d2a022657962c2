# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which libnccl the ranks load: the serving image's or the node's (``spark_nccl_library``).

A libnccl is known by its version and its build: the same version can be different binaries
(the pip wheel's 2.28.9 and DGX OS's 2.28.9 are), and one of those builds wedged TP=2 pairs
where the other ran clean. Preflight reads the NCCL version the serving image's torch reports
and the build of the library torch maps (its size and ELF build ID, ``elf_notes``), and on each
node the version in the file name of the node's libnccl and its build. :func:`choose` decides
from those alone, so the decision is tested without a Spark:

* ``image`` / ``host``: the owner's explicit choice; it stands, with a warning where the chosen
  library is in the range with public hang reports on GB10 pairs (unless its build is one known
  to run clean), and refused only where a node has no library to load;
* ``auto``: the image's, unless it is in that range and not a build known to run clean; then
  the nodes' where every node offers the same library and it is known good: newer and outside
  the range, a build known to run clean, or, where the image carries a pip wheel's build, another
  build of at least the image's version (the public fix: DGX OS's libnccl2 in place of the
  wheel's). Where nothing known good is on offer the run is refused, naming every build weighed,
  and goes on only with an explicit ``image`` or ``host``.

Pure standard library, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.elf_notes import (
    build_text,
    short_build,
)

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
HANGS = "hangs"
CLEAN = "clean"
# Builds the public record tells apart, by the first eight hex digits of their ELF build ID:
# the pip wheel nvidia-nccl-cu13 2.28.9 (219 MB) and DGX OS's libnccl2 2.28.9 (190 MB) are
# different binaries, and loading DGX OS's took a TP=2 pair of Sparks from a watchdog timeout at
# ~20 minutes to a clean 60-minute soak, 420/420 requests (vLLM issues 41725 and 42354,
# 2026-07-23). Both are aarch64 builds: the x86-64 wheel of 2.28.9 has another ID (9fcf74d9,
# 217995896 bytes, read on a lent H100), and is known here only as a wheel's build.
KNOWN_BUILDS = {
    "a7f420a1": {
        "version": (2, 28, 9),
        "name": "the pip wheel nvidia-nccl-cu13's build",
        "verdict": HANGS,
        "evidence": "TP=2 ranks on two Sparks hit the watchdog timeout at ~20 minutes "
        "(vLLM issues 41725 and 42354)",
    },
    "c0db9360": {
        "version": (2, 28, 9),
        "name": "DGX OS's libnccl2 build",
        "verdict": CLEAN,
        "evidence": "a TP=2 pair of Sparks ran a 60-minute soak clean, 420/420 requests "
        "(vLLM issues 41725 and 42354)",
    },
}
_VERSION = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)")
_FILE_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")
# Where pip installs a wheel's files (nvidia-nccl-cu*: <site>/nvidia/nccl/lib/libnccl.so.2).
_WHEEL_DIRS = ("/site-packages/", "/dist-packages/")


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


def normal_build(raw) -> dict | None:
    """A build as ``elf_notes.library_build`` reports it, or None where nothing was read (None,
    not a dict, or neither a size nor a build nor an error)."""
    if not isinstance(raw, dict) or not any(raw.get(k) for k in ("size", "build_id", "sha256")):
        return None
    size = raw.get("size")
    return {
        "path": str(raw.get("path") or ""),
        "real_path": str(raw.get("real_path") or raw.get("path") or ""),
        "size": int(size) if isinstance(size, int) or str(size or "").isdigit() else None,
        "build_id": str(raw["build_id"]).lower() if raw.get("build_id") else None,
        "sha256": str(raw["sha256"]).lower() if raw.get("sha256") else None,
    }


def identity(build: dict | None) -> tuple[str, str] | None:
    """What tells two builds apart: the build ID, else the file's sha256; None where unknown."""
    build = build or {}
    if build.get("build_id"):
        return ("build_id", build["build_id"])
    if build.get("sha256"):
        return ("sha256", build["sha256"])
    return None


def known_build(build: dict | None) -> dict | None:
    """The public record's entry for a build (:data:`KNOWN_BUILDS`), None where it has none."""
    found = (build or {}).get("build_id") or ""
    return next((entry for key, entry in KNOWN_BUILDS.items() if found.startswith(key)), None)


def from_wheel(build: dict | None) -> bool:
    """Whether a library file is a pip wheel's (it lies under a site-packages directory)."""
    real = (build or {}).get("real_path") or ""
    return any(part in real for part in _WHEEL_DIRS)


def _clean(build) -> bool:
    return (known_build(build) or {}).get("verdict") == CLEAN


def _shown(version: tuple | None) -> str:
    return ".".join(map(str, version)) if version else "none"


def _weighed(version: tuple | None, build: dict | None) -> str:
    """``2.28.9 (190.0 MB, build c0db9360, /usr/lib/...: DGX OS's libnccl2 build)``."""
    if not build:
        return _shown(version)
    entry = known_build(build)
    where = build["real_path"] or build["path"]
    return (
        f"{_shown(version)} ({build_text(build)}"
        + (f", {where}" if where else "")
        + (f": {entry['name']}" if entry else "")
        + ")"
    )


def _range() -> str:
    return f"{HANG_RANGE[0][0]}.{HANG_RANGE[0][1]}.x"


def _why() -> str:
    recommended = ".".join(map(str, RECOMMENDED_NCCL))
    return (
        f"NCCL {_range()} has public reports of TP=2 ranks wedging in a collective on two GB10 "
        f"Sparks (vLLM issues 42354 and 41725; NCCL >= {recommended} recommended)"
    )


def _why_not(version: tuple | None, build: dict | None) -> str:
    """Why a library is a risk: its build's own report, else the range's."""
    entry = known_build(build)
    if entry and entry["verdict"] == HANGS:
        return f"its build is {entry['name']}, with which {entry['evidence']}"
    return _why()


def _risky(version: tuple | None, build: dict | None) -> bool:
    """In the range with hang reports, or a build with its own, and not a build known clean."""
    entry = known_build(build) or {}
    return (in_hang_range(version) or entry.get("verdict") == HANGS) and not _clean(build)


def _wheel_build_in_range(image, build) -> bool:
    """The case of the public reports: the image's library is a pip wheel's build in the range
    (by where it lies, or by its build ID)."""
    entry = known_build(build) or {}
    return in_hang_range(image) and (from_wheel(build) or entry.get("verdict") == HANGS)


def _offer(image, image_build, version, build) -> tuple[str | None, str]:
    """Whether a node's libnccl is a known-good way out of the image's: ``(why it is, '')`` or
    ``(None, why it is not)``."""
    entry = known_build(build)
    if version is None:
        return None, "no libnccl whose version its file name says"
    if entry and entry["verdict"] == HANGS:
        return None, f"{entry['name']}, which has hang reports too"
    if not in_hang_range(version) and version > image:
        return f"newer and outside the {_range()} range", ""
    if entry and entry["verdict"] == CLEAN:
        return f"{entry['name']}, with which {entry['evidence']}", ""
    if version < image:
        return None, f"{_shown(version)}, older than the image's"
    if identity(build) and identity(build) == identity(image_build):
        return None, f"the same build as the image's ({short_build(build)})"
    if _wheel_build_in_range(image, image_build) and identity(build):
        return (
            "another build than the pip wheel's in the image (the public fix: DGX OS's "
            "libnccl2 in place of the wheel's, vLLM issues 41725 and 42354)"
        ), ""
    if not identity(build):
        return None, f"{_shown(version)}, whose build was not read"
    return None, f"{_shown(version)}, a build not known to run clean"


def choose(
    image_version,
    host_versions: dict,
    mode: str = "auto",
    image_build: dict | None = None,
    host_builds: dict | None = None,
) -> dict:
    """Which library the ranks load, given the image's NCCL and each node's.

    ``image_version``: the serving image's (``"2.28.9"``; None or '' when it has none, e.g. a
    CPU build). ``host_versions``: node -> the node's version (None or '' when the node has no
    libnccl). ``image_build``, ``host_builds`` (node -> build): the builds as
    ``elf_notes.library_build`` reads them, None where not read. ``mode``: ``spark_nccl_library``.

    Returns ``{passed, library, message, warnings, image, hosts, image_build, host_builds}``:
    ``library`` is ``image`` or ``host`` (None when refused); ``message`` one line a user can act
    on, naming every build weighed; ``warnings`` what the run goes on with despite the reports.
    """
    if mode not in MODES:
        raise ValueError(f"spark_nccl_library is {mode!r}; one of {', '.join(MODES)}")
    ibuild = normal_build(image_build)
    builds = {str(n): normal_build(b) for n, b in (host_builds or {}).items()}
    image = version_tuple(image_version)
    hosts = {}
    for node, v in sorted((host_versions or {}).items()):
        build = builds.get(str(node))
        # A file name without a version (libnccl.so.2 alone) is still known by a known build.
        hosts[str(node)] = version_tuple(v) or (known_build(build) or {}).get("version")
    hbuilds = {node: builds.get(node) for node in hosts}
    seen = f"the image's NCCL {_weighed(image, ibuild)}; " + ", ".join(
        f"{node}'s {_weighed(v, hbuilds[node])}" for node, v in hosts.items()
    )
    result = {"image": _shown(image), "hosts": {n: _shown(v) for n, v in hosts.items()},
              "image_build": ibuild, "host_builds": hbuilds}  # fmt: skip

    def done(passed, library, message, warnings=()):
        return {**result, "passed": passed, "library": library, "message": message,
                "warnings": list(warnings)}  # fmt: skip

    if mode == "image":
        risk = _why_not(image, ibuild)
        warnings = (
            [f"the ranks load the image's NCCL {_weighed(image, ibuild)}: {risk}"]
            if _risky(image, ibuild)
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
            f"{node} loads its own NCCL {_weighed(v, hbuilds[node])}: {_why_not(v, hbuilds[node])}"
            for node, v in hosts.items()
            if _risky(v, hbuilds[node])
        ]
        if len({(v, identity(hbuilds[n])) for n, v in hosts.items()}) > 1:
            warnings.append(f"the nodes' NCCL versions or builds differ ({seen})")
        return done(True, "host", f"spark_nccl_library: host: each node's ({seen})", warnings)
    # auto
    if image is None:
        return done(
            True, "image",
            "spark_nccl_library: auto chose the image's: its version is unknown (no NCCL in its "
            f"torch), so there is nothing to weigh ({seen})",
        )  # fmt: skip
    if not _risky(image, ibuild):
        why = (
            f"its build is {known_build(ibuild)['name']}, with which "
            f"{known_build(ibuild)['evidence']}"
            if _clean(ibuild)
            else f"its version is outside the {_range()} range with public hang reports"
        )
        return done(True, "image", f"spark_nccl_library: auto chose the image's: {why} ({seen})")
    offers = {node: _offer(image, ibuild, v, hbuilds[node]) for node, v in hosts.items()}
    offered = {(v, identity(hbuilds[node])) for node, v in hosts.items()}
    all_good = bool(offers) and all(offer[0] for offer in offers.values())
    if all_good and len(offered) == 1:
        version = next(iter(offered))[0]
        why = next(iter(offers.values()))[0]
        return done(
            True, "host",
            f"spark_nccl_library: auto chose the nodes' NCCL {_shown(version)} over the image's "
            f"{_shown(image)}: {_why_not(image, ibuild)}; the nodes' is {why} ({seen})",
        )  # fmt: skip
    if all_good:
        reason = (
            "the nodes offer different versions or builds, so the ranks would run different NCCLs"
        )
    elif offers:
        lacking: dict[str, list[str]] = {}
        for node, (why, why_not) in offers.items():
            if not why:
                lacking.setdefault(why_not, []).append(node)
        reason = "nothing known good is on offer: " + "; ".join(
            f"on {' and '.join(nodes)}, {why_not}" for why_not, nodes in lacking.items()
        )
    else:
        reason = "nothing known good is on offer: no node was weighed"
    return done(
        False, None,
        f"spark_nccl_library: auto refuses to start the ranks: {_why_not(image, ibuild)}; "
        f"{reason} ({seen}). Install on the nodes DGX OS's libnccl2 (its 2.28.9 build "
        f"c0db9360 ran clean) or NCCL >= {'.'.join(map(str, RECOMMENDED_NCCL))}, or choose "
        "explicitly: spark_nccl_library: host or spark_nccl_library: image. "
        f"Sources: {' '.join(SOURCES)}",
    )  # fmt: skip


def choose_pair(
    image_versions: dict,
    host_versions: dict,
    mode: str = "auto",
    image_builds: dict | None = None,
    host_builds: dict | None = None,
) -> dict:
    """:func:`choose` for the pair, from what preflight read on every node.

    ``image_versions``: node -> the version the serving image's probe printed there (None where
    the image is not on that node yet: the images stage builds it after preflight);
    ``image_builds``: node -> the build of the library the image's torch maps there.
    ``host_versions``, ``host_builds`` as for :func:`choose`.

    Adds ``pending`` to the result: True where ``auto`` has no image to weigh because a node
    lacks it; then ``library`` is None and the run goes on (the choice is made where the image
    is). Where the nodes' images report different NCCL versions or builds, ``auto`` refuses and
    an explicit ``image`` goes on with a warning.
    """
    image_builds = image_builds or {}
    absent = sorted(str(node) for node, v in (image_versions or {}).items() if v is None)
    known = {str(node): (version_tuple(v), normal_build(image_builds.get(node)))
             for node, v in (image_versions or {}).items() if v is not None}  # fmt: skip
    if mode == "auto" and (absent or not known):
        where = ", ".join(absent) or "any node"
        return {
            "passed": True, "pending": True, "library": None, "warnings": [],
            "image": "not built", "image_build": None,
            "hosts": {n: _shown(version_tuple(v))
                      for n, v in sorted((host_versions or {}).items())},
            "host_builds": {str(n): normal_build(b) for n, b in (host_builds or {}).items()},
            "message": (
                f"spark_nccl_library: auto cannot weigh the serving image's NCCL yet: the image is "
                f"not on {where} (the images stage builds it); the choice is made once it is"
            ),
        }  # fmt: skip
    images = {(v, identity(b)) for v, b in known.values()}
    first = next(iter(known.values()), (None, None))
    same = len(images) == 1
    result = choose(
        _shown(first[0]) if same and first[0] else None,
        host_versions,
        mode,
        first[1] if same else None,
        host_builds,
    )
    if not same:
        differ = "the serving image's NCCL differs between the nodes (" + ", ".join(
            f"{node}'s {_weighed(v, b)}" for node, (v, b) in sorted(known.items())
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
