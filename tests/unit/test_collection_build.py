"""ansible-galaxy builds the collection a Galaxy user runs: galaxy.yml's build_ignore is the one
list of what stays out, the tarball installs, and its playbooks run by FQCN."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
# ansible-galaxy's own ignore list, beside build_ignore (ansible/galaxy/collection/__init__.py):
# the metadata files it writes itself, galaxy.yml, bytecode and caches.
ALWAYS_LEFT_OUT = ["galaxy.yml", "*.pyc", "*/__pycache__/*", "tests/output"]


def run(*cmd: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def left_out(path: str) -> bool:
    """As ansible-galaxy decides: a pattern matches the path or one of its folders."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    patterns = GALAXY["build_ignore"] + ALWAYS_LEFT_OUT
    return any(fnmatch.fnmatchcase(p, pat) for p in prefixes for pat in patterns)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    galaxy = str(BIN / "ansible-galaxy")
    run(galaxy, "collection", "build", "--output-path", str(out), str(ROOT), cwd=out)
    (built,) = out.glob("dgx_spark-cluster-*.tar.gz")
    return built


@pytest.fixture(scope="module")
def members(tarball) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tarball) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_build_ignore_is_the_one_list_of_what_does_not_ship(members):
    # Every file git knows (tracked, or new and not ignored) ships unless build_ignore names it:
    # nothing else decides.
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    known = {p for p in listed if p and (ROOT / p).exists()}
    shipped = {n for n, m in members.items() if not m.isdir()} - {"MANIFEST.json", "FILES.json"}
    assert shipped == {p for p in known if not left_out(p)}
    assert not [n for n, m in members.items() if m.issym() or m.islnk()]


def test_the_tarball_holds_the_collection_not_the_workshop(members):
    names = set(members)
    for part in ("plugins", "roles", "playbooks", "meta", "docs", "inventories"):
        assert members[part].isdir(), part
    for name in ("README.md", "LICENSE", "CHANGELOG.md", "meta/runtime.yml", "docs/index.md",
                 "playbooks/deploy.yml", "plugins/module_utils/vllm_registry.py",
                 "inventories/sparks/hosts.yml", "requirements.yml"):  # fmt: skip
        assert name in names, name
    # The test rig (issue #45): nothing of it runs from an installed collection.
    workshop = ("tests/", "molecule/", "sim/", "benchmarks/", "tools/", ".ci/", "inventories/sim/",
                "changelogs/fragments/", "collections/", ".venv/", ".cache/", ".sim/")  # fmt: skip
    assert not [n for n in names if n.startswith(workshop)]
    for name in ("requirements.txt", "ansible.cfg", "ruff.toml", "Makefile", "sparks", "tests",
                 "molecule", "sim", "benchmarks", "tools", ".ci", "inventories/sim",
                 ".ansible-lint", ".yamllint", ".gitignore"):  # fmt: skip
        assert name not in names, name


def test_release_metadata(tarball, members):
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        license_text = tar.extractfile("LICENSE").read().decode()
        changelog = tar.extractfile("CHANGELOG.md").read().decode()
    info = manifest["collection_info"]
    assert info["license"] == ["GPL-3.0-or-later"]
    assert "GNU GENERAL PUBLIC LICENSE" in license_text
    assert "Version 3, 29 June 2007" in license_text
    assert info["authors"] and all(a.strip() for a in info["authors"])
    # A URL is a real one or none: no placeholder host.
    urls = [info[k] for k in ("repository", "documentation", "homepage", "issues") if info[k]]
    assert not [u for u in urls if ".invalid" in u or "example." in u]
    # CHANGELOG.md is antsibull-changelog's, from changelogs/changelog.yaml, at this version.
    assert f'<a id="v{info["version"].replace(".", "-")}"></a>' in changelog
    assert "changelogs/changelog.yaml" in members


def test_build_install_and_run_by_fqcn(tmp_path, tarball):
    galaxy = str(BIN / "ansible-galaxy")
    dest = tmp_path / "installed"
    # --no-deps: community.docker and ansible.posix come with the ansible package here.
    run(galaxy, "collection", "install", "--force", "--no-deps", "-p", str(dest), str(tarball),
        cwd=tmp_path)  # fmt: skip
    installed = dest / "ansible_collections" / "dgx_spark" / "cluster"
    assert (installed / "deploy.yml").exists()

    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")  # not the checkout's: only the installed copy may resolve
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_COLLECTIONS_PATH": str(dest),
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    out = run(
        str(BIN / "ansible-playbook"), "dgx_spark.cluster.check_inventory",
        "-i", str(ROOT / "inventories" / "sim"), cwd=tmp_path, env=env,
    ).stdout  # fmt: skip
    assert "Require distinct addresses across the nodes" in out
    assert "failed=0" in out
    # The main job by its collection name, against the example inventory as it ships: a syntax
    # check (it contacts no host), which resolves every imported stage playbook, role and module.
    out = run(
        str(BIN / "ansible-playbook"), "dgx_spark.cluster.deploy", "--syntax-check",
        "-i", str(installed / "inventories" / "sparks"), cwd=tmp_path, env=env,
    ).stdout  # fmt: skip
    assert "playbook: " in out and "playbooks/deploy.yml" in out, out


def test_requirements_yml_is_galaxy_yml_s_dependencies():
    wanted = yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    assert {c["name"]: c["version"] for c in wanted} == GALAXY["dependencies"]


def test_the_docs_run_the_collection_s_playbooks_by_name(members):
    # What a Galaxy user runs: every `ansible-playbook dgx_spark.cluster.<name>` of the README
    # and docs/ is a playbook the tarball holds, and no page runs a checkout path.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = set()
    for page in pages:
        text = page.read_text()
        named |= set(re.findall(r"ansible-playbook dgx_spark\.cluster\.(\w+)", text))
        if page.name not in ("simulated-pair.md", "deploy.md"):  # both say what a checkout runs
            assert not re.findall(r"ansible-playbook (?:playbooks/|deploy\.yml)", text), page
    assert {"deploy", "status", "teardown"} <= named
    assert not [n for n in named if f"playbooks/{n}.yml" not in members]
    # CI (.ci/run) runs the README's test command as it is written there.
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "\n    make test\n" in (ROOT / "README.md").read_text()
