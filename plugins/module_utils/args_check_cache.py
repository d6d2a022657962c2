# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Remember, on the node, the command lines the serving image's vLLM accepted (and what an
image's vLLM registers, for vllm_registry_info).

``vllm_args_check`` spends most of its time importing vLLM in a container. When everything
the probe reads is the same as when it last accepted, its answer is known. The key of an
answer (``cache_key``) is the SHA-256 of a canonical JSON of:

* the image's ID as the node's Docker resolves it (not its name: a moved tag is a new key);
* the arguments after ``vllm serve``, the probe container's environment, the
  ``model_config`` flag and the interpreter named with the module's ``python`` option;
* the read-only volumes as the probe mounts them, and for each host path the fingerprint
  ``tree_fingerprint`` takes of it: every file below it with its size and modification time,
  or the fact that the path does not exist;
* a digest of the probe itself (its source and the request it is given), so that a new
  collection with a changed probe asks again.

``tree_fingerprint`` (deployment_record's walker, the one the deployment record takes of the
weights) is the one part that reads the filesystem; ``cache_key`` is pure over what it
returned. ``read_entry``, ``write_entry`` and ``prune`` keep the entries, one record (the
shape of deployment_record's ``stage_record``) per key, in a directory of the node. Only
acceptances are written; the module decides.
"""

from __future__ import annotations

import contextlib
import os
import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import (
    RECORD_FORMAT,
    digest,
    read_stage_record,
    stage_record,
    write_record,
)

# Entries kept in the cache directory; the ones used least recently go first.
KEEP = 32
_ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


def volume_host(volume: str) -> str:
    """The host side of a bind spec ``host:container[:options]``."""
    return str(volume).split(":", 1)[0]


def probe_digest(entrypoint: list, request: str) -> str:
    """SHA-256 of the probe as it runs: its entrypoint (with the source) and its request."""
    return digest([list(entrypoint), request], plain=True)


def cache_key(
    image_id: str | None,
    args: list,
    environment: dict,
    model_config: bool,
    volumes: list,
    python: str | None,
    probe: str,
    trees: dict,
) -> str | None:
    """The key of an answer, or None when the configuration cannot be remembered.

    ``volumes`` are the bind specs as the probe mounts them; ``trees`` maps each one's host
    path to its ``tree_fingerprint``. None when the image's ID is unknown, when a host path
    is not absolute (a named Docker volume, whose files cannot be fingerprinted here), or
    when a fingerprint is missing or incomplete.
    """
    if not image_id:
        return None
    fingerprints = {}
    for volume in volumes:
        host = volume_host(volume)
        tree = trees.get(host)
        if not host.startswith("/") or not tree or not tree.get("complete"):
            return None
        fingerprints[host] = {"exists": bool(tree.get("exists")), "entries": tree["entries"]}
    return digest(
        {
            "version": RECORD_FORMAT,
            "image_id": image_id,
            "args": [str(a) for a in args],
            "environment": {str(k): str(v) for k, v in environment.items()},
            "model_config": bool(model_config),
            "volumes": [str(v) for v in volumes],
            "python": python,
            "probe": probe,
            "trees": fingerprints,
        },
        plain=True,
    )


def entry_path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, f"{key}.json")


def read_entry(
    cache_dir: str, key: str, document_keys: tuple = ("errors", "registries")
) -> dict | None:
    """The entry stored under ``key`` (deployment_record's shape: the key as input, the
    ``image_id`` and the probe's JSON ``document`` kept), or None when there is none, or it
    cannot be read or parsed, or it is not such an entry (such a file is ignored).
    ``document_keys``: the mappings the probe's document must hold (vllm_args_check's by
    default; vllm_registry_info's document is judged by its own reader instead)."""
    try:
        with open(entry_path(cache_dir, key), encoding="utf-8") as handle:
            entry = read_stage_record(handle.read(), required=("image_id", "document"))
    except OSError:
        return None
    if (
        entry is None
        or (entry.get("inputs") or {}).get("key") != key
        or not isinstance(entry["image_id"], str)
        or not isinstance(entry["document"], dict)
        or not all(isinstance(entry["document"].get(name), dict) for name in document_keys)
    ):
        return None
    return entry


def write_entry(cache_dir: str, key: str, image_id: str, document: dict) -> str:
    """Store the probe's document under ``key``, atomically, mode 0600 (the directory made
    0700 when missing). Returns the entry's path."""
    path = entry_path(cache_dir, key)
    write_record(path, stage_record({"key": key}, image_id=image_id, document=document))
    return path


def touch_entry(cache_dir: str, key: str) -> None:
    """Mark an entry as just used, so that ``prune`` keeps it longer."""
    with contextlib.suppress(OSError):
        os.utime(entry_path(cache_dir, key))


def prune(cache_dir: str, keep: int = KEEP) -> list[str]:
    """Delete the entries beyond the ``keep`` most recently written or used; returns the names
    deleted. Only files named like entries are considered."""
    dated = []
    try:
        with os.scandir(cache_dir) as listing:
            for item in listing:
                if not _ENTRY_NAME.match(item.name):
                    continue
                try:
                    dated.append((item.stat(follow_symlinks=False).st_mtime_ns, item.name))
                except OSError:
                    continue
    except OSError:
        return []
    dated.sort(reverse=True)
    deleted = []
    for _mtime, name in dated[keep:]:
        try:
            os.unlink(os.path.join(cache_dir, name))
            deleted.append(name)
        except OSError:
            continue
    return deleted
