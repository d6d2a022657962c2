# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which of deploy.yml's stages a run's tags reach, and so which roles' settings preflight
must check before any change.

A full run checks every role. A run with ``--tags`` checks the roles of the stages it reaches
and the roles those stages use (the serve stage moves the Ray containers with ray_cluster's
tasks and reads model_cache's facts); a role left out is still checked by its own main.yml
when it runs (each role validates itself unless preflight did). When in doubt, every role:
a tag that names no stage and no role of one, and the special tags all, always, tagged and
untagged."""

from __future__ import annotations

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


def stage_of(tag: str) -> str | None:
    """The stage a tag selects: the stage's own tag, its role's name, or one of its role's tags
    (``<role>_...``); None for any other tag."""
    for stage, roles in STAGES.items():
        own = roles[0]
        if tag in (stage, own) or tag.startswith(own + "_"):
            return stage
    return None


def stages_reached(run_tags, skip_tags=()) -> list[str]:
    """The stages, in deploy.yml's order, whose tasks a run with these ``--tags`` and
    ``--skip-tags`` (Ansible's ansible_run_tags and ansible_skip_tags) can reach. Only a stage
    whose own tag is skipped is left out for a skip; a skipped role tag leaves the rest of its
    stage to run."""
    run = {str(tag) for tag in run_tags or ["all"]}
    skipped = {str(tag) for tag in skip_tags or []}
    named = {stage_of(tag) for tag in run}
    if run & EVERY or None in named:
        named = set(STAGES)
    return [stage for stage in STAGES if stage in named and stage not in skipped]


def roles_to_validate(run_tags, skip_tags=()) -> list[str]:
    """The roles preflight checks for such a run: those the reached stages read, and ALWAYS."""
    wanted = {role for stage in stages_reached(run_tags, skip_tags) for role in STAGES[stage]}
    return [role for role in ROLES if role in wanted or role in ALWAYS]
