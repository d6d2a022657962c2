# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""deploy.yml's stages as the collection's own files state them, for the controller's filters:

* their order: ``playbooks/deploy.yml``'s imports that carry a tag (the tag is the stage);
* the roles each enters: its playbook's ``roles:``, ``include_role`` and ``import_role``, and
  what those roles' task files enter in turn (the first role under ``roles:`` is its own);
* the settings each reads: every setting's name written in that playbook, the task files it
  imports, and its roles' defaults, vars, tasks, handlers, templates and argument specs, the
  shared entry points of other roles it enters (SHARED_ENTRIES: ``tasks_from: facts``, as
  host_prep's firewall reads vllm_serve's and ray_cluster's ports; ``tasks_from: prune``, as
  the serve stage removes the serving builds the ranks left), and every name the defaults of those
  settings derive from (a role's default may read another role's setting: host_prep builds
  the firewall from ``vllm_serve_allowed_sources``).

So a changed setting changes the recorded inputs of every stage that reads it (a full run
starts at the first of them), and nothing is guessed from a setting's prefix. Which stages a
run's tags reach follows from the same order and roles. A setting is a name that starts with
``spark_`` or with the name of a role a stage enters; one that no stage reads is the first
stage's (when unsure, every stage)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import digest

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "dgx_spark.cluster."
# Checked on every run of deploy.yml, and entered by every stage to record itself: the
# record's settings and the settings no stage owns.
ALWAYS = ("deploy_state", "operate")
# Tags that select more than one stage's tasks, or tasks of every stage.
EVERY = frozenset({"all", "always", "tagged", "untagged"})
# The folders of a role whose files can read a setting (files/ is copied as it is; the README
# only describes).
READ_FOLDERS = ("defaults", "vars", "tasks", "handlers", "templates", "meta")
INCLUDE_ROLE = {
    f"{ns}{verb}_role" for ns in ("", "ansible.builtin.") for verb in ("include", "import")
}
INCLUDE_TASKS = {
    f"{ns}{verb}_tasks" for ns in ("", "ansible.builtin.") for verb in ("include", "import")
}
IMPORT_PLAYBOOK = {"import_playbook", "ansible.builtin.import_playbook"}
# Entry points another stage enters without taking the role on: its settings are read from that
# task file alone, and preflight does not check the role for that stage (the entry point's own
# argument spec checks what it reads). facts publishes a role's resolved settings; prune
# removes the serving builds no container runs (the serve stage, after the ranks moved).
SHARED_ENTRIES = ("facts", "prune")


@dataclass(frozen=True)
class Stages:
    """order: the stages; roles: stage -> the roles it enters, its own first; reads: stage ->
    the settings it reads; settings: the pattern a setting's name matches; results: the names
    of that pattern a task sets (set_fact, register): what a role found or publishes, not
    what the run was given."""

    order: tuple
    roles: dict
    reads: dict
    settings: re.Pattern
    results: frozenset = frozenset()

    @property
    def first(self) -> str:
        return self.order[0]

    @property
    def all_roles(self) -> tuple:
        """Every stage's roles in stage order, then ALWAYS: the roles preflight checks."""
        found = dict.fromkeys(role for stage in self.order for role in self.roles[stage])
        return tuple(found) + ALWAYS


# libyaml's parser where PyYAML has it: the pure-Python one takes a second over these files.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(path: Path):
    return yaml.load(path.read_text(), Loader=_LOADER) if path.is_file() else None  # noqa: S506


def _role_name(value) -> str | None:
    name = value.get("name") if isinstance(value, dict) else value
    if isinstance(name, str) and name.startswith(COLLECTION):
        return name[len(COLLECTION) :]
    return None


def _entries(node, own: list, entered: list, task_files: list, shared: list) -> None:
    """Walk a playbook or task file: the roles under ``roles:`` (into ``own``), the roles it
    includes or imports (``entered``), the task files it imports or includes, and the shared
    entry points it enters (``(role, entry)`` into ``shared``: that task file is read, the role
    is not entered)."""
    if isinstance(node, list):
        for item in node:
            _entries(item, own, entered, task_files, shared)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "roles" and isinstance(value, list):
            own += [
                name
                for item in value
                if (name := _role_name(item.get("role") if isinstance(item, dict) else item))
            ]
        elif key in INCLUDE_ROLE:
            if name := _role_name(value):
                entry = value.get("tasks_from") if isinstance(value, dict) else None
                if entry in SHARED_ENTRIES:
                    shared.append((name, entry))
                else:
                    entered.append(name)
        elif key in INCLUDE_TASKS and isinstance(value, (str, dict)):
            task_files.append(value if isinstance(value, str) else value.get("file", ""))
        elif key not in IMPORT_PLAYBOOK:
            _entries(value, own, entered, task_files, shared)


def _role_texts(root: Path, role: str) -> list[str]:
    base = root / "roles" / role
    return [
        path.read_text(errors="ignore")
        for folder in READ_FOLDERS
        for path in sorted((base / folder).rglob("*"))
        if path.is_file()
    ]


@functools.lru_cache(maxsize=64)
def _roles_entered_by(root: Path, role: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The roles a role's task files enter, and the shared entry points they enter."""
    entered: list[str] = []
    shared: list[tuple[str, str]] = []
    for path in sorted((root / "roles" / role / "tasks").rglob("*.yml")):
        _entries(_load_yaml(path), entered, entered, [], shared)
    return entered, shared


def _entry_text(root: Path, role: str, entry: str) -> str:
    path = root / "roles" / role / "tasks" / f"{entry}.yml"
    return path.read_text() if path.is_file() else ""


def _definitions(root: Path, pattern: re.Pattern) -> dict[str, set]:
    """Every role's defaults and vars: a name -> the settings its value reads."""
    found: dict[str, set] = {}
    for path in sorted(root.glob("roles/*/defaults/main.yml")) + sorted(
        root.glob("roles/*/vars/main.yml")
    ):
        for name, value in (_load_yaml(path) or {}).items():
            found.setdefault(str(name), set()).update(pattern.findall(json.dumps(value)))
    return found


SET_FACT = {"set_fact", "ansible.builtin.set_fact"}


def _set_names(node) -> set[str]:
    """The names a task file sets: set_fact's keys and register's values."""
    if isinstance(node, list):
        return set().union(*(_set_names(item) for item in node))
    if not isinstance(node, dict):
        return set()
    found = {str(node["register"])} if isinstance(node.get("register"), str) else set()
    for key, value in node.items():
        if key in SET_FACT and isinstance(value, dict):
            found |= {str(name) for name in value}
        found |= _set_names(value)
    return found


def _closure(names: set, definitions: dict) -> frozenset:
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += definitions.get(name, ())
    return frozenset(seen)


@functools.lru_cache(maxsize=4)
def load(root: str = str(ROOT)) -> Stages:
    """The stages read from the collection at ``root``."""
    base = Path(root)
    order, roles, texts = [], {}, {}
    for entry in _load_yaml(base / "playbooks" / "deploy.yml") or []:
        tags = [tag for tag in entry.get("tags", []) if tag not in EVERY]
        playbook = next((entry[key] for key in IMPORT_PLAYBOOK if key in entry), None)
        if not tags or not playbook:
            continue
        stage = str(tags[0])
        own: list[str] = []
        entered: list[str] = []
        task_files: list[str] = []
        shared: list[tuple[str, str]] = []
        path = base / "playbooks" / playbook
        _entries(_load_yaml(path), own, entered, task_files, shared)
        # A stage's own playbook enters the roles whose facts it reads (the serve stage checks
        # model_cache's settings and copies); a role reads another role's facts file only, and
        # any stage another role's prune file only.
        entered += [role for role, point in shared if point == "facts"]
        shared = [(role, point) for role, point in shared if point != "facts"]
        stage_texts = [path.read_text(), json.dumps(entry)]
        stage_texts += [
            (base / "playbooks" / name).read_text()
            for name in task_files
            if (base / "playbooks" / name).is_file()
        ]
        # The bookkeeping (ALWAYS) every stage enters to record itself is read on every run:
        # no stage's own setting.
        found = [role for role in dict.fromkeys(own + entered) if role not in ALWAYS]
        todo = list(found)
        while todo:
            role_entered, role_shared = _roles_entered_by(base, todo.pop(0))
            shared += role_shared
            for role in role_entered:
                if role not in found and role not in ALWAYS:
                    found.append(role)
                    todo.append(role)
        order.append(stage)
        roles[stage] = tuple(found)
        texts[stage] = stage_texts + [text for role in found for text in _role_texts(base, role)]
        texts[stage] += [_entry_text(base, *pair) for pair in dict.fromkeys(shared)]
    prefixes = ["spark"] + sorted({role for stage in order for role in roles[stage]})
    pattern = re.compile(r"\b(?:" + "|".join(prefixes) + r")_\w*[A-Za-z0-9]")
    definitions = _definitions(base, pattern)
    reads = {
        stage: _closure(
            {name for text in texts[stage] for name in pattern.findall(text)}, definitions
        )
        for stage in order
    }
    results = frozenset(
        name
        for path in sorted(base.glob("roles/*/tasks/**/*.yml"))
        for name in _set_names(_load_yaml(path))
        if pattern.fullmatch(name)
    )
    return Stages(tuple(order), roles, reads, pattern, results)


def stage_of(tag: str, stages: Stages | None = None) -> str | None:
    """The stage a tag selects: the stage's own tag, its own role's name, or one of that role's
    tags (``<role>_...``); None for any other tag."""
    stages = stages or load()
    for stage in stages.order:
        own = stages.roles[stage][0]
        if tag in (stage, own) or tag.startswith(own + "_"):
            return stage
    return None


def stages_from(first: str, stages: Stages | None = None) -> list[str]:
    """The stages a full run runs when ``first`` is the earliest with anything to do: that one
    and every stage after it; every stage for '' or a name that is no stage."""
    order = list((stages or load()).order)
    return order[order.index(first) :] if first in order else order


def stages_reached(
    run_tags, skip_tags=(), first: str = "", stages: Stages | None = None
) -> list[str]:
    """The stages, in deploy.yml's order, whose tasks a run with these ``--tags`` and
    ``--skip-tags`` (Ansible's ansible_run_tags and ansible_skip_tags) can reach. Only a stage
    whose own tag is skipped is left out for a skip; a skipped role tag leaves the rest of its
    stage to run. ``first``: the earliest stage a full run found anything to do in (the
    in-step check's deploy_state_first_stage); the stages before it are not reached."""
    stages = stages or load()
    run = {str(tag) for tag in run_tags or ["all"]}
    skipped = {str(tag) for tag in skip_tags or []}
    named = {stage_of(tag, stages) for tag in run}
    if run & EVERY or None in named:
        named = set(stages.order)
    return [
        stage for stage in stages_from(first, stages) if stage in named and stage not in skipped
    ]


def roles_to_validate(
    run_tags, skip_tags=(), first: str = "", stages: Stages | None = None
) -> list[str]:
    """The roles preflight checks for such a run: those the reached stages enter, and ALWAYS."""
    stages = stages or load()
    reached = stages_reached(run_tags, skip_tags, first, stages)
    wanted = {role for stage in reached for role in stages.roles[stage]}
    return [role for role in stages.all_roles if role in wanted or role in ALWAYS]


def fingerprints(settings: dict, common, stages: Stages | None = None) -> dict[str, dict]:
    """{stage: inputs} for each stage's record: the 16-hex digest of every setting given that
    the stage reads (a setting no stage reads is the first stage's; a name a task sets is no
    setting: Stages.results), and under ``common`` that
    of ``common`` (the inventory's hosts and groups, the collection's files), which every stage
    reads. A changed setting so changes the inputs of every stage that reads it, and a stage
    run alone records exactly what it applied: the run starts at the first stage whose record
    differs."""
    stages = stages or load()
    settings = {k: v for k, v in settings.items() if k not in stages.results}
    read_by_any = set().union(*stages.reads.values())
    shared = digest(common, 16)
    inputs = {}
    for stage in stages.order:
        reads = stages.reads[stage]
        first = stage == stages.first
        part = {
            str(name): digest(value, 16)
            for name, value in settings.items()
            if name in reads or (first and name not in read_by_any)
        }
        inputs[stage] = {**part, "common": shared}
    return inputs


def earliest(names, stages: Stages | None = None) -> str:
    """The first of these stages in deploy.yml's order; the first stage for a name that is no
    stage (when unsure, every stage), '' for none."""
    stages = stages or load()
    given = [str(stage) for stage in names or []]
    if any(stage not in stages.order for stage in given):
        return stages.first
    return min(given, key=stages.order.index) if given else ""
