# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The records the stages keep on a node, and what a full run of deploy.yml left there.

Every record has one shape (``stage_record``): ``format``, ``inputs`` (what the stage was
given, resolved), ``digest`` (of the inputs) and what it found or left. ``read_stage_record``
reads one back, ``inputs_changed`` names the inputs that differ from it, ``write_record``
writes it atomically. The link check's record (link_plan), the collective's
(rank_collective), the weights' verification (model_manifest), the args check's answers
(args_check_cache) and the deployment record below are such records; ``digest`` and
``tree_fingerprint`` are the one digest and the one walker they all use.

The deployment record (``deployment_state``, one file per node) holds under ``stages`` one such
record per stage of deploy.yml, which the stage writes at its end (its playbook's last task,
alone or within deploy.yml): its inputs are the digest of every setting the stage reads and of
the inventory and the collection (deploy_stages.fingerprints). Under ``left``, what the stages
left, each part refreshed by the stage that writes it:

* ``containers``: the collection's containers (ID, image, component, running, start, restarts);
  a stage refreshes those of the components it starts (the serve stage the Ray containers too,
  which it moves to a new image);
* ``images``: the IDs behind the references the images stage reads (the serving alias, the
  cluster base and the donor): a donor pulled anew changes what it would build;
* ``files``: the SHA-256 of the host files host_prep writes and the containers load (netplan,
  comm.env, the firewall's ruleset);
* ``trees``: size and modification time of every file below a directory (the weights): a
  file replaced, truncated or edited in place by hand changes them, and reading 119 GB again
  on every rerun would not take seconds;
* ``tables``: a digest of each live nftables table (stateless listing, so counters do not
  count): a table flushed by hand differs from the file that loaded it.

A stage's entry in that table may also list what it is ``handed`` by the stages before it
(the host files the ranks load, the weights, the Ray containers the serving group runs in);
its record keeps a digest of each as it was when the stage ran (``handed``). So when a run
starts at an earlier stage, a later one is asked again at its turn and runs only when its own
record differs: a firewall rule changed by host_prep leaves the ranks alone, a comm.env it
rewrote does not.

``compare_stages`` names each difference in one line with the stage of deploy.yml it concerns:
a stage without a record or whose inputs changed, and for what was left the first stage that
leaves it (the deploy_state role's table of what each stage leaves, in deploy.yml's order).
A full run starts at the earliest over all nodes (the controller knows the stages' order:
plugins/plugin_utils/deploy_stages.py), as the stages before it have nothing to do. Besides
the record, it checks that every running rank-holding container (components ``ray`` and
``vllm``) runs the image behind the serving alias: after ``playbooks/images.yml`` moved the
alias, the containers still run the old one, and the rerun must say so instead of "in step".

Pure standard library; the module reads Docker and the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile

# The shape of every record (stage_record); a record of another format is read as none.
RECORD_FORMAT = 1
RANK_COMPONENTS = ("ray", "vllm")
COMPONENT_LABEL = "dgx_spark.cluster.component"
# Beyond this many entries (files and directories) below one volume, the args check's
# fingerprint of it costs more than it saves; such a configuration is not remembered.
TREE_LIMIT = 20000
NO_RECORD = "no record of a run of deploy.yml's stages on this node"
# What the stages leave that a record keeps item by item (by reference, path, root, table).
ITEMS = ("images", "files", "trees", "tables")
# What the record keeps of what the stages left: those, and the containers.
LEFT = (*ITEMS, "containers")
# What a stage leaves, by kind, in the role's table of what each stage leaves: the items, and
# the components whose containers it starts or moves.
KINDS = (*ITEMS, "components")


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


def stage_record(inputs: dict, **kept) -> dict:
    """What a stage keeps on a node: ``format``, ``inputs`` (what it was given, resolved),
    ``digest`` (16 hex digits of the inputs' digest) and what it found or left (``kept``)."""
    return {"format": RECORD_FORMAT, "inputs": inputs, "digest": digest(inputs, 16), **kept}


def valid_record(data, required=()) -> dict | None:
    """A record as parsed, or None when it is no mapping, of another format, with ``inputs``
    that are no mapping, or without one of the ``required`` keys."""
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return None
    if not isinstance(data.get("inputs", {}), dict) or any(k not in data for k in required):
        return None
    return data


def read_stage_record(text: str | None, required=()) -> dict | None:
    """A record from its JSON text (``valid_record``), or None when absent or unreadable."""
    try:
        return valid_record(json.loads(text or ""), required)
    except ValueError:
        return None


def inputs_changed(record: dict | None, inputs: dict) -> list[str] | None:
    """None without a record; else the names of the inputs that differ from the record's,
    sorted (``["inputs"]`` where only the digest tells), empty when it was made with these."""
    if not record:
        return None
    if record.get("digest") == digest(inputs, 16):
        return []
    old = record.get("inputs") or {}
    return sorted(k for k in set(old) | set(inputs) if old.get(k) != inputs.get(k)) or ["inputs"]


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


def _image_reasons(before: dict, now: dict) -> list[tuple[str, str]]:
    """The images the settings name now that are not what the last run left. An image recorded
    by an earlier run that the settings no longer name (another base given to one run of the
    images stage) is no difference: nothing of this deployment uses it, and the setting that
    named it is judged as a setting."""
    reasons = []
    for ref in sorted(now):
        old, new = short(before.get(ref, "")), short(now.get(ref, ""))
        if before.get(ref, "") != now.get(ref, ""):
            reasons.append((ref, f"{ref} is {new} (was {old} at the last run)"))
    return reasons


def _file_reasons(before: dict, now: dict) -> list[tuple[str, str]]:
    reasons = []
    for path in sorted(set(before) | set(now)):
        old, new = before.get(path, ""), now.get(path, "")
        if old == new:
            continue
        state = "gone since" if not new else ("not there at" if not old else "edited since")
        reasons.append((path, f"{path}: {state} the last run"))
    return reasons


def _some(names: list[str]) -> str:
    """The first three names, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _tree_reasons(before: dict, now: dict) -> list[tuple[str, str]]:
    reasons = []
    for root in sorted(set(before) | set(now)):
        old, new = before.get(root) or {}, now.get(root) or {}
        changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
        if changed:
            named = _some(changed)
            reasons.append((root, f"{root}: {named} changed, appeared or went since the last run"))
    return reasons


def _table_reasons(before: dict, now: dict) -> list[tuple[str, str]]:
    reasons = []
    for table in sorted(set(before) | set(now)):
        old, new = before.get(table, ""), now.get(table, "")
        if old == new:
            continue
        state = "gone" if not new else ("loaded" if not old else "differs")
        reasons.append((table, f"nftables table {table}: {state} since the last run"))
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


def _container_reasons(recorded: dict, containers: dict) -> list[tuple[str, str]]:
    """(component, reason) for each container that moved since a stage recorded it."""
    reasons = []
    for name in sorted(set(recorded) | set(containers)):
        before, now = recorded.get(name), containers.get(name)
        component = (now or before or {}).get("component", "")
        if before is None:
            reasons.append((component, f"{name}: not there at the last run"))
        elif now is None:
            reasons.append((component, f"{name}: gone"))
        elif before["id"] != now["id"]:
            reasons.append((component, f"{name}: recreated"))
        elif before["running"] and not now["running"]:
            reasons.append((component, f"{name}: not running"))
        elif before != now:
            reasons.append((component, f"{name}: restarted or changed since the last run"))
    return reasons


def handed(spec: dict | None, now: dict) -> dict[str, str]:
    """What a stage was handed by the stages before it, as ``now`` has it: ``{"<kind> <item>":
    16 hex digits of its digest}`` for each item ``spec`` (kind -> items, KINDS) names; a
    component stands for its containers. Its record keeps these (``recorded``)."""
    found = {}
    for kind in KINDS:
        for item in (spec or {}).get(kind) or []:
            if kind == "components":
                containers = now.get("containers") or {}
                value = {n: c for n, c in containers.items() if c.get("component") == item}
            else:
                value = (now.get(kind) or {}).get(item)
            found[f"{kind} {item}"] = digest(value, 16)
    return found


def _handed_reasons(sections: dict, now: dict, left: dict, named: set) -> list[tuple[str, str]]:
    """(stage, reason) for each stage whose record was handed something other than what the
    node has now (``handed`` in its entry of ``left``), unless the comparison named that item
    already (``named``: "<kind> <item>"): the stage that leaves it runs first, and this one is
    asked again when its turn comes (deploy.yml runs a later stage only when it differs)."""
    reasons = []
    for stage, kinds in left.items():
        section = valid_record(sections.get(stage))
        if section is None:
            continue  # named already: no record of the stage
        was = section.get("handed") or {}
        for key, value in handed(kinds.get("handed"), now).items():
            if key in named or was.get(key) == value:
                continue
            kind, item = key.split(" ", 1)
            what = f"the {item} containers" if kind == "components" else item
            reasons.append((stage, f"{what}: changed since the {stage} stage last ran"))
    return reasons


def owners(left: dict) -> dict[tuple[str, str], str]:
    """(kind, item) -> the first stage, in ``left``'s order (deploy.yml's), that leaves it:
    ``left`` maps each stage to what it leaves by kind (KINDS)."""
    found: dict[tuple[str, str], str] = {}
    for stage, kinds in left.items():
        for kind in KINDS:
            for item in kinds.get(kind) or []:
                found.setdefault((kind, item), stage)
    return found


def _input_reasons(sections: dict, fingerprint: dict) -> list[tuple[str, str]]:
    """(stage, reason) for each stage given (``fingerprint``: stage -> its inputs now) whose
    record is missing or whose inputs differ, naming the settings that changed."""
    reasons = []
    for stage, inputs in fingerprint.items():
        changed = inputs_changed(valid_record(sections.get(stage)), inputs)
        if changed is None:
            reasons.append((stage, f"no record of the {stage} stage on this node"))
        elif changed:
            names = ["the inventory or the collection" if n == "common" else n for n in changed]
            reasons.append((stage, f"the {stage} stage's inputs changed: {_some(names)}"))
    return reasons


def read_deployment_record(text: str | None) -> dict | None:
    """The deployment record from its JSON text; None when absent or of another shape (an
    older collection's single record: every stage runs once)."""
    record = read_stage_record(text, required=("stages", "left"))
    if record is None or not isinstance(record["stages"], dict):
        return None
    return record if isinstance(record["left"], dict) else None


def compare_stages(record: dict | None, now: dict, left: dict) -> list[tuple[str, str]]:
    """What differs between a node's deployment record and the node now, as (the stage
    concerned, the reason).

    ``now`` has ``fingerprint`` (stage -> the inputs each stage would record now), what the
    stages leave (``containers``, ``images``, ``files``, ``trees``, ``tables``) and
    ``serving_image`` ({"ref", "id"}), which is checked against the running containers and
    not recorded. ``left`` (stage -> what it leaves, in deploy.yml's order) names the stage
    each difference concerns: the first that leaves the item; the first stage for what no
    stage leaves, and for a node without a record."""
    first = next(iter(left), "")
    owner = owners(left)
    serving = now.get("serving_image") or {}
    ranks = owner.get(("components", "ray"), first)
    reasons = [
        (ranks, reason)
        for reason in rank_image_reasons(
            serving.get("ref", ""), serving.get("id", ""), now.get("containers") or {}
        )
    ]
    if not record:
        return [(first, NO_RECORD), *reasons]
    was = record["left"]
    reasons += _input_reasons(record["stages"], now.get("fingerprint") or {})
    named = set()
    for component, reason in _container_reasons(
        was.get("containers") or {}, now.get("containers") or {}
    ):
        named.add(f"components {component}")
        reasons.append((owner.get(("components", component), first), reason))
    for kind, found in (
        ("images", _image_reasons),
        ("files", _file_reasons),
        ("trees", _tree_reasons),
        ("tables", _table_reasons),
    ):
        for item, reason in found(was.get(kind) or {}, now.get(kind) or {}):
            named.add(f"{kind} {item}")
            reasons.append((owner.get((kind, item), first), reason))
    return reasons + _handed_reasons(record["stages"], now, left, named)


def compare(record: dict | None, now: dict, left: dict) -> list[str]:
    """The reasons of compare_stages, one line each; empty when the node is in step."""
    return [reason for _stage, reason in compare_stages(record, now, left)]


def stages_concerned(stage_reasons: list[tuple[str, str]]) -> list[str]:
    """The stages the reasons concern, each once, in the reasons' order; empty when none."""
    return list(dict.fromkeys(stage for stage, _reason in stage_reasons))


def recorded(record: dict | None, now: dict, stage: str, components=()) -> dict:
    """The deployment record after ``stage`` ran: its stage record made of
    ``now["fingerprint"][stage]`` and what it was handed (``now["handed"]``, from
    ``handed``, where it is handed anything); of what was left, each image, file, tree and
    table given in ``now`` as it is now (the others as recorded) and the containers of
    ``components`` as they are now (those of other components as recorded)."""
    record = record or {"stages": {}, "left": {}}
    kept = {"handed": now["handed"]} if now.get("handed") else {}
    stages = {**record["stages"], stage: stage_record(now["fingerprint"][stage], **kept)}
    left = {kind: dict(record["left"].get(kind) or {}) for kind in LEFT}
    for kind in ITEMS:
        left[kind].update(now.get(kind) or {})
    kept = {n: c for n, c in left["containers"].items() if c.get("component") not in components}
    fresh = {n: c for n, c in (now.get("containers") or {}).items() if c["component"] in components}
    left["containers"] = {**kept, **fresh}
    return {"format": RECORD_FORMAT, "stages": stages, "left": left}
