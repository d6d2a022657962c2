# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the hybrid_image role uses; thin wrappers over plugins/module_utils/hybrid_image.py."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import hybrid_image
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def _wrap(func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except hybrid_image.HybridImageError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def hybrid_image_digest(inputs):
    """The 12-hex tag of a build from all of its inputs (any plain data)."""
    return _wrap(hybrid_image.input_digest, inputs)


def hybrid_image_env(donor_env, base_env, overrides=None, skip=None):
    """The overlay's environment: {env, set, carried, kept_donor, skipped, path_added}."""
    skip = hybrid_image.DEFAULT_ENV_SKIP if skip is None else list(skip)
    return _wrap(hybrid_image.merge_env, donor_env, base_env, dict(overrides or {}), skip)


def hybrid_image_instruction(pairs, keyword):
    """One Dockerfile ENV or LABEL instruction that sets ``pairs`` literally ("" for none)."""
    return _wrap(hybrid_image.instruction, str(keyword), dict(pairs or {}))


def hybrid_image_cluster_files(entrypoint, extra=None, base_venv=""):
    """The base's entrypoint scripts and ``extra`` files the overlay copies."""
    return _wrap(hybrid_image.cluster_files, entrypoint, list(extra or []), str(base_venv or ""))


def hybrid_image_wheel_target(python_version, machine, glibc, requirements):
    """pip download's target for an image's Python: {python_version, abi, platforms, key...}."""
    return _wrap(
        hybrid_image.wheel_target, str(python_version), str(machine), str(glibc), list(requirements)
    )


def hybrid_image_transplant_plan(requested, donor_archs, base_archs):
    """The donor's files and registry entries a transplant copies: {files, entries, ...}."""
    return _wrap(hybrid_image.transplant_plan, list(requested), dict(donor_archs), dict(base_archs))


def hybrid_image_patch_registry(text, entries):
    """The base's registry.py text with the transplanted entries added."""
    return _wrap(hybrid_image.patch_registry, str(text), dict(entries or {}))


def hybrid_image_preflight(
    found, host, strategy, inputs, base_ray="", ray_override="", donor_needed=True
):
    """Errors about the input images on one node, and the Ray the cluster will run.

    ``found`` maps each image reference to the ID the node's Docker has ('' when absent);
    ``inputs`` holds hybrid_image_base, hybrid_image_donor and their *_id pins. The donor is
    checked only where it is needed (``donor_needed``: the base cannot import a wanted
    architecture itself, or that is not known yet).
    """
    found = dict(found or {})
    inputs = dict(inputs or {})
    errors = []
    for var in ("hybrid_image_base", "hybrid_image_donor"):
        ref, pin = str(inputs.get(var) or ""), str(inputs.get(f"{var}_id") or "")
        if var == "hybrid_image_donor" and not donor_needed:
            # Not read, so not required on the node; a malformed pin is still refused.
            errors += hybrid_image.check_pin(str(host), ref, f"{var}_id", pin)
            continue
        errors += hybrid_image.check_image(
            str(host), var, ref, str(found.get(ref) or ""), f"{var}_id", pin
        )
    version, source = hybrid_image.cluster_ray(
        str(strategy), str(base_ray or ""), str(ray_override or ""), serve_base=not donor_needed
    )
    base_id = found.get(str(inputs.get("hybrid_image_base") or ""))
    if base_id and base_ray is not None:
        errors += hybrid_image.check_ray_token_auth(str(host), version, source)
    return {"errors": errors, "ray_version": version, "ray_source": source}


def hybrid_image_builds_to_remove(images, repository, keep, in_use=None):
    """The tags to take off the builds of a repository beyond the newest ``keep``."""
    return _wrap(
        hybrid_image.builds_to_remove, list(images or []), repository, keep, list(in_use or [])
    )


# The operations of the one filter this role uses, dgx_spark.cluster.hybrid_image:
# ``value | dgx_spark.cluster.hybrid_image('<operation>', ...)``.
OPERATIONS = {
    "digest": hybrid_image_digest,
    "preflight": hybrid_image_preflight,
    "env": hybrid_image_env,
    "instruction": hybrid_image_instruction,
    "cluster_files": hybrid_image_cluster_files,
    "wheel_target": hybrid_image_wheel_target,
    "transplant_plan": hybrid_image_transplant_plan,
    "patch_registry": hybrid_image_patch_registry,
    "builds_to_remove": hybrid_image_builds_to_remove,
}


class FilterModule:
    def filters(self):
        return {"hybrid_image": role_filter("hybrid_image", OPERATIONS)}
