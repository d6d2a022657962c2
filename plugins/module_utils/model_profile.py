# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Model profiles as data, and the decisions taken on them, as pure functions.

A profile (one YAML file in the collection's ``profiles/``, or an entry of the inventory's
``spark_model_profiles``) is a vetted recipe: the checkpoint, what the serving image must
import, the memory it needs, the serve flags, the environment and its speculative method.
``spark_model_profile`` picks one; each role's defaults read their values from it, so any single
value can still be set in the inventory. Every value names its source (``sources``: a key per
section or per value, each with a date).
"""

from __future__ import annotations

import re

# The sections of a profile and, for each, the keys it must have (others are allowed).
SECTIONS = {
    "checkpoint": (),
    "image": ("architectures", "min_vllm"),
    "memory": ("weights_gib", "kv_cache_gib"),
    "serve": ("served_model_name", "tensor_parallel_size", "max_model_len"),
    "env": (),
    "speculative": (),
}
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
DATE = re.compile(r"\b20\d\d-\d\d(-\d\d)?\b")
RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


class ProfileError(ValueError):
    """A profile that cannot be picked or used; the message names the setting."""


def pick(name: str, shipped: dict, own: dict | None = None) -> dict:
    """The profile called ``name``: the inventory's own (``spark_model_profiles``) before the
    shipped ones of the same name. Raises ProfileError naming the known ones."""
    profiles = {**shipped, **(own or {})}
    if name not in profiles:
        raise ProfileError(
            f"spark_model_profile is {name!r}; allowed: {', '.join(sorted(profiles))} "
            "(the collection's profiles/ and the inventory's spark_model_profiles)"
        )
    profile = dict(profiles[name])
    errors = profile_errors(name, profile)
    if errors:
        raise ProfileError("; ".join(errors))
    profile["name"] = name
    return profile


def profile_errors(name: str, profile) -> list[str]:
    """What makes ``profile`` unusable, each naming the key: the sections and their keys, a
    checkpoint that is either a Hub repository with a revision or a local directory, at least
    one architecture, a vLLM release to compare with, sizes that are numbers."""
    where = f"profile {name}"
    if not NAME.match(name or ""):
        return [f"{where}: a profile's name is lower case letters, digits, '.', '_' and '-'"]
    if not isinstance(profile, dict):
        return [f"{where} must be a mapping of sections, not {type(profile).__name__}"]
    errors = []
    for section, keys in SECTIONS.items():
        value = profile.get(section, {})
        if not isinstance(value, dict):
            errors.append(f"{where}: {section} must be a mapping")
            continue
        errors += [f"{where}: {section}.{key} is missing" for key in keys if key not in value]
    if errors:
        return errors
    checkpoint = profile.get("checkpoint", {})
    if bool(checkpoint.get("repo")) == bool(checkpoint.get("local_dir")):
        errors.append(
            f"{where}: checkpoint names either repo (with revision) or local_dir, exactly one"
        )
    elif checkpoint.get("repo") and not checkpoint.get("revision"):
        errors.append(f"{where}: checkpoint.revision is missing (a commit or a branch)")
    architectures = profile["image"]["architectures"]
    if not isinstance(architectures, list) or not architectures:
        errors.append(f"{where}: image.architectures must list at least one architecture")
    if not RELEASE.match(str(profile["image"]["min_vllm"])):
        errors.append(f"{where}: image.min_vllm must be a vLLM release such as 0.17.0")
    for key in SECTIONS["memory"]:
        value = profile["memory"][key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            errors.append(f"{where}: memory.{key} must be a number of GiB, 0 or more")
    speculative = profile.get("speculative", {})
    if speculative and not speculative.get("method"):
        errors.append(f"{where}: speculative.method is missing (for example mtp or ngram)")
    return errors


def unsourced(profile: dict) -> list[str]:
    """The values of ``profile`` that no entry of its ``sources`` covers, or whose source has
    no date: an entry named for a value (serve.max_model_len) or for its section (serve)."""
    sources = profile.get("sources") or {}
    missing = []
    for section in SECTIONS:
        for key in profile.get(section) or {}:
            path = f"{section}.{key}"
            source = sources.get(path) or sources.get(section)
            if not source or not DATE.search(str(source)):
                missing.append(path)
    return missing


def speculative_config(profile: dict, tokens) -> dict:
    """vLLM's --speculative-config for ``tokens`` speculative tokens with the profile's method
    (0: off, an empty mapping). Raises ProfileError when the profile names no method."""
    try:
        count = int(tokens)
    except (TypeError, ValueError):
        count = -1
    if isinstance(tokens, bool) or count < 0:
        raise ProfileError(
            f"spark_model_speculative_tokens is {tokens!r}; "
            "allowed: a whole number, 0 (off) or more"
        )
    if count == 0:
        return {}
    speculative = profile.get("speculative") or {}
    if not speculative.get("method"):
        raise ProfileError(
            f"spark_model_speculative_tokens is {count}, but profile {profile.get('name')} "
            "names no speculative method; set it to 0 or pick a profile that has one"
        )
    config = dict(speculative.get("config") or {})
    config.update({"method": speculative["method"], "num_speculative_tokens": count})
    return config


def release(version) -> tuple[int, int, int] | None:
    """The release numbers at the start of a vLLM version (0.17.1rc1, 0.32.0+cpu,
    0.17.1.dev12+g1a2b): (0, 17, 1); None when it does not start with one."""
    match = RELEASE.match(str(version or "").strip())
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def vllm_errors(image: str, version, minimum, profile: str) -> list[str]:
    """An error when the vLLM ``version`` in ``image`` is older than the profile's
    ``minimum`` release; a development build of a release counts as that release (vLLM's main
    branch carries the next release's number, the architecture being already in it)."""
    have, need = release(version), release(minimum)
    if need is None:
        return [f"profile {profile}: image.min_vllm ({minimum}) is not a vLLM release"]
    if have is None:
        return [
            f"{image}: its vLLM version ({version or 'none found'}) cannot be compared with "
            f"{minimum}, the lowest profile {profile} is served by"
        ]
    if have >= need:
        return []
    return [
        f"{image} has vLLM {version}, older than {minimum}, the lowest profile {profile} "
        "is served by: build or pull a newer one, or pick another spark_model_profile"
    ]
