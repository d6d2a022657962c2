"""plugins/plugin_utils/deploy_stages.py: which stages a run's tags reach, so which roles
preflight checks; which stage a setting is first read by, so where a full run starts; and that
what it reads from the collection's files matches deploy.yml and what each stage's files read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import deploy_state as filters
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils import deploy_stages as ds
from support import vaulted_yaml

ROOT = Path(__file__).resolve().parents[4]
EVERY_STAGE = ["host_prep", "images", "model", "ray", "serve", "monitoring"]
EVERY_ROLE = [
    "host_prep", "hybrid_image", "model_cache", "ray_cluster", "vllm_serve", "monitoring",
    "deploy_state", "operate",
]  # fmt: skip
PREFIX = "dgx_spark.cluster."


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "stages"),
    [
        (["all"], [], EVERY_STAGE),
        ([], [], EVERY_STAGE),
        # Molecule's converge and idempotence skip tags no task carries.
        (["all"], ["molecule-notest", "notest", "molecule-idempotence-notest"], EVERY_STAGE),
        (["serve"], [], ["serve"]),
        (["vllm_serve"], [], ["serve"]),
        (["model", "serve"], [], ["model", "serve"]),
        (["serve", "host_prep"], [], ["host_prep", "serve"]),
        # A role's own tags reach its stage.
        (["host_prep_firewall"], [], ["host_prep"]),
        (["model_cache_verify"], [], ["model"]),
        (["hybrid_image_build", "ray_cluster_run"], [], ["images", "ray"]),
        (["vllm_serve_run"], [], ["serve"]),
        # A stage's tag skipped leaves it out, whatever else reaches it; a role tag skipped
        # leaves the rest of the stage.
        (["all"], ["host_prep"], EVERY_STAGE[1:]),
        (["serve", "ray"], ["serve"], ["ray"]),
        (["all"], ["host_prep_firewall"], EVERY_STAGE),
        # When in doubt, every stage.
        (["always"], [], EVERY_STAGE),
        (["tagged"], [], EVERY_STAGE),
        (["untagged"], [], EVERY_STAGE),
        (["serve", "my_own_tag"], [], EVERY_STAGE),
        (["host_prepare"], [], EVERY_STAGE),
    ],
)
def test_the_stages_a_runs_tags_reach(run_tags, skip_tags, stages):
    assert ds.stages_reached(run_tags, skip_tags) == stages


@pytest.mark.parametrize(
    ("run_tags", "skip_tags", "roles"),
    [
        (["all"], [], EVERY_ROLE),
        (["serve"], [], ["model_cache", "ray_cluster", "vllm_serve", "deploy_state", "operate"]),
        (["model"], [], ["model_cache", "deploy_state", "operate"]),
        (["images"], [], ["hybrid_image", "deploy_state", "operate"]),
        (["host_prep_firewall"], [], ["host_prep", "deploy_state", "operate"]),
        (["monitoring"], [], ["host_prep", "monitoring", "deploy_state", "operate"]),
        # host_prep skipped, but the monitoring stage still loads its firewall.
        (["all"], ["host_prep"], EVERY_ROLE),
        (
            ["all"],
            ["host_prep", "monitoring"],
            [r for r in EVERY_ROLE if r not in ("host_prep", "monitoring")],
        ),
        # Nothing reached: the record's and operate's settings still.
        (["serve"], ["serve"], ["deploy_state", "operate"]),
    ],
)
def test_the_roles_preflight_checks(run_tags, skip_tags, roles):
    assert ds.roles_to_validate(run_tags, skip_tags) == roles


def test_the_filters_pass_the_tags_through_and_refuse_a_string():
    assert filters.deploy_stages_reached(["serve"], []) == ["serve"]
    assert filters.deploy_stages_roles(["images"]) == ["hybrid_image", "deploy_state", "operate"]
    with pytest.raises(AnsibleFilterError, match="ansible_run_tags must be a list of tags"):
        filters.deploy_stages_reached("serve")
    with pytest.raises(AnsibleFilterError, match="ansible_skip_tags must be a list"):
        filters.deploy_stages_roles(["serve"], "serve")


def test_the_stages_are_deploy_yml_s_tagged_stages_in_order():
    plays = yaml.safe_load((ROOT / "playbooks/deploy.yml").read_text())
    tagged = [tag for play in plays for tag in play.get("tags", []) if tag != "always"]
    assert tagged == list(ds.load().order)


def _roles_named(node, facts: bool = True) -> set[str]:
    """The collection's roles a playbook or task file enters (roles:, include_role,
    import_role), by name, but not through a prune entry point (the serve stage removes the
    builds the ranks left; the entry point checks its own argument spec); with facts=False,
    not those it only reads the published facts of (tasks_from: facts, likewise)."""
    shared = ("prune",) if facts else ("facts", "prune")
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                if value.get("tasks_from") not in shared:
                    found.add(value["name"].removeprefix(PREFIX))
            elif key == "role" and isinstance(value, str):
                found.add(value.removeprefix(PREFIX))
            else:
                found |= _roles_named(value, facts)
    elif isinstance(node, list):
        for item in node:
            found |= _roles_named(item, facts)
    return found


def _roles_entered(role: str) -> set[str]:
    """The roles a role's task files enter, itself included (a role that reads another's
    facts does not enter it)."""
    entered = {role}
    for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        entered |= _roles_named(yaml.safe_load(path.read_text()), facts=False)
    return entered


@pytest.mark.parametrize("stage", EVERY_STAGE)
def test_each_stage_reads_only_the_roles_its_entry_names(stage):
    """What the stage's playbook enters, and what those roles enter in turn, is its entry of
    load().roles; else a --tags run of it would reach a role whose settings preflight skipped."""
    plays = yaml.safe_load((ROOT / "playbooks" / f"{stage}.yml").read_text())
    direct = _roles_named(plays)
    entered, new = set(), set(direct)
    while new:
        entered |= new
        new = set().union(*(_roles_entered(role) for role in new)) - entered
    roles = ds.load().roles[stage]
    assert direct, stage
    assert roles[0] in direct
    assert entered == set(roles), sorted(entered ^ set(roles))


def test_every_role_preflight_checks_is_in_the_table():
    plays = yaml.safe_load((ROOT / "playbooks/preflight.yml").read_text())
    checked = [
        task["ansible.builtin.include_role"]["name"].removeprefix(PREFIX)
        for task in plays[0]["tasks"]
        if "ansible.builtin.include_role" in task
    ]
    assert sorted(checked) == sorted(ds.load().all_roles)


def test_preflight_and_every_stage_guard_ask_the_filters():
    """Both with the in-step check's first stage: a full run's stages before it end too."""
    preflight = (ROOT / "playbooks/preflight.yml").read_text()
    assert "_preflight_first: \"{{ deploy_state_first_stage | default('') }}\"" in preflight
    assert (
        "dgx_spark.cluster.deploy_state('stages_roles', _preflight_skip, _preflight_first)"
        in preflight
    )
    assert "ansible_skip_tags | list + ([] if spark_monitoring | default(false) | bool" in preflight
    guard = (ROOT / "playbooks/tasks/in_step_guard.yml").read_text()
    assert (
        "dgx_spark.cluster.deploy_state('stages_reached', ansible_skip_tags, "
        "deploy_state_first_stage | default(''))" in " ".join(guard.split())
    )
    for stage in EVERY_STAGE:
        text = (ROOT / "playbooks" / f"{stage}.yml").read_text()
        assert re.search(rf"deploy_stage: {stage}\b", text), f"{stage}.yml names no stage"


@pytest.mark.parametrize(
    ("first", "stages"),
    [
        ("", EVERY_STAGE),
        ("host_prep", EVERY_STAGE),
        ("images", EVERY_STAGE[1:]),
        ("serve", ["serve", "monitoring"]),
        ("monitoring", ["monitoring"]),
        ("no_such_stage", EVERY_STAGE),
    ],
)
def test_a_full_run_runs_the_stages_from_the_first_with_anything_to_do(first, stages):
    assert ds.stages_from(first) == stages
    assert ds.stages_reached(["all"], [], first) == stages


def test_the_first_stage_and_the_tags_both_narrow_the_stages_and_roles():
    assert ds.stages_reached(["model", "serve"], [], "ray") == ["serve"]
    assert ds.stages_reached(["host_prep"], [], "images") == []
    assert ds.roles_to_validate(["all"], [], "ray") == [
        # monitoring's stage reads host_prep's firewall settings.
        "host_prep", "model_cache", "ray_cluster", "vllm_serve", "monitoring",
        "deploy_state", "operate",
    ]  # fmt: skip
    assert ds.roles_to_validate(["all"], [], "images") == EVERY_ROLE
    assert filters.deploy_stages_reached(["all"], [], "serve") == ["serve", "monitoring"]
    assert filters.deploy_stages_roles(["all"], [], None) == EVERY_ROLE


@pytest.mark.parametrize(
    ("stages", "first"),
    [
        ([], ""),
        (["serve", "images", "ray"], "images"),
        (["monitoring", "serve"], "serve"),
        # A name that is no stage (the in-step check's 'every') means every stage.
        (["serve", "every"], "host_prep"),
    ],
)
def test_the_earliest_of_some_stages(stages, first):
    assert ds.earliest(stages) == first
    assert filters.deploy_stages_earliest([*stages, ""]) == first


def test_the_earliest_refuses_a_string():
    with pytest.raises(AnsibleFilterError, match="takes a list of stage names, got str"):
        filters.deploy_stages_earliest("serve")


SETTINGS = {
    "spark_gpus": 1,
    "host_prep_mtu": 9000,
    "hybrid_image_donor": "vllm-donor:0.32.0-cpu",
    "vllm_serve_max_model_len": 2048,
    "vllm_serve_port": 8000,
}
COMMON = {"hosts": ["172.30.240.11", "172.30.240.12"], "collection": "c" * 64}


def moved(before: dict, after: dict) -> list[str]:
    return [stage for stage in before if before[stage] != after[stage]]


def started_at(name: str, stages=None) -> str:
    """The stage a full run starts at after a change of ``name``: the first whose inputs the
    change moves."""
    before = ds.fingerprints({name: 1}, COMMON, stages)
    return ds.earliest(moved(before, ds.fingerprints({name: 2}, COMMON, stages)), stages)


@pytest.mark.parametrize(
    ("name", "stage"),
    [
        ("host_prep_mtu", "host_prep"),
        ("hybrid_image_donor", "images"),
        ("model_cache_repo_id", "model"),
        ("ray_cluster_num_gpus", "ray"),
        ("vllm_serve_max_model_len", "serve"),
        # The firewall opens the Ray and serving ports: host_prep reads them first.
        ("ray_cluster_gcs_port", "host_prep"),
        ("ray_cluster_min_worker_port", "host_prep"),
        ("vllm_serve_port", "host_prep"),
        ("vllm_serve_master_port", "host_prep"),
        # spark_* are read across the stages; anything else too, when in doubt.
        ("spark_serving_image", "host_prep"),
        ("spark_monitoring", "host_prep"),
        ("vllm_servers", "host_prep"),
    ],
)
def test_the_stage_that_reads_a_setting_first(name, stage):
    assert started_at(name) == stage


@pytest.mark.parametrize(
    ("changes", "common", "first"),
    [
        ({}, COMMON, ""),
        ({"vllm_serve_max_model_len": 4096}, COMMON, "serve"),
        ({"hybrid_image_donor": "vllm-donor:0.33.0-cpu"}, COMMON, "images"),
        ({"ray_cluster_num_gpus": 1}, COMMON, "ray"),
        ({"vllm_serve_port": 8001}, COMMON, "host_prep"),
        ({"spark_gpus": 0}, COMMON, "host_prep"),
        ({}, {**COMMON, "collection": "d" * 64}, "host_prep"),
        ({"vllm_serve_max_model_len": 4096, "host_prep_mtu": 1500}, COMMON, "host_prep"),
    ],
)
def test_a_changed_setting_moves_the_inputs_of_every_stage_that_reads_it(changes, common, first):
    before = ds.fingerprints(SETTINGS, COMMON)
    after = ds.fingerprints({**SETTINGS, **changes}, common)
    assert list(before) == EVERY_STAGE
    reads = ds.load().reads
    named = {name for name in changes if any(name in reads[stage] for stage in EVERY_STAGE)}
    expected = [
        stage
        for stage in EVERY_STAGE
        if common != COMMON or any(name in reads[stage] for name in named)
    ]
    assert moved(before, after) == expected
    assert ds.earliest(moved(before, after)) == first
    # Each stage's inputs: the digest of each setting it reads, and of the common part.
    given = {**SETTINGS, **changes}
    assert set(after["serve"]) == {n for n in given if n in reads["serve"]} | {"common"}
    assert {"vllm_serve_max_model_len", "vllm_serve_port", "spark_gpus"} <= set(after["serve"])
    assert all(re.fullmatch("[0-9a-f]{16}", d) for part in after.values() for d in part.values())
    assert filters.deploy_state_fingerprints({**SETTINGS, **changes}, common) == after


def test_a_shared_entry_point_is_read_not_entered():
    """The serve stage removes the builds the ranks left through hybrid_image's prune entry
    point: it reads the settings of that file (and what their defaults derive from), but does
    not take the role on, so preflight checks no hybrid_image setting for a serve run and a
    donor change still starts at the images stage."""
    stages = ds.load()
    assert "tasks_from: prune" in (ROOT / "playbooks/serve.yml").read_text()
    assert "hybrid_image" not in stages.roles["serve"]
    assert {"hybrid_image_keep_builds", "hybrid_image_name", "hybrid_image_alias"} <= stages.reads[
        "serve"
    ]
    assert "spark_serving_image_name" in stages.reads["serve"]
    assert "hybrid_image_donor" not in stages.reads["serve"]
    assert ds.roles_to_validate(["serve"]) == [
        "model_cache", "ray_cluster", "vllm_serve", "deploy_state", "operate",
    ]  # fmt: skip
    assert started_at("hybrid_image_keep_builds") == "images"


def test_what_a_task_sets_is_no_setting():
    """A role's result (set_fact, register) differs from one run to the next by design: it is
    left out of every stage's inputs."""
    results = ds.load().results
    assert {"host_prep_comm_env", "model_cache_model_path", "vllm_serve_facts"} <= results
    assert "vllm_serve_max_model_len" not in results
    fingerprint = ds.fingerprints({"host_prep_comm_env": "x", "spark_gpus": 1}, COMMON)
    assert all("host_prep_comm_env" not in inputs for inputs in fingerprint.values())


def test_a_setting_no_stage_reads_is_the_first_stage_s():
    before = ds.fingerprints({"vllm_servers": 1}, COMMON)
    assert moved(before, ds.fingerprints({"vllm_servers": 2}, COMMON)) == ["host_prep"]


def test_the_fingerprints_refuse_settings_that_are_no_mapping():
    with pytest.raises(AnsibleFilterError, match="the settings must be a mapping, got list"):
        filters.deploy_state_fingerprints([], COMMON)


def _stage_text(stage: str) -> str:
    """Everything a stage could read, found another way than the module: the whole text of its
    playbook, of the task files under playbooks/tasks, and of every file of its roles but their
    READMEs and files/ (copied as they are)."""
    texts = [(ROOT / "playbooks" / f"{stage}.yml").read_text()]
    texts += [path.read_text() for path in sorted((ROOT / "playbooks/tasks").glob("*.yml"))]
    for role in ds.load().roles[stage]:
        for path in sorted((ROOT / "roles" / role).rglob("*")):
            if path.is_file() and path.name != "README.md" and "files" not in path.parts:
                texts.append(path.read_text(errors="ignore"))
        # The facts files of the roles whose published facts its task files read.
        for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
            tasks = yaml.safe_load(path.read_text())
            for other in _roles_named(tasks) - _roles_named(tasks, facts=False):
                texts.append((ROOT / "roles" / other / "tasks/facts.yml").read_text())
    return "\n".join(texts)


def _setting_names() -> set[str]:
    """Every setting a user can give: the roles' defaults, the names their values read (a
    setting with no default of its own, such as vllm_serve_allowed_sources), the argument
    specs, and the names the example and simulated inventories set."""
    names: set[str] = set()
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        names |= set(yaml.safe_load(path.read_text()) or {})
        names |= set(re.findall(r"\b[a-z][a-z0-9]*_[a-z0-9_]+", path.read_text()))
    for path in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        for spec in (yaml.safe_load(path.read_text())["argument_specs"]).values():
            names |= set(spec.get("options") or {})
    for path in sorted(ROOT.glob("inventories/*/**/*.yml")):
        data = vaulted_yaml.load(path)
        if isinstance(data, dict):
            names |= set(data)
    return {name for name in names if ds.load().settings.fullmatch(name)}


def test_no_stage_reads_a_setting_before_the_stage_it_belongs_to():
    """A setting changed must never leave a stage that reads it out of the run: every stage
    whose files name a setting comes at or after the stage a change of it starts at. Read from
    the files by a plain search, so a new cross-role read (host_prep's firewall reading
    vllm_serve_allowed_sources) that the module missed fails here."""
    names = _setting_names() - ds.load().results  # what a task sets is no setting
    order = EVERY_STAGE
    readers = {stage: _stage_text(stage) for stage in order}
    assert len(names) > 200, len(names)
    assert "vllm_serve_allowed_sources" in names
    early = {}
    for name in sorted(names):
        reading = [stage for stage in order if re.search(rf"\b{name}\b", readers[stage])]
        if reading and order.index(reading[0]) < order.index(started_at(name)):
            early[name] = (reading[0], started_at(name))
    assert early == {}


def test_who_may_reach_the_endpoint_is_host_prep_s_to_read():
    """The firewall (host_prep) builds the serving port's sources from the serving setting:
    a change of it starts the run at host_prep, so the table follows it."""
    before = ds.fingerprints({"vllm_serve_allowed_sources": ["172.30.240.0/24"]}, COMMON)
    after = ds.fingerprints({"vllm_serve_allowed_sources": ["198.51.100.0/24"]}, COMMON)
    assert moved(before, after)[0] == "host_prep"
    assert started_at("vllm_serve_allowed_sources") == "host_prep"


def test_a_default_that_derives_from_another_setting_carries_the_read(tmp_path):
    """A stage reads what its settings' defaults read, through any role's defaults."""
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks/deploy.yml").write_text(
        "- ansible.builtin.import_playbook: a.yml\n  tags: [a]\n"
        "- ansible.builtin.import_playbook: b.yml\n  tags: [b]\n"
    )
    for stage, role in (("a", "alpha"), ("b", "beta")):
        (tmp_path / f"playbooks/{stage}.yml").write_text(
            f"- hosts: all\n  roles:\n    - role: dgx_spark.cluster.{role}\n"
        )
    for role, defaults in (
        ("alpha", "alpha_x: '{{ spark_shared }}'\n"),
        ("beta", "beta_y: 1\n"),
        ("spark_defaults", "spark_shared: '{{ beta_y | default(2) }}'\n"),
    ):
        (tmp_path / f"roles/{role}/defaults").mkdir(parents=True)
        (tmp_path / f"roles/{role}/defaults/main.yml").write_text(defaults)
    stages = ds.load(str(tmp_path))
    assert stages.order == ("a", "b")
    assert stages.roles == {"a": ("alpha",), "b": ("beta",)}
    # beta_y is beta's own setting, but alpha's default reads it through spark_shared.
    assert started_at("beta_y", stages) == "a"
    assert started_at("spark_shared", stages) == "a"
    assert started_at("nobody_reads_this", stages) == "a"
    assert ds.stages_reached(["beta"], [], "", stages) == ["b"]


def test_the_fingerprint_covers_every_stage_role_s_settings():
    """deploy_state's names pattern lists spark_ and every role a stage enters."""
    pattern = yaml.safe_load((ROOT / "roles/deploy_state/vars/main.yml").read_text())[
        "_deploy_state_setting_names"
    ]
    # A role's published facts (<role>_facts) are left out: they derive from the settings.
    prefixes = set(re.fullmatch(r"\^\((.*)\)_\(\?!facts\$\)", pattern).group(1).split("|"))
    assert prefixes == {"spark"} | {role for roles in ds.load().roles.values() for role in roles}
