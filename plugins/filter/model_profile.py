# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filter behind spark_model_profile (spark_defaults); a thin wrapper over
plugins/module_utils/model_profile.py, which also reads the collection's profiles/ (its
operations documented in this folder's sidecar of the same name)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_profile as mp
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter

# The collection's root: plugins/filter/ is two levels below it, installed or checked out.
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


# libyaml's parser where PyYAML has it: each task's worker reads the profiles anew.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=4)
def _shipped(directory: str, stamp: tuple) -> dict:
    return {
        path.stem: yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506
        for path in sorted(Path(directory).glob("*.yml"))
    }


def shipped_profiles(directory: Path = PROFILES) -> dict:
    """The profiles the collection ships, by name (each file's name), read once per change."""
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(directory.glob("*.yml")))
    return _shipped(str(directory), stamp)


def model_profile_pick(name, own=None):
    """The profile ``name`` (the inventory's spark_model_profiles before the shipped ones)."""
    if own is not None and not isinstance(own, dict):
        raise AnsibleFilterError(
            "spark_model_profiles must be a mapping of profile names to profiles, "
            f"not {type(own).__name__}"
        )
    try:
        return mp.pick(str(name), shipped_profiles(), dict(own or {}))
    except mp.ProfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def model_profile_speculative(profile, tokens):
    """vLLM's --speculative-config for ``tokens`` tokens of the profile's method ({}: off)."""
    try:
        return mp.speculative_config(dict(profile), tokens)
    except mp.ProfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def model_profile_vllm_errors(version, image, minimum, profile):
    """Errors (list of str) when the image's vLLM is older than the profile's lowest."""
    return mp.vllm_errors(str(image), version, minimum, str(profile))


# value | dgx_spark.cluster.model_profile('<operation>', ...)
OPERATIONS = {
    "pick": model_profile_pick,
    "speculative": model_profile_speculative,
    "vllm_errors": model_profile_vllm_errors,
}


class FilterModule:
    def filters(self):
        return {"model_profile": role_filter("model_profile", OPERATIONS)}
