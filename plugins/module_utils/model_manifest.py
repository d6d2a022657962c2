# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Manifests of model directories: what the weights are, and whether a copy is whole.

A manifest maps each model file's path (relative to the model directory) to its size and,
when asked, its SHA-256. Two directory layouts are understood:

* ``plain``: the model directory is the given root (``config.json`` and the weights in it).
* ``hf_cache``: the root is a Hugging Face cache repository directory
  (``models--Org--Name``) holding ``blobs/``, ``refs/`` and ``snapshots/<commit>/``, whose
  entries are relative symlinks into ``../../blobs``. The model directory is the snapshot;
  its symlinks are followed to the blobs. A snapshot copied without its blobs (the known
  rsync pitfall) shows up as dangling symlinks, never as a silently empty model.

Also here: the Hub's model-info answer turned into a manifest, the size and disk checks
that run before anything is changed, and the reading of ``rsync --itemize-changes --stats``.

Standard library only; the only I/O is reading the directory being described.
"""

from __future__ import annotations

import fnmatch
import os
import re
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp
from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import (
    file_digest,
    tree_fingerprint,
)

# Files that make up a model for vLLM: weights, configs, tokenizers, chat templates,
# custom code. Matched against the file's base name.
DEFAULT_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.gguf",
    "*.json",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
    "*.py",
)

PROBLEM_KINDS = ("missing", "dangling", "escaping", "size_mismatch", "checksum_mismatch")

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")


class ManifestError(ValueError):
    """A directory or an answer that cannot be described as a model."""


# --------------------------------------------------------------------------- layout


def hf_repo_dirname(repo_id: str) -> str:
    """The cache directory name Hugging Face uses for a model repository."""
    if not _REPO_ID.match(repo_id or ""):
        raise ManifestError(f"{repo_id!r} is not a Hugging Face repository id (Org/Name)")
    return "models--" + repo_id.replace("/", "--")


def find_model_dir(root: str, revision: str = "main") -> tuple[str | None, str]:
    """Locate the model directory under ``root``: ``(model_dir, layout)``.

    ``layout`` is ``absent`` (no such directory; model_dir is None), ``plain`` or
    ``hf_cache``. For a cache repository the snapshot is ``snapshots/<revision>`` when it
    exists, else the commit named by ``refs/<revision>``, else the only snapshot.
    """
    if not os.path.isdir(root):
        return None, "absent"
    snapshots = os.path.join(root, "snapshots")
    if os.path.exists(os.path.join(root, "config.json")) or not os.path.isdir(snapshots):
        return root, "plain"
    names = sorted(n for n in os.listdir(snapshots) if os.path.isdir(os.path.join(snapshots, n)))
    if revision and revision in names:
        return os.path.join(snapshots, revision), "hf_cache"
    ref = os.path.join(root, "refs", revision) if revision else ""
    if ref and os.path.isfile(ref):
        with open(ref, encoding="utf-8") as handle:
            commit = handle.read().strip()
        if commit in names:
            return os.path.join(snapshots, commit), "hf_cache"
        raise ManifestError(
            f"{root}: refs/{revision} names commit {commit!r}, which has no snapshot "
            f"(snapshots: {', '.join(names) or 'none'})"
        )
    if len(names) == 1:
        return os.path.join(snapshots, names[0]), "hf_cache"
    raise ManifestError(
        f"{root}: a Hugging Face cache with {len(names)} snapshots "
        f"({', '.join(names) or 'none'}) and no refs/{revision}: name the snapshot's commit "
        "as the revision"
    )


# --------------------------------------------------------------------------- manifests


def matches(name: str, patterns) -> bool:
    base = name.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(base, p) for p in patterns)


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def build_manifest(
    model_dir: str,
    root: str | None = None,
    patterns=DEFAULT_PATTERNS,
    checksum: bool = True,
    workers: int = 4,
    known: dict | None = None,
    mtimes: bool = False,
) -> dict:
    """Describe ``model_dir``: ``{files, dangling, escaping, hashed, reused}``.

    ``files`` maps each relative path whose base name matches ``patterns`` to
    ``{"size": int}`` plus ``"sha256"`` when ``checksum``. Symlinks are followed. Every
    symlink (whatever its name) whose target does not exist is listed in ``dangling``;
    one that resolves outside ``root`` (default: ``model_dir``) in ``escaping``, because
    a copy of ``root`` elsewhere would leave it pointing at nothing.

    With ``mtimes``, or with ``known`` (a dict, possibly empty: the files of an earlier
    verified manifest of this directory), every entry also carries ``"mtime_ns"``; with
    ``known`` a file whose size and
    modification time equal its ``known`` entry keeps that entry's SHA-256 instead of being
    read again (``reused``); the others are read (``hashed``).
    """
    top = os.path.realpath(root or model_dir)
    walked = tree_fingerprint(model_dir, limit=None, into_links=True)
    if not walked["complete"]:
        raise OSError(f"cannot read every directory below {model_dir}")
    files: dict[str, dict] = {}
    to_hash: dict[str, str] = {}
    dangling: list[str] = []
    escaping: list[str] = []
    reused: list[str] = []
    for rel, size, mtime_ns, link in walked["entries"]:
        path = os.path.join(model_dir, rel)
        rel = rel.replace(os.sep, "/")
        if link is not None:
            if size == -1:
                dangling.append(rel)
                continue
            if not _within(os.path.realpath(path), top):
                escaping.append(rel)
        if not matches(rel, patterns) or not os.path.isfile(path):
            continue
        files[rel] = {"size": size}
        if known is not None or mtimes:
            files[rel]["mtime_ns"] = mtime_ns
        if checksum:
            if unchanged(known, rel, files[rel]):
                files[rel]["sha256"] = known[rel]["sha256"]
                reused.append(rel)
            else:
                to_hash[rel] = path
    if to_hash:
        # hashlib releases the GIL on large blocks, so several files hash at once.
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for rel, digest in zip(to_hash, pool.map(file_digest, to_hash.values()), strict=True):
                files[rel]["sha256"] = digest
    return {
        "files": files,
        "dangling": dangling,
        "escaping": escaping,
        "hashed": sorted(to_hash),
        "reused": reused,
    }


def unchanged(known: dict | None, rel: str, entry: dict) -> bool:
    """Whether ``known`` vouches for ``entry``: same size and modification time, a SHA-256."""
    old = (known or {}).get(rel)
    return bool(
        isinstance(old, dict)
        and old.get("sha256")
        and old.get("mtime_ns") is not None
        and int(old.get("size", -1)) == int(entry["size"])
        and int(old["mtime_ns"]) == int(entry.get("mtime_ns", -1))
    )


def stale(source: dict, copy: dict) -> list[str]:
    """The files of ``source`` a copy of it must bring again: those ``copy`` lacks, holds at
    another size, or holds from before the source's file last changed (both manifests with
    ``mtime_ns``; a file without one is stale). Make's rule: a copy written after its source
    changed is current, so an unchanged model is not read again to find that out."""
    found = []
    for rel in sorted(source):
        want, got = source[rel], copy.get(rel)
        if (
            not isinstance(got, dict)
            or int(got.get("size", -1)) != int(want["size"])
            or want.get("mtime_ns") is None
            or got.get("mtime_ns") is None
            or int(got["mtime_ns"]) < int(want["mtime_ns"])
        ):
            found.append(rel)
    return found


def read_record(text: str, model_dir: str | None = None) -> dict:
    """The files of the weights' stamp (plugins/module_utils/stamp.py: the model directory as
    input, the manifest of the files verified as the result), when it was made for
    ``model_dir`` (a model of the same name in another directory has its own files).

    Anything unreadable, and an older collection's own record, counts as none: the files are
    then read again.
    """
    data = stamp.read(text) or {}
    if model_dir is not None and data.get("inputs", {}).get("model_dir") != model_dir:
        return {}
    result = data.get("result")
    files = result.get("files") if isinstance(result, dict) else None
    return files if isinstance(files, dict) else {}


def total_bytes(files: dict) -> int:
    return sum(int(entry["size"]) for entry in files.values())


def compare(expected: dict, actual: dict, checksum: bool = True) -> dict:
    """Problems of ``actual`` (a build_manifest result) against ``expected`` files.

    ``expected`` maps relative path to ``{"size", "sha256"?}``; a checksum is compared only
    when ``checksum`` is true and both sides have one. Returns one list per kind in
    PROBLEM_KINDS, plus ``missing_bytes``: what a copy still has to bring.
    """
    have = actual.get("files", {})
    dangling = set(actual.get("dangling", []))
    problems: dict = {kind: [] for kind in PROBLEM_KINDS}
    problems["dangling"] = sorted(dangling)
    problems["escaping"] = sorted(actual.get("escaping", []))
    missing_bytes = 0
    for rel in sorted(expected):
        want = expected[rel]
        size = int(want["size"])
        got = have.get(rel)
        if got is None:
            if rel not in dangling:
                problems["missing"].append(rel)
            missing_bytes += size
        elif int(got["size"]) != size:
            problems["size_mismatch"].append(
                {"path": rel, "expected": size, "actual": int(got["size"])}
            )
            missing_bytes += size
        elif (
            checksum
            and want.get("sha256")
            and got.get("sha256")
            and want["sha256"] != got["sha256"]
        ):
            problems["checksum_mismatch"].append(
                {"path": rel, "expected": want["sha256"], "actual": got["sha256"]}
            )
            missing_bytes += size
    problems["missing_bytes"] = missing_bytes
    return problems


def is_clean(problems: dict) -> bool:
    return not any(problems.get(kind) for kind in PROBLEM_KINDS)


def describe(problems: dict, limit: int = 5) -> str:
    """One line per kind of problem, naming at most ``limit`` paths each."""
    labels = {
        "missing": "missing",
        "dangling": "dangling symlinks, blobs not copied",
        "escaping": "symlinks pointing outside the copied directory",
        "size_mismatch": "size differs",
        "checksum_mismatch": "SHA-256 differs",
    }
    lines = []
    for kind in PROBLEM_KINDS:
        items = problems.get(kind) or []
        if not items:
            continue
        names = [i["path"] if isinstance(i, dict) else i for i in items]
        shown = ", ".join(names[:limit]) + (
            f" and {len(names) - limit} more" if len(names) > limit else ""
        )
        lines.append(f"{labels[kind]} ({len(names)}): {shown}")
    return "; ".join(lines)


# --------------------------------------------------------------------------- Hugging Face


def hf_manifest_from_api(info: dict, patterns=DEFAULT_PATTERNS) -> dict:
    """The Hub's model info (``/api/models/<repo>/revision/<rev>?blobs=true``) as a manifest.

    Returns ``{commit, gated, private, files, total_bytes}``; LFS files carry the SHA-256
    the Hub publishes, so the head's download is checked against an independent source.
    """
    if not isinstance(info, dict):
        raise ManifestError("the Hub's model info is not a JSON object")
    commit = info.get("sha")
    if not isinstance(commit, str) or not _COMMIT.match(commit):
        raise ManifestError(f"the Hub's model info has no commit hash (sha: {commit!r})")
    files: dict[str, dict] = {}
    for sibling in info.get("siblings") or []:
        name = sibling.get("rfilename")
        if not name or not matches(name, patterns):
            continue
        lfs = sibling.get("lfs") or {}
        size = lfs.get("size", sibling.get("size"))
        if not isinstance(size, int):
            raise ManifestError(
                f"the Hub's model info has no size for {name} (ask with ?blobs=true)"
            )
        entry = {"size": size}
        if lfs.get("sha256"):
            entry["sha256"] = lfs["sha256"]
        files[name] = entry
    if not files:
        raise ManifestError(
            f"the Hub lists no model files at commit {commit} matching {list(patterns)}"
        )
    return {
        "commit": commit,
        "gated": bool(info.get("gated")),
        "private": bool(info.get("private")),
        "files": files,
        "total_bytes": total_bytes(files),
    }


# --------------------------------------------------------------------------- preflight


def human_bytes(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_capacity(
    model_bytes: int, memory_bytes: dict, fraction: float, kv_cache_bytes: int = 0
) -> list[str]:
    """Errors when the model and the KV cache its profile needs cannot fit the nodes' memory.

    Tensor parallelism puts an equal share of the weights (and of the KV cache) on every node,
    so the limit is ``fraction`` of the smallest node's memory times the number of nodes.
    """
    if not memory_bytes:
        return ["no node memory known: gather facts (memtotal_mb) on every node first"]
    if not 0 < float(fraction) <= 1:
        return [f"model_cache_max_fraction_of_memory must be above 0 and at most 1, not {fraction}"]
    smallest = min(int(v) for v in memory_bytes.values())
    nodes = len(memory_bytes)
    limit = float(fraction) * smallest * nodes
    if model_bytes + kv_cache_bytes <= limit:
        return []
    need = f"the model's files take {human_bytes(model_bytes)}"
    if kv_cache_bytes:
        need += (
            f" and its KV cache needs {human_bytes(kv_cache_bytes)} "
            "(model_cache_kv_cache_gib, from the profile)"
        )
    return [
        f"{need}, more than "
        f"model_cache_max_fraction_of_memory ({fraction}) of the memory of {nodes} node(s) "
        f"({human_bytes(limit)}: {nodes} x {human_bytes(smallest)}, the smallest node, since "
        "tensor parallelism puts an equal share on each). Choose a smaller model or profile, "
        "add nodes, or raise model_cache_max_fraction_of_memory if the serving settings leave "
        "that much."
    ]


def check_disk(node: str, path: str, free_bytes: int, missing_bytes: int) -> list[str]:
    """Errors when ``path``'s filesystem cannot take what is still missing there."""
    if missing_bytes <= free_bytes:
        return []
    return [
        f"{node}: model_cache_dir ({path}) has {human_bytes(free_bytes)} free, the model still "
        f"needs {human_bytes(missing_bytes)} there. Free space or point model_cache_dir at a "
        "larger disk."
    ]


def free_bytes(path: str) -> tuple[str, int]:
    """Free bytes for unprivileged use on the filesystem of ``path`` or its nearest parent."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    stats = os.statvfs(probe)
    return probe, stats.f_bavail * stats.f_frsize


# --------------------------------------------------------------------------- rsync

# --itemize-changes: YXcstpoguax, e.g. ">f+++++++++ a/b", "cL+++++++++ link -> target",
# ".d..t...... dir/"; deletions print "*deleting   path".
_ITEM = re.compile(r"^(?:[<>ch.][fdLDS][.+?a-zA-Z ]{7,9}|\*deleting)\s+(\S.*)$")
_STATS = {
    "files_transferred": re.compile(r"^Number of regular files transferred:\s*([\d,.]+)", re.M),
    "transferred_bytes": re.compile(r"^Total transferred file size:\s*([\d,.]+)", re.M),
    "literal_bytes": re.compile(r"^Literal data:\s*([\d,.]+)", re.M),
    "bytes_sent": re.compile(r"^Total bytes sent:\s*([\d,.]+)", re.M),
    "total_bytes": re.compile(r"^Total file size:\s*([\d,.]+)", re.M),
}


def parse_rsync(stdout: str) -> dict:
    """Changes and statistics from ``rsync --itemize-changes --stats`` output.

    ``changes`` lists itemized lines (anything rsync created, updated or deleted);
    ``literal_bytes`` is the file data that crossed the wire (0 when nothing moved).
    """
    changes = [line for line in stdout.splitlines() if _ITEM.match(line)]
    stats = {}
    for key, pattern in _STATS.items():
        found = pattern.search(stdout)
        if not found:
            raise ManifestError(f"rsync printed no statistics ({key}); was --stats given?")
        stats[key] = int(re.sub(r"[,.]", "", found.group(1)))
    return {"changes": changes, "changed": bool(changes), **stats}
