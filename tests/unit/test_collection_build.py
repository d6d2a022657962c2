"""ansible-galaxy builds a tarball that installs and whose playbooks run by FQCN."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*cmd: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_build_install_and_run_by_fqcn(tmp_path):
    galaxy = str(BIN / "ansible-galaxy")
    run(galaxy, "collection", "build", "--output-path", str(tmp_path), str(ROOT), cwd=tmp_path)
    (tarball,) = tmp_path.glob("dgx_spark-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "galaxy.yml" not in names and "MANIFEST.json" in names
    assert not any(n.startswith((".venv", ".cache", ".sim", "collections/")) for n in names)
    # What is not the collection stays out: the simulated pair, its tooling, measured results.
    assert not any(n.startswith(("sim/", "tools/", "benchmarks/results/")) for n in names)
    assert "Makefile" not in names and "playbooks/deploy.yml" in names
    assert "plugins/module_utils/vllm_registry.py" in names

    dest = tmp_path / "installed"
    # --no-deps: community.docker and ansible.posix come with the ansible package here.
    run(
        galaxy,
        "collection",
        "install",
        "--force",
        "--no-deps",
        "-p",
        str(dest),
        str(tarball),
        cwd=tmp_path,
    )
    assert (dest / "ansible_collections" / "dgx_spark" / "cluster" / "deploy.yml").exists()

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
    # The main job by its collection name, against the production inventory: a syntax check
    # (it contacts no host), which resolves every imported stage playbook, role and module.
    out = run(
        str(BIN / "ansible-playbook"), "dgx_spark.cluster.deploy", "--syntax-check",
        "-i", str(ROOT / "inventories" / "sparks"), cwd=tmp_path, env=env,
    ).stdout  # fmt: skip
    assert "playbook: " in out and "playbooks/deploy.yml" in out, out
