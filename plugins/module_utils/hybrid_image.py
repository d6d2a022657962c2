# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure logic of the hybrid_image role: what goes into the serving image and its tag.

The role builds the serving image from a cluster base (Ray, the multi-node entrypoint, an
older vLLM) and a donor (a newer vLLM that knows the wanted architectures). Everything here
is a function of values the role has already read (``docker image inspect`` output, the
``vllm_registry_info`` results, file lists): no Docker, no I/O.

* ``input_digest``: the 12-hex tag derived from every input of a build.
* ``merge_env``: the environment of an overlay image, from the donor's and the base's
  ``Config.Env``; ``instruction``: one Dockerfile ``ENV`` or ``LABEL`` that sets it (or the
  image's labels).
* ``cluster_files``: the base's entrypoint scripts that the overlay carries over.
* ``wheel_target``: the ``pip download`` target (Python, ABI, manylinux platforms) for the
  Python inside an image.
* ``transplant_plan`` / ``patch_registry``: the donor's model files and registry entries
  copied into the base (the transplant strategy).
"""

from __future__ import annotations

import ast
import json
import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import digest
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_registry import (
    MERGED_NAME,
    MODELS_PACKAGE,
    RegistryParseError,
    parse_registry,
    qualify_module,
)

DIGEST_LENGTH = 12

# Keys that describe the base's own Python or library paths: an overlay runs the donor's
# Python, so carrying them would point it at files the overlay does not have.
DEFAULT_ENV_SKIP = (
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "CONDA_PREFIX",
)

# Entrypoint programs under these directories belong to the operating system, which the
# donor has its own copy of.
SYSTEM_DIRS = ("/bin/", "/sbin/", "/usr/bin/", "/usr/sbin/", "/lib/", "/lib64/", "/usr/lib/")

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GLIBC = re.compile(r"^(\d+)\.(\d+)")
_PYTHON = re.compile(r"^(\d+)\.(\d+)")
# manylinux legacy aliases (PEP 599 / 571 / 513): name -> glibc minor, and where they exist.
_LEGACY_MANYLINUX = (
    ("manylinux2014", 17, ("x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x")),
    ("manylinux2010", 12, ("x86_64", "i686")),
    ("manylinux1", 5, ("x86_64", "i686")),
)
_MACHINES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


class HybridImageError(ValueError):
    """An input the role cannot build from; the message says what to change."""


# --------------------------------------------------------------------------- the tag


def input_digest(inputs: object, length: int = DIGEST_LENGTH) -> str:
    """A short hex digest of ``inputs`` (any JSON value), stable across runs and hosts.

    Keys are sorted, so the order in which the role collects inputs does not matter.
    """
    try:
        return digest(inputs, length, plain=True)
    except (TypeError, ValueError) as exc:
        raise HybridImageError(f"build inputs are not plain data: {exc}") from exc


# --------------------------------------------------------------------------- environment


def parse_env(items: list[str] | dict | None) -> dict[str, str]:
    """``Config.Env`` (``["K=V", ...]``) as an ordered dict; a dict passes through."""
    if isinstance(items, dict):
        return {str(k): str(v) for k, v in items.items()}
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    return env


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return bool(prefix) and (path == prefix or path.startswith(prefix + "/"))


def merge_env(
    donor_env: list[str] | dict | None,
    base_env: list[str] | dict | None,
    overrides: dict | None = None,
    skip: list[str] | tuple[str, ...] = DEFAULT_ENV_SKIP,
) -> dict[str, object]:
    """The overlay's environment: the donor's, plus what only the base sets.

    The donor's value wins where both set a key (its Python, libraries and vLLM run the
    image). ``PATH`` keeps the donor's entries first and appends the base's others, except
    those inside the base's virtualenv (the cluster layer is installed into the donor's
    Python). Keys in ``skip`` are never taken from the base. ``overrides`` win over both.

    Returns ``env`` (the whole environment), ``set`` (what differs from the donor's, i.e.
    what the Dockerfile must set), and for the record ``carried`` (keys taken from the
    base), ``kept_donor`` (keys where the base's other value was dropped), ``skipped`` and
    ``path_added``.
    """
    donor, base = parse_env(donor_env), parse_env(base_env)
    skip_set = set(skip or ())
    base_venv = base.get("VIRTUAL_ENV", "")
    merged = dict(donor)
    carried: list[str] = []
    kept: list[str] = []
    skipped: list[str] = []
    for key, value in base.items():
        if key == "PATH":
            continue
        if key in skip_set:
            if donor.get(key) != value:
                skipped.append(key)
            continue
        if key in donor:
            if donor[key] != value:
                kept.append(key)
            continue
        merged[key] = value
        carried.append(key)
    path = [p for p in donor.get("PATH", "").split(":") if p]
    added = []
    for entry in base.get("PATH", "").split(":"):
        if entry and entry not in path and not _under(entry, base_venv):
            path.append(entry)
            added.append(entry)
    if path:
        merged["PATH"] = ":".join(path)
    for key, value in (overrides or {}).items():
        if not _ENV_KEY.match(str(key)):
            raise HybridImageError(f"environment variable name {key!r} is not valid")
        merged[str(key)] = "" if value is None else str(value)
    changes = {k: v for k, v in merged.items() if donor.get(k) != v}
    return {
        "env": merged,
        "set": changes,
        "carried": carried,
        "kept_donor": kept,
        "skipped": skipped,
        "path_added": added,
    }


def _quote(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise HybridImageError(f"an environment or label value cannot hold a line break: {value!r}")
    # The builder expands $VAR inside ENV and LABEL, also within double quotes: escape it.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_INSTRUCTION_KEYS = {"ENV": ("environment variable", _ENV_KEY), "LABEL": ("label", _LABEL_KEY)}


def instruction(keyword: str, pairs: dict) -> str:
    """One Dockerfile ``ENV`` or ``LABEL`` instruction that sets every pair (values taken
    literally), or "" when there is none. One instruction, not one per pair: the legacy builder
    makes every instruction a container and a commit, which the containerd image store takes
    seconds for on an image of vLLM's size."""
    if keyword not in _INSTRUCTION_KEYS:
        raise HybridImageError(f"instruction must be ENV or LABEL, not {keyword!r}")
    what, valid = _INSTRUCTION_KEYS[keyword]
    parts = []
    for key, value in pairs.items():
        if not valid.match(str(key)):
            raise HybridImageError(f"{what} name {key!r} is not valid")
        parts.append(f"{key}={_quote(str(value))}")
    return f"{keyword} " + " \\\n    ".join(parts) if parts else ""


# --------------------------------------------------------------------------- cluster layer


def cluster_files(
    entrypoint: list[str] | str | None,
    extra: list[str] | None = None,
    base_venv: str = "",
) -> list[str]:
    """Files the overlay copies from the base: its entrypoint scripts, then ``extra``.

    An entrypoint element counts when it is an absolute path outside the system
    directories and the base's virtualenv (``/usr/local/bin/cluster-entrypoint``, or the
    script in ``["/bin/bash", "/opt/start.sh"]``); interpreters and options do not.
    """
    if isinstance(entrypoint, str):
        entrypoint = [entrypoint]
    found: list[str] = []
    for element in entrypoint or []:
        element = str(element)
        if (
            element.startswith("/")
            and not any(c.isspace() for c in element)
            and not element.startswith(SYSTEM_DIRS)
            and not _under(element, base_venv)
            and element not in found
        ):
            found.append(element)
    for path in extra or []:
        path = str(path)
        if not path.startswith("/"):
            raise HybridImageError(
                f"hybrid_image_cluster_files: {path!r} must be an absolute path in the base image"
            )
        if path not in found:
            found.append(path.rstrip("/") or "/")
    return found


# --------------------------------------------------------------------------- wheelhouse


def wheel_platforms(machine: str, glibc: str) -> list[str]:
    """manylinux platform tags an image with this machine and glibc runs, newest first.

    ``pip download --platform`` matches tags literally (``manylinux_2_17_x86_64`` does not
    match a wheel tagged ``manylinux2014_x86_64``), so every tag the image can run is listed.
    """
    arch = _MACHINES.get(str(machine).lower(), str(machine).lower())
    match = _GLIBC.match(str(glibc or ""))
    if not match:
        raise HybridImageError(
            f"the image's C library is not glibc ({glibc or 'unknown'}): the cluster layer "
            "is installed from manylinux wheels, which need glibc"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if major != 2:
        raise HybridImageError(f"unexpected glibc version {glibc}")
    floor = 5 if arch in ("x86_64", "i686") else 17
    if minor < floor:
        raise HybridImageError(f"glibc {glibc} is older than any manylinux wheel for {arch}")
    tags = []
    for version in range(minor, floor - 1, -1):
        tags.append(f"manylinux_2_{version}_{arch}")
        for name, legacy, arches in _LEGACY_MANYLINUX:
            if legacy == version and arch in arches:
                tags.append(f"{name}_{arch}")
    return tags


def wheel_target(
    python_version: str, machine: str, glibc: str, requirements: list[str]
) -> dict[str, object]:
    """What ``pip download`` needs to fetch wheels for a Python inside an image.

    ``key`` names the wheelhouse directory: one per requirement set and target.
    """
    match = _PYTHON.match(str(python_version or ""))
    if not match:
        raise HybridImageError(f"cannot read the image's Python version {python_version!r}")
    major, minor = match.group(1), match.group(2)
    platforms = wheel_platforms(machine, glibc)
    arch = _MACHINES.get(str(machine).lower(), str(machine).lower())
    reqs = [str(r) for r in requirements]
    if not reqs:
        raise HybridImageError("no requirements to download")
    digest = input_digest({"requirements": reqs, "python": f"{major}.{minor}", "p": platforms})
    name = re.sub(r"[^A-Za-z0-9.]+", "-", reqs[0]).strip("-")
    return {
        "python_version": f"{major}.{minor}",
        "implementation": "cp",
        "abi": f"cp{major}{minor}",
        "platforms": platforms,
        "requirements": reqs,
        "key": f"{name}-cp{major}{minor}-{arch}-{digest[:8]}",
    }


# --------------------------------------------------------------------------- transplant


def _model_path(entry: dict) -> str:
    """Where a registry entry's code lives: the file, or the package directory."""
    path = str(entry["file"])
    suffix = "/__init__.py"
    return path[: -len(suffix)] if path.endswith(suffix) else path


def transplant_plan(
    requested: list[str], donor_archs: dict[str, dict], base_archs: dict[str, dict]
) -> dict[str, object]:
    """The donor's model files and registry entries that a transplant copies into the base.

    ``donor_archs`` / ``base_archs`` are ``vllm_registry_info``'s ``architectures`` maps.
    Every requested architecture's model file comes from the donor (the base's copy may be
    older); a registry entry is added where the base lacks the architecture or registers it
    elsewhere. Paths are relative to the directory holding the ``vllm`` package.
    """
    files: list[str] = []
    entries: dict[str, list[str]] = {}
    registered: list[str] = []
    for arch in requested:
        donor = donor_archs.get(arch)
        if donor is None:
            raise HybridImageError(f"{arch} is not in the donor's model registry")
        if not donor.get("file") or donor.get("file_present") is False:
            raise HybridImageError(
                f"{arch}: the donor registers {donor.get('module')} but its file "
                f"{donor.get('file')} is not in the donor image"
            )
        path = _model_path(donor)
        if path not in files:
            files.append(path)
        base = base_archs.get(arch)
        if base and (base.get("module"), base.get("class")) == (donor["module"], donor["class"]):
            registered.append(arch)
        else:
            entries[arch] = [str(donor["module"]), str(donor["class"])]
    return {"files": files, "entries": entries, "already_registered": registered}


def registry_module_name(module: str) -> str:
    """The name a registry entry uses: relative to the model package where possible.

    Releases before 0.22 prefix every entry with ``vllm.model_executor.models.``; later ones
    also accept a fully qualified name, which is kept for modules outside that package.
    """
    prefix = MODELS_PACKAGE + "."
    return module[len(prefix) :] if module.startswith(prefix) else module


def _merged_dict(tree: ast.Module) -> ast.Dict:
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == MERGED_NAME for t in targets):
            if not isinstance(node.value, ast.Dict):
                raise HybridImageError(
                    f"the base's registry builds {MERGED_NAME} with "
                    f"{type(node.value).__name__}, not a dict display; it cannot be patched"
                )
            return node.value
    raise HybridImageError(f"the base's registry has no {MERGED_NAME} to add entries to")


def patch_registry(text: str, entries: dict[str, list[str] | tuple[str, str]]) -> str:
    """The base's ``registry.py`` with ``entries`` (arch -> (module, class)) added.

    The entries go at the end of the merged ``_VLLM_MODELS`` display, so they win over
    any earlier entry of the same architecture. The result is parsed again and must list
    every entry, or HybridImageError says why. The text ends with a line break either way
    (command output arrives without its last one).
    """
    if not text.endswith("\n"):
        text += "\n"
    if not entries:
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise HybridImageError(f"the base's registry is not valid Python: {exc}") from exc
    display = _merged_dict(tree)
    # ast offsets count UTF-8 bytes within a line, so slice the encoded text.
    raw = text.encode("utf-8")
    starts = [0]
    for line in raw.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    close = starts[display.end_lineno - 1] + display.end_col_offset - 1
    if raw[close : close + 1] != b"}":
        raise HybridImageError(f"cannot find the end of {MERGED_NAME} in the base's registry")
    head = raw[:close].rstrip()
    sep = b"" if head.endswith((b"{", b",")) else b","
    lines = ["    # Added by dgx_spark.cluster hybrid_image (transplant) from the donor image."]
    for arch, (module, cls) in entries.items():
        name = registry_module_name(str(module))
        lines.append(f"    {json.dumps(str(arch))}: ({json.dumps(name)}, {json.dumps(str(cls))}),")
    patched = (head + sep + b"\n" + "\n".join(lines).encode("utf-8") + b"\n" + raw[close:]).decode(
        "utf-8"
    )
    try:
        merged = parse_registry(patched)
    except (RegistryParseError, SyntaxError) as exc:
        raise HybridImageError(f"the patched registry cannot be read back: {exc}") from exc
    for arch, (module, cls) in entries.items():
        if merged.get(arch) != (qualify_module(registry_module_name(str(module))), str(cls)):
            raise HybridImageError(f"the patched registry does not list {arch} as intended")
    return patched


# --------------------------------------------------------------------------- the inputs
# Checked by the validate entry point on every node, before any host changes.

# Ray's token authentication (RAY_AUTH_MODE=token, which ray_cluster uses) exists from 2.52.
RAY_TOKEN_AUTH_MIN = "2.52.0"
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPO_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)")

HOW_TO_GET = {
    "hybrid_image_base": (
        "the cluster base is built locally by the spark-vllm-docker project's build script on "
        "each Spark (nothing pulls it); build it there, or copy it with docker save | docker load"
    ),
    "hybrid_image_donor": (
        "pull it on the node (docker pull), or set hybrid_image_pull: true to let preflight pull it"
    ),
}


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.52.0`` -> (2, 52, 0); ``2.52.0rc1`` -> (2, 52, 0); empty when not a version."""
    match = _RELEASE.match((text or "").strip())
    if not match:
        return ()
    parts = tuple(int(p) for p in match.group(1).split("."))
    return parts + (0,) * max(0, 3 - len(parts))


def check_image(host: str, var: str, ref: str, found_id: str, pin_var: str, pin: str) -> list[str]:
    """An input image as the node's Docker has it: present, and the pinned ID when pinned.

    ``ref`` may be ``name:tag`` or ``name@sha256:<digest>`` (a registry digest, which pins
    the content by itself); ``pin`` an image ID (``sha256:<64 hex>``) or empty.
    """
    if not ref:
        return [f"{host}: {var} is empty; it must name an image ({HOW_TO_GET.get(var, '')})"]
    errors = check_pin(host, ref, pin_var, pin)
    if not found_id:
        errors.append(f"{host}: {var} ({ref}) is not on this node: {HOW_TO_GET.get(var, '')}")
    elif pin and _IMAGE_ID.match(pin) and found_id != pin:
        errors.append(
            f"{host}: {var} ({ref}) is {found_id} here, but {pin_var} pins {pin}: load the "
            f"pinned image on {host}, or change {pin_var}"
        )
    return errors


def check_pin(host: str, ref: str, pin_var: str, pin: str) -> list[str]:
    """A pin, when given, must be an image ID."""
    if pin and not _IMAGE_ID.match(pin):
        return [
            f"{host}: {pin_var} ({pin}) must be an image ID, sha256: and 64 hex digits "
            f"(docker image inspect --format '{{{{.Id}}}}' {ref})"
        ]
    return []


def is_pinned(ref: str, pin: str) -> bool:
    """Whether an input is fixed by content: an image ID pin or a name@sha256: reference."""
    return bool(_IMAGE_ID.match(pin or "") or _REPO_DIGEST.match(ref or ""))


def cluster_ray(strategy: str, base_ray: str, override: str = "", serve_base: bool = False):
    """(version, where it comes from) of the Ray the serving image will run."""
    if strategy == "overlay" and override and not serve_base:
        return override, "hybrid_image_ray_version (installed into the donor by the overlay)"
    return base_ray or "", "the base (hybrid_image_base)"


def check_ray_token_auth(host: str, version: str, source: str, minimum: str = RAY_TOKEN_AUTH_MIN):
    """Errors when the Ray that will run the cluster lacks token authentication."""
    if not version:
        return [
            f"{host}: {source} has no Ray; the cluster needs Ray {minimum} or newer "
            "(token authentication, RAY_AUTH_MODE=token): use a base with Ray"
        ]
    if version_tuple(version) < version_tuple(minimum):
        return [
            f"{host}: {source} has Ray {version}; the cluster's token authentication "
            f"(RAY_AUTH_MODE=token) needs Ray {minimum} or newer: rebuild the base with a "
            "newer Ray, or with hybrid_image_strategy=overlay set hybrid_image_ray_version "
            f"to {minimum} or newer"
        ]
    return []


def builds_to_remove(
    images: list[dict], repository: str, keep: int, in_use: list[str]
) -> list[str]:
    """The tags to take off the builds of ``repository`` beyond the newest ``keep``.

    ``images`` lists the node's images as Docker's image list gives them (``Id``,
    ``RepoTags``, ``Created`` in epoch seconds); ``in_use`` the image IDs that a container,
    running or stopped, was made from, and the alias's. An image is a build of the
    repository when one of its tags is in it; a verified build has a tag without the
    ``-unverified`` suffix, a rejected one only that tag. The newest ``keep`` verified builds
    and every build in use stay; a rejected build (kept for inspection) stays while it is
    newer than the oldest of those, or while there is room for more verified builds: it
    counts for nothing, so rejections never push a verified build out. What is returned is
    the others' tags in the repository, oldest build first: with its last tag gone, Docker
    removes the image, and one a user also tagged elsewhere keeps that tag and its layers.
    """
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise HybridImageError(
            f"hybrid_image_keep_builds ({keep!r}) must be a whole number, 1 or more"
        )
    prefix = repository + ":"

    def tags(image: dict) -> list[str]:
        return sorted(tag for tag in image.get("RepoTags") or [] if tag.startswith(prefix))

    def created(image: dict) -> int:
        return int(image.get("Created") or 0)

    builds = [image for image in images if tags(image)]
    builds.sort(key=lambda image: (created(image), image["Id"]), reverse=True)
    verified = [i for i in builds if any(not t.endswith("-unverified") for t in tags(i))]
    kept = verified[:keep]
    used = set(in_use)

    def stays(image: dict) -> bool:
        if image["Id"] in used:
            return True
        if image in verified:
            return image in kept
        return len(kept) < keep or created(image) >= created(kept[-1])

    return [tag for image in reversed(builds) if not stays(image) for tag in tags(image)]
