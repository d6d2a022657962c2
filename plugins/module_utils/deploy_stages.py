# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which of deploy.yml's stages a run's tags reach, and so which roles' settings preflight
must check before any change; and which stage a changed setting is first read by, so that a
full run whose changes all lie in later stages starts at the first of those.

A full run checks every role. A run with ``--tags`` checks the roles of the stages it reaches
and the roles those stages use (the serve stage moves the Ray containers with ray_cluster's
tasks and reads model_cache's facts); a role left out is still checked by its own main.yml
when it runs (each role validates itself unless preflight did). When in doubt, every role:
a tag that names no stage and no role of one, and the special tags all, always, tagged and
untagged."""

from __future__ import annotations

import hashlib
import json

# deploy.yml's stages in order: the stage's tag -> the roles whose settings its tasks read.
# The first is the stage's own role; its tags inside the role start with the role's name.
STAGES = {
    "host_prep": ("host_prep",),
    "images": ("hybrid_image",),
    "model": ("model_cache",),
    "ray": ("ray_cluster", "model_cache"),
    "serve": ("vllm_serve", "ray_cluster", "model_cache"),
    "monitoring": ("monitoring", "host_prep"),
}
# Checked on every run of deploy.yml: the record's settings and the settings no stage owns.
ALWAYS = ("deploy_state", "operate")
# Tags that select more than one stage's tasks, or tasks of every stage.
EVERY = frozenset({"all", "always", "tagged", "untagged"})
ROLES = tuple(dict.fromkeys(role for roles in STAGES.values() for role in roles)) + ALWAYS
# The stage a full run starts at when its settings, inventory or collection changed: every one.
FIRST = next(iter(STAGES))
# Settings of these roles that end in _port are opened by host_prep's firewall as well.
FIREWALL_PORT_OWNERS = ("ray_cluster", "vllm_serve")


def stage_of(tag: str) -> str | None:
    """The stage a tag selects: the stage's own tag, its role's name, or one of its role's tags
    (``<role>_...``); None for any other tag."""
    for stage, roles in STAGES.items():
        own = roles[0]
        if tag in (stage, own) or tag.startswith(own + "_"):
            return stage
    return None


def stages_reached(run_tags, skip_tags=(), first: str = "") -> list[str]:
    """The stages, in deploy.yml's order, whose tasks a run with these ``--tags`` and
    ``--skip-tags`` (Ansible's ansible_run_tags and ansible_skip_tags) can reach. Only a stage
    whose own tag is skipped is left out for a skip; a skipped role tag leaves the rest of its
    stage to run. ``first``: the earliest stage a full run found anything to do in (the
    in-step check's deploy_state_first_stage); the stages before it are not reached."""
    run = {str(tag) for tag in run_tags or ["all"]}
    skipped = {str(tag) for tag in skip_tags or []}
    named = {stage_of(tag) for tag in run}
    if run & EVERY or None in named:
        named = set(STAGES)
    started = stages_from(first)
    return [stage for stage in started if stage in named and stage not in skipped]


def roles_to_validate(run_tags, skip_tags=(), first: str = "") -> list[str]:
    """The roles preflight checks for such a run: those the reached stages read, and ALWAYS."""
    reached = stages_reached(run_tags, skip_tags, first)
    wanted = {role for stage in reached for role in STAGES[stage]}
    return [role for role in ROLES if role in wanted or role in ALWAYS]


def setting_stage(name: str) -> str:
    """The first stage, in deploy.yml's order, whose tasks read a setting: a change to it
    leaves the stages before that one nothing to do. The owning role's prefix names it; a Ray
    or serving port (``ray_cluster_*_port``, ``vllm_serve_*port``) is the firewall's first, so
    host_prep's. Any other name (spark_* is read across the stages) is the first stage's."""
    for stage, roles in STAGES.items():
        own = roles[0]
        if name.startswith(own + "_"):
            if own in FIREWALL_PORT_OWNERS and name.endswith("_port"):
                return FIRST
            return stage
    return FIRST


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprints(settings: dict, common) -> dict[str, str]:
    """{stage: digest} for deploy.yml's record: each stage's digest covers the settings that
    stage is the first to read (setting_stage); the first stage's also covers ``common`` (the
    inventory's hosts and groups, the collection's files), which every stage reads."""
    parts: dict[str, dict] = {stage: {} for stage in STAGES}
    for name, value in settings.items():
        parts[setting_stage(str(name))][str(name)] = value
    digests = {stage: _digest(part) for stage, part in parts.items()}
    digests[FIRST] = _digest({"settings": parts[FIRST], "common": common})
    return digests


def stages_from(first: str) -> list[str]:
    """The stages a full run runs when ``first`` is the earliest with anything to do: that one
    and every stage after it; every stage for '' or a name that is no stage."""
    names = list(STAGES)
    return names[names.index(first) :] if first in STAGES else names


def earliest(stages) -> str:
    """The first of these stages in deploy.yml's order; FIRST for a name that is no stage
    (when unsure, every stage), '' for none."""
    names = list(STAGES)
    given = [str(stage) for stage in stages or []]
    if any(stage not in STAGES for stage in given):
        return FIRST
    return min(given, key=names.index) if given else ""
