# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the model_cache role uses; thin wrappers over plugins/module_utils/model_manifest
(the operations of the one filter documented in this folder's sidecar of the same name)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_manifest as mm
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def model_cache_hf_manifest(info, patterns=None):
    """The Hub's model info as {commit, gated, private, files, total_bytes}."""
    try:
        return mm.hf_manifest_from_api(dict(info), tuple(patterns or mm.DEFAULT_PATTERNS))
    except (mm.ManifestError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"model_cache_hf_manifest: {exc}") from exc


def model_cache_capacity(model_bytes, memory_mb, fraction, kv_cache_gib=0):
    """Errors (list of str) when the model and its KV cache exceed the allowed share of the
    nodes' memory."""
    memory = {str(node): int(mb) * 1024 * 1024 for node, mb in dict(memory_mb).items()}
    kv_cache = int(float(kv_cache_gib) * 1024**3)
    return mm.check_capacity(int(model_bytes), memory, float(fraction), kv_cache)


def model_cache_disk(missing_bytes, node, path, free_bytes):
    """Errors (list of str) when a node's disk cannot take what it still lacks."""
    return mm.check_disk(str(node), str(path), int(free_bytes), int(missing_bytes))


def model_cache_rsync(stdout):
    """rsync --itemize-changes --stats output as {changed, changes, literal_bytes, ...}."""
    try:
        return mm.parse_rsync(str(stdout))
    except mm.ManifestError as exc:
        raise AnsibleFilterError(f"model_cache_rsync: {exc}") from exc


def model_cache_problems(problems):
    """A manifest comparison's problems (model_manifest's RV problems) as one line that names
    the files: missing, size or SHA-256 different, dangling or escaping links."""
    if not isinstance(problems, dict):
        raise AnsibleFilterError(
            f"model_cache_problems: expected a dict, got {type(problems).__name__}"
        )
    return mm.describe(problems) or "no problems"


def model_cache_stale(source, copy):
    """The files of the ``source`` manifest a copy must bring again: missing from ``copy``,
    of another size, or older there than in the source (both with mtime_ns)."""
    if not isinstance(source, dict) or not isinstance(copy, dict):
        raise AnsibleFilterError(
            "model_cache_stale: expected two manifests (dicts), got "
            f"{type(source).__name__} and {type(copy).__name__}"
        )
    return mm.stale(source, copy)


def model_cache_repo_dir(repo_id):
    """The Hugging Face cache directory name of a repository (models--Org--Name)."""
    try:
        return mm.hf_repo_dirname(str(repo_id))
    except mm.ManifestError as exc:
        raise AnsibleFilterError(f"model_cache_repo_id: {exc}") from exc


# The operations of the one filter this role uses, dgx_spark.cluster.model_cache:
# ``value | dgx_spark.cluster.model_cache('<operation>', ...)``.
OPERATIONS = {
    "hf_manifest": model_cache_hf_manifest,
    "capacity": model_cache_capacity,
    "disk": model_cache_disk,
    "rsync": model_cache_rsync,
    "repo_dir": model_cache_repo_dir,
    "problems": model_cache_problems,
    "stale": model_cache_stale,
}


class FilterModule:
    def filters(self):
        return {"model_cache": role_filter("model_cache", OPERATIONS)}
