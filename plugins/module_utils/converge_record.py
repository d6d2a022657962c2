# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The converge record: what the last successful converge of deploy.yml left on a node, and
what differs from it now; and the digests, the file walker and the atomic write every record
of the collection uses (the stamps: plugins/module_utils/stamp.py).

A run of deploy.yml is either a **no-op** or a **converge**. It is a no-op when on every node
the converge record (``converge_record``, one root-only file) has

* the same ``inputs``: the collection's files (one digest) and every setting the run was given
  (the values themselves, so a difference names what changed from what; a value whose name
  says it is a key, password, token or secret is kept as a digest);
* the same things ``left``: the collection's containers (ID, image, running, start time,
  restarts), the images behind the serving alias, the base and the donor, the SHA-256 of the
  host files the containers load (netplan, comm.env, the firewall's ruleset), the size and
  time of every weight file, the live firewall table;

and every running rank container runs the image behind the serving alias, and the endpoint
answers one token (the converge role asks). Anything else is a converge: every stage runs, each
idempotent by Ansible's own comparisons, and the last play writes the record anew.

``compare`` names each difference in one line; ``converge_record`` makes the record. Pure
standard library; the module (plugins/modules/converge_record.py) reads Docker and the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile

# The converge record's own shape; an older collection's per-stage record is read as none, so
# the first run after an upgrade converges.
CONVERGE_FORMAT = 2
RANK_COMPONENTS = ("ray", "vllm")
COMPONENT_LABEL = "dgx_spark.cluster.component"
# Beyond this many entries (files and directories) below one volume, the args check's
# fingerprint of it costs more than it saves; such a configuration is not remembered.
TREE_LIMIT = 20000
NO_RECORD = "no record of a converge on this node"
# What the record keeps of what a converge left.
ITEMS = ("images", "files", "trees", "tables")
LEFT = (*ITEMS, "containers")
# A setting whose value the record keeps as a digest only.
# A setting whose name ends so: spark_model_speculative_tokens is a count, not a secret.
SECRET = re.compile(r"(key|password|passwd|token|secret)$", re.IGNORECASE)


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
    """SHA-256 of a file's bytes, or '' when it cannot be read (not there, gone while read):
    the one file hash of the records and of model_manifest's checksums. It reads 8 MiB at a
    time; hashlib releases the GIL on such blocks, so threads hash several files at once."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(8 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def _stat_entry(rel: str, path: str, info: os.stat_result) -> list:
    """[relative path, size, mtime_ns, link target or None]; a link's size and time are those
    of what it names ([-1, -1] when that does not exist)."""
    if not stat.S_ISLNK(info.st_mode):
        return [rel, info.st_size, info.st_mtime_ns, None]
    target = os.readlink(path)
    try:
        followed = os.stat(path)
    except OSError:
        return [rel, -1, -1, target]
    return [rel, followed.st_size, followed.st_mtime_ns, target]


def tree_fingerprint(
    root: str, limit: int | None = TREE_LIMIT, hidden: bool = True, into_links: bool = False
) -> dict:
    """What the files below ``root`` are now, as data for ``cache_key``.

    ``{"exists", "complete", "entries"}``: ``entries`` lists ``[relative path, size,
    mtime_ns, link target]`` for every file below ``root``, sorted, ``root`` itself as ``.``
    when it is a file. Directories are walked but not listed. A link to a file is recorded
    with the size and time of the file it names (a Hub snapshot's files are links into its
    blobs). A link to a directory is recorded the same way and not walked, so the walk never
    leaves the tree; with ``into_links`` it is walked instead (model_manifest, which names
    the links that leave it), each real directory once. ``complete`` is false when the walk
    stopped: more than ``limit`` entries, or a directory that cannot be read. A ``root`` that
    does not exist is ``{"exists": False, "complete": True, "entries": []}``. With ``hidden``
    false, entries whose name starts with a dot (and what lies below them) are left out;
    ``limit`` None walks the whole tree.
    """
    try:
        top = os.stat(root)
    except FileNotFoundError:
        return {"exists": False, "complete": True, "entries": []}
    except OSError:
        return {"exists": True, "complete": False, "entries": []}
    if not stat.S_ISDIR(top.st_mode):
        return {"exists": True, "complete": True, "entries": [_stat_entry(".", root, top)]}
    entries: list[list] = []
    seen = 0
    walked = {os.path.realpath(root)}
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as listing:
                found = sorted(listing, key=lambda item: item.name)  # the same walk each time
        except OSError:
            return {"exists": True, "complete": False, "entries": []}
        if not hidden:
            found = [item for item in found if not item.name.startswith(".")]
        seen += len(found)
        if limit is not None and seen > limit:
            return {"exists": True, "complete": False, "entries": []}
        for item in found:
            rel = os.path.join(rel_dir, item.name) if rel_dir else item.name
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                entries.append([rel, -1, -1, None])  # gone since the listing
                continue
            linked = into_links and stat.S_ISLNK(info.st_mode) and os.path.isdir(item.path)
            if stat.S_ISDIR(info.st_mode) or linked:
                real = os.path.realpath(item.path) if into_links else rel
                if real not in walked:  # with into_links, each real directory once
                    walked.add(real)
                    pending.append(rel)
            else:
                entries.append(_stat_entry(rel, item.path, info))
    entries.sort(key=lambda entry: entry[0])
    return {"exists": True, "complete": True, "entries": entries}


def tree_stat(root: str) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file below root, from ``tree_fingerprint``:
    links are followed to what they name (a Hub snapshot's files are links into its blobs).
    Hidden entries (``.verified``, ``.locks``) are bookkeeping, not weights, and are left out.
    A dangling link is [-1, -1]."""
    walked = tree_fingerprint(root, limit=None, hidden=False)
    return {rel: [size, mtime] for rel, size, mtime, _link in walked["entries"]}


def digest(value, length: int | None = None, plain: bool = False) -> str:
    """SHA-256 (hex; its first ``length`` digits) of a value's canonical JSON: keys sorted,
    no spaces, ASCII. What JSON lacks is written as its str(), or with ``plain`` refused
    (TypeError). The one digest of settings, inputs and plans that every stage records."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=None if plain else str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:length]


def write_record(path: str, record: dict, mode: int = 0o600, dir_mode: int = 0o700) -> None:
    """Write a record as JSON, atomically (a temporary file in the same directory, then
    renamed over it), with ``mode``; a missing directory is made with ``dir_mode``."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=dir_mode, exist_ok=True)
        os.chmod(directory, dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, sort_keys=True, indent=1)
            handle.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest() if text else ""


def _image_reasons(before: dict, now: dict) -> list[str]:
    """The images the settings name now that are not what the last converge left. An image recorded
    by an earlier run that the settings no longer name (another base given to one run of the
    images stage) is no difference: nothing of this deployment uses it, and the setting that
    named it is judged as a setting."""
    reasons = []
    for ref in sorted(now):
        old, new = short(before.get(ref, "")), short(now.get(ref, ""))
        if before.get(ref, "") != now.get(ref, ""):
            reasons.append(f"{ref} is {new} (was {old} at the last converge)")
    return reasons


def _file_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for path in sorted(set(before) | set(now)):
        old, new = before.get(path, ""), now.get(path, "")
        if old == new:
            continue
        state = "gone since" if not new else ("not there at" if not old else "edited since")
        reasons.append(f"{path}: {state} the last converge")
    return reasons


def _some(names: list[str]) -> str:
    """The first three names, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _tree_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for root in sorted(set(before) | set(now)):
        old, new = before.get(root) or {}, now.get(root) or {}
        changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
        if changed:
            named = _some(changed)
            reasons.append(f"{root}: {named} changed, appeared or went since the last converge")
    return reasons


def _table_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    for table in sorted(set(before) | set(now)):
        old, new = before.get(table, ""), now.get(table, "")
        if old == new:
            continue
        state = "gone" if not new else ("loaded" if not old else "differs")
        reasons.append(f"nftables table {table}: {state} since the last converge")
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
    """A line for each container that moved since the last converge recorded it."""
    reasons = []
    for name in sorted(set(recorded) | set(containers)):
        before, now = recorded.get(name), containers.get(name)
        if before is None:
            reasons.append(f"{name}: not there at the last converge")
        elif now is None:
            reasons.append(f"{name}: gone")
        elif before["id"] != now["id"]:
            reasons.append(f"{name}: recreated")
        elif before["running"] and not now["running"]:
            reasons.append(f"{name}: not running")
        elif before != now:
            reasons.append(f"{name}: restarted or changed since the last converge")
    return reasons


def shorten(value, width: int = 40) -> str:
    """A value as one short line: a string as it is, anything else as JSON; cut to ``width``.
    The one way a record's reasons and a stamp's (plugins/module_utils/stamp.py) show a value."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split()) if "\n" not in text else text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def recorded_inputs(settings: dict, common: dict) -> dict:
    """What a converge record keeps of what a run was given: ``common`` (the inventory's
    nodes and groups, the collection's digest) and each setting by name; a secret's value as
    ``sha256:<12 hex digits>`` of it."""
    kept = {}
    for name, value in settings.items():
        kept[name] = f"sha256:{digest(value, 12)}" if SECRET.search(name) else value
    return {"common": common, "settings": kept}


def _input_reasons(before: dict, now: dict) -> list[str]:
    reasons = []
    old_common, new_common = before.get("common") or {}, now.get("common") or {}
    for name in sorted(set(old_common) | set(new_common)):
        if old_common.get(name) != new_common.get(name):
            what = "the collection's files" if name == "collection" else f"the inventory's {name}"
            reasons.append(f"{what} changed since the last converge")
    old, new = before.get("settings") or {}, now.get("settings") or {}
    for name in sorted(set(old) | set(new)):
        if name in old and name in new and old[name] == new[name]:
            continue
        was, shown = shorten(old.get(name), 60), shorten(new.get(name), 60)
        if name not in new:
            reasons.append(f"{name}: no longer set (was {was})")
        elif name not in old:
            reasons.append(f"{name}: set to {shown} (not set at the last converge)")
        else:
            reasons.append(f"{name}: {was} -> {shown}")
    return reasons


def read_converge_record(text: str | None) -> dict | None:
    """The converge record from its JSON text; None when absent, unreadable or of another
    shape (an older collection's record: the next run converges)."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != CONVERGE_FORMAT:
        return None
    if not isinstance(data.get("inputs"), dict) or not isinstance(data.get("left"), dict):
        return None
    return data


def compare(record: dict | None, now: dict) -> list[str]:
    """What differs between a node's converge record and the node now, one line each; empty
    when the node is as the last converge left it.

    ``now`` has ``inputs`` (``recorded_inputs``), what is left (``containers``, ``images``,
    ``files``, ``trees``, ``tables``) and ``serving_image`` ({"ref", "id"}), which is checked
    against the running containers and not recorded."""
    serving = now.get("serving_image") or {}
    reasons = rank_image_reasons(
        serving.get("ref", ""), serving.get("id", ""), now.get("containers") or {}
    )
    if not record:
        return [NO_RECORD, *reasons]
    was = record["left"]
    reasons += _input_reasons(record["inputs"], now.get("inputs") or {})
    reasons += _container_reasons(was.get("containers") or {}, now.get("containers") or {})
    for kind, found in zip(
        ITEMS, (_image_reasons, _file_reasons, _tree_reasons, _table_reasons), strict=True
    ):
        reasons += found(was.get(kind) or {}, now.get(kind) or {})
    return reasons


def converge_record(now: dict, at: str) -> dict:
    """The record a successful converge writes: ``now``'s inputs and what it left, and when."""
    left = {kind: now.get(kind) or {} for kind in LEFT}
    return {"format": CONVERGE_FORMAT, "at": at, "inputs": now.get("inputs") or {}, "left": left}
