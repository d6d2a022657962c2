"""Settings that more than one role reads live in roles/spark_defaults alone: each value is
written there once, every role that reads one depends on spark_defaults (whose defaults Ansible
then gives it), and no role falls back to a value of its own, reads another role's internals or
reads another role's files by path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
HOME = "spark_defaults"
DEPENDENCY = f"dgx_spark.cluster.{HOME}"
SHARED = yaml.safe_load((ROOT / "roles" / HOME / "defaults/main.yml").read_text())
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta/main.yml").exists())

# Each shared value, as it would be written again: the pattern that finds it in a value.
LITERALS = {
    "/etc/dgx-spark/comm.env": r"/etc/dgx-spark/comm\.env",
    "dgx-spark/vllm-serving": r"dgx-spark/vllm-serving",
    # The container's name. /etc/dgx-spark-ray is another thing: the directory inside each
    # role's own container where that role mounts the token.
    "dgx-spark-ray": r"(?<![\w/-])dgx-spark-ray(?![\w/-])",
    "6379": r"(?<![\d])6379(?![\d])",
    "/etc/dgx-spark/ray": r"/etc/dgx-spark/ray(?![\w-])",
    "/var/lib/dgx-spark/ray": r"/var/lib/dgx-spark/ray(?![\w-])",
    "/var/lib/dgx-spark/cache": r"/var/lib/dgx-spark/cache(?![\w-])",
    "vllm-node:latest": r"(?<![\w/-])vllm-node:latest(?![\w.-])",
    "hellohal2064/vllm-qwen3.5-gb10": r"hellohal2064/vllm-qwen3\.5-gb10",
    "/var/lib/dgx-spark/watchdog": r"/var/lib/dgx-spark/watchdog(?![\w-])",
    # The serving and Ray ports that host_prep's firewall and monitoring read too.
    **{port: rf"(?<![\d]){port}(?![\d])" for port in (
        "8000", "29501", "6380", "6381", "52365", "52366", "52367", "52368", "8265")},
}  # fmt: skip


def values(node) -> list[str]:
    """Every scalar of a loaded YAML document, as text (keys of mappings included)."""
    if isinstance(node, dict):
        return [text for key, value in node.items() for text in (str(key), *values(value))]
    if isinstance(node, list):
        return [text for item in node for text in values(item)]
    return [] if node is None else [str(node)]


def roles_writing(pattern: str, roles_dir: Path) -> set[str]:
    """The roles whose defaults or vars hold a value that matches pattern (comments aside)."""
    found = set()
    for path in [*roles_dir.glob("*/defaults/**/*.yml"), *roles_dir.glob("*/vars/**/*.yml")]:
        if any(re.search(pattern, text) for text in values(yaml.safe_load(path.read_text()))):
            found.add(path.relative_to(roles_dir).parts[0])
    return found


def role_text(role: str) -> str:
    """What a role runs with: its defaults, vars, tasks, handlers and templates."""
    parts = ("defaults", "vars", "tasks", "handlers", "templates")
    return "\n".join(
        path.read_text()
        for part in parts
        for path in sorted((ROOT / "roles" / role / part).glob("**/*"))
        if path.is_file()
    )


def reads_shared(role: str) -> list[str]:
    """The spark_defaults variables a role names, and the other roles' defaults it reads (which
    derive theirs from spark_defaults, as host_prep's firewall and monitoring do)."""
    text = role_text(role)
    named = [name for name in SHARED if re.search(rf"\b{name}\b", text)]
    return named + (["another role's defaults/main.yml"] if "/defaults/main.yml" in text else [])


# A path that climbs out of the role's own folder to a sibling: role_path, then one /.. that
# another /.. does not follow ({{ role_path }}/../../plugins is the collection's, not a role's).
_UP_TO_THE_ROLES = re.compile(r"role_path[^\w/.]*/\.\.(?!/\.\.)")
# Reads by path that are still to move; each must still be one (remove it here once it is not).
KNOWN_REACH_INS: set[tuple[str, str]] = set()


def reach_ins(role: str, roles_dir: Path, roles: list[str]) -> dict[str, list[str]]:
    """The values (comments aside) in a role's tasks, handlers, vars, defaults, meta and
    templates that name a path into another role's folder: {file: values}."""
    pattern = "|".join(re.escape(r) for r in roles if r != role) or "(?!)"
    into = re.compile(rf"(?:roles|\.\.)/(?:{pattern})(?:/|$)")
    found = {}
    for path in sorted((roles_dir / role).glob("**/*")):
        part = path.relative_to(roles_dir / role).parts[0]
        if not path.is_file() or part not in ("tasks", "handlers", "vars", "defaults", "meta",
                                              "templates"):  # fmt: skip
            continue
        text = path.read_text()
        scalars = values(yaml.safe_load(text)) if path.suffix in (".yml", ".yaml") else [text]
        hits = [v for v in scalars if _UP_TO_THE_ROLES.search(v) or into.search(v)]
        if hits:
            found[str(path.relative_to(roles_dir / role))] = hits
    return found


def dependencies(role: str) -> list[str]:
    meta = yaml.safe_load((ROOT / "roles" / role / "meta/main.yml").read_text())
    return [dep["role"] if isinstance(dep, dict) else dep for dep in meta.get("dependencies") or []]


@pytest.mark.parametrize("literal", LITERALS)
def test_each_shared_value_is_written_in_spark_defaults_alone(literal):
    assert roles_writing(LITERALS[literal], ROOT / "roles") == {HOME}, (
        f"{literal} belongs in roles/{HOME}/defaults/main.yml only; derive the role's own "
        f"variable from the spark_* variable there instead"
    )


def test_a_value_written_in_a_second_role_is_found(tmp_path):
    for role, text in {
        HOME: "spark_ray_gcs_port: 6379\nspark_ray_tmp_dir: /var/lib/dgx-spark/ray/tmp\n",
        "a": "a_port: '{{ spark_ray_gcs_port }}'\n# 6379 in a comment is no setting\n",
        "b": "b_env: {RAY_ADDRESS: '10.0.0.1:6379'}\nb_ports: [16379]\n",
        "c": "_c_dirs:\n  - /var/lib/dgx-spark/ray/rpc\n  - /var/lib/dgx-spark/rays\n",
    }.items():
        folder = tmp_path / role / ("vars" if role == "c" else "defaults")
        folder.mkdir(parents=True)
        (folder / "main.yml").write_text(text)
    assert roles_writing(LITERALS["6379"], tmp_path) == {HOME, "b"}
    assert roles_writing(LITERALS["/var/lib/dgx-spark/ray"], tmp_path) == {HOME, "c"}


def test_spark_defaults_holds_only_defaults():
    home = ROOT / "roles" / HOME
    files = {str(p.relative_to(home)) for p in home.glob("**/*") if p.is_file()}
    assert files == {"README.md", "defaults/main.yml", "meta/main.yml", "meta/argument_specs.yml"}
    assert dependencies(HOME) == []


@pytest.mark.parametrize("role", [r for r in ROLES if r != HOME])
def test_a_role_that_reads_a_shared_setting_depends_on_spark_defaults(role):
    read = reads_shared(role)
    if read:
        assert DEPENDENCY in dependencies(role), f"{role} reads {read} without depending on {HOME}"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_falls_back_to_a_value_of_its_own_for_a_shared_setting(role):
    text = role_text(role)
    for name in SHARED:
        assert not re.search(rf"\b{name}\s*\|\s*default\(", text), (
            f"{role}: {name} always has a value from {HOME}; a default of its own repeats it"
        )


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_another_roles_internal_variables(role):
    text = role_text(role)
    for other in ROLES:
        if other != role:
            found = re.findall(rf"(?<![\w.]){re.escape('_' + other + '_')}\w+", text)
            assert not found, f"{role} reads {other}'s internal variables: {sorted(set(found))}"


def test_the_roles_are_found():
    assert HOME in ROLES and len(ROLES) > 1
    assert {"spark_comm_env_file", "spark_serving_image", "spark_ray_gcs_port"} <= set(SHARED)


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_another_roles_files_by_path(role):
    found = reach_ins(role, ROOT / "roles", ROLES)
    unknown = {f: v for f, v in found.items() if (role, f) not in KNOWN_REACH_INS}
    assert not unknown, (
        f"{role} reads another role's files by path: {unknown}; put a value several roles read in "
        f"roles/{HOME}/defaults/main.yml and derive each role's own from it"
    )


@pytest.mark.parametrize(("role", "file"), sorted(KNOWN_REACH_INS))
def test_each_known_read_by_path_is_still_one(role, file):
    assert file in reach_ins(role, ROOT / "roles", ROLES), f"remove {role}/{file} from the list"


def test_a_read_by_path_is_found(tmp_path):
    files = {
        "a/tasks/main.yml": "- ansible.builtin.include_vars:\n"
        '    file: "{{ role_path }}/../{{ item }}/defaults/main.yml"\n',
        "b/vars/main.yml": "_b: \"{{ lookup('file', role_path ~ '/../a/defaults/main.yml') }}\"",
        "c/tasks/main.yml": "- ansible.builtin.copy:\n    src: ../../a/files/x.py\n    dest: /x\n",
        "d/templates/x.j2": "{{ lookup('file', playbook_dir ~ '/roles/b/files/y') }}\n",
        # Not reads by path: the collection's plugins, a comment, the role's own files.
        "e/tasks/main.yml": "# reads roles/a/defaults/main.yml by path (no more)\n"
        "- ansible.builtin.copy:\n"
        '    src: "{{ role_path }}/../../plugins/module_utils/x.py"\n    dest: /x\n'
        '- ansible.builtin.template:\n    src: "{{ role_path }}/templates/e.j2"\n    dest: /y\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    roles = ["a", "b", "c", "d", "e"]
    found = {role: sorted(reach_ins(role, tmp_path, roles)) for role in roles}
    assert found == {"a": ["tasks/main.yml"], "b": ["vars/main.yml"], "c": ["tasks/main.yml"],
                     "d": ["templates/x.j2"], "e": []}  # fmt: skip
