# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a full run of deploy.yml left on a node, and what differs from it now.

The record (``deployment_state``) holds, per node:

* ``fingerprint``: a digest of everything the run was given (settings, inventory, collection);
* ``containers``: the collection's containers (ID, image, component, running, start, restarts);
* ``images``: the IDs behind the references the stages read (the serving alias, the cluster
  base and the donor): a donor pulled anew changes what the images stage would build;
* ``files``: the SHA-256 of the host files the stages wrote and the containers load (netplan,
  comm.env, the firewall's ruleset);
* ``trees``: size and modification time of every file below a directory (the weights): a
  file replaced, truncated or edited in place by hand changes them, and reading 119 GB again
  on every rerun would not take seconds;
* ``tables``: a digest of each live nftables table (stateless listing, so counters do not
  count): a table flushed by hand differs from the file that loaded it.

``compare`` names each difference in one line. Besides the record, it checks that every
running rank-holding container (components ``ray`` and ``vllm``) runs the image behind the
serving alias: after ``playbooks/images.yml`` moved the alias, the containers still run the
old one, and the rerun must say so instead of "in step".

Pure standard library; the module reads Docker and the files.
"""

from __future__ import annotations

import hashlib
import os

RANK_COMPONENTS = ("ray", "vllm")
COMPONENT_LABEL = "dgx_spark.cluster.component"
SETTINGS_CHANGED = "the settings, inventory or collection changed since the last full deploy"
NO_RECORD = "no record of a full deploy on this node"


def short(image_id: str) -> str:
    """sha256:0123456789ab (the 12 hex digits Docker prints), or 'nothing'."""
    if not image_id:
        return "nothing"
    algo, colon, digits = image_id.partition(":")
    return f"{algo}{colon}{digits[:12]}" if digits else image_id[:19]


def snapshot(inspected: list[dict]) -> dict:
    """The parts of ``docker inspect`` answers that change when a container is touched."""
    containers = {}
    for attrs in inspected:
        state = attrs.get("State") or {}
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        containers[attrs["Name"].lstrip("/")] = {
            "id": attrs["Id"],
            "image": attrs.get("Image", ""),
            "component": labels.get(COMPONENT_LABEL, ""),
            "running": bool(state.get("Running")),
            "started_at": state.get("StartedAt", ""),
            "restarts": int(attrs.get("RestartCount") or 0),
        }
    return containers


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes, or '' when it is not there."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def tree_stat(root: str) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file below root; links are followed to
    what they name (a Hub snapshot's files are links into its blobs). Hidden entries
    (``.verified``, ``.locks``) are bookkeeping, not weights. A dangling link is [-1, -1]."""
    out: dict[str, list[int]] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = os.path.join(directory, name)
            try:
                info = os.stat(path)
                out[os.path.relpath(path, root)] = [info.st_size, info.st_mtime_ns]
            except OSError:
                out[os.path.relpath(path, root)] = [-1, -1]
    return out


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest() if text else ""


def _image_reasons(before: dict, now: dict) -> list[str]:
    return [
        f"{ref} is {short(now.get(ref, ''))} "
        f"(was {short(before.get(ref, ''))} at the last full deploy)"
        for ref in sorted(set(before) | set(now))
        if before.get(ref, "") != now.get(ref, "")
    ]


def _file_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for path in sorted(set(before) | set(now)):
        old, new = before.get(path, ""), now.get(path, "")
        if old == new:
            continue
        if not new:
            reasons.append(f"{path}: gone since the last full deploy")
        elif not old:
            reasons.append(f"{path}: not there at the last full deploy")
        else:
            reasons.append(f"{path}: edited since the last full deploy")
    return reasons


def _tree_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for root in sorted(set(before) | set(now)):
        old, new = before.get(root) or {}, now.get(root) or {}
        changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
        if not changed:
            continue
        named = ", ".join(changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        reasons.append(f"{root}: {named} changed, appeared or went since the last full deploy")
    return reasons


def _table_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for table in sorted(set(before) | set(now)):
        old, new = before.get(table, ""), now.get(table, "")
        if old == new:
            continue
        state = "gone" if not new else ("loaded" if not old else "differs")
        reasons.append(f"nftables table {table}: {state} since the last full deploy")
    return reasons


def rank_image_reasons(serving_ref: str, serving_id: str, containers: dict) -> list[str]:
    """A running rank-holding container on another image than the serving alias names."""
    if not serving_ref:
        return []
    return [
        f"{serving_ref} is {short(serving_id)} but {name} runs {short(attrs['image'])}"
        for name, attrs in sorted(containers.items())
        if attrs.get("component") in RANK_COMPONENTS
        and attrs.get("running")
        and attrs.get("image") != serving_id
    ]


def _container_reasons(recorded: dict, containers: dict) -> list[str]:
    reasons = []
    for name in sorted(set(recorded) | set(containers)):
        before, now = recorded.get(name), containers.get(name)
        if before is None:
            reasons.append(f"{name}: not there at the last full deploy")
        elif now is None:
            reasons.append(f"{name}: gone")
        elif before["id"] != now["id"]:
            reasons.append(f"{name}: recreated")
        elif before["running"] and not now["running"]:
            reasons.append(f"{name}: not running")
        elif before != now:
            reasons.append(f"{name}: restarted or changed since the last full deploy")
    return reasons


def compare(record: dict | None, now: dict) -> list[str]:
    """What differs between the record of the last full deploy and this node now.

    ``now`` has the record's keys (``fingerprint``, ``containers``, ``images``, ``files``,
    ``trees``, ``tables``) plus ``serving_image`` ({"ref", "id"}), which is checked against
    the running containers and not recorded."""
    serving = now.get("serving_image") or {}
    reasons = rank_image_reasons(
        serving.get("ref", ""), serving.get("id", ""), now.get("containers") or {}
    )
    if not record:
        return [NO_RECORD, *reasons]
    if record.get("fingerprint") != now.get("fingerprint"):
        reasons.append(SETTINGS_CHANGED)
    reasons += _container_reasons(record.get("containers") or {}, now.get("containers") or {})
    reasons += _image_reasons(record.get("images") or {}, now.get("images") or {})
    reasons += _file_reasons(record.get("files") or {}, now.get("files") or {})
    reasons += _tree_reasons(record.get("trees") or {}, now.get("trees") or {})
    reasons += _table_reasons(record.get("tables") or {}, now.get("tables") or {})
    return reasons


def recorded(now: dict) -> dict:
    """What is written: everything compared against later, not the alias check's input."""
    return {key: value for key, value in now.items() if key != "serving_image"}
