"""Shared set-up for the unit tests.

* ``<repo>/collections`` goes on ``sys.path`` and under Ansible's collection loader:
  ``collections/ansible_collections/dgx_spark/cluster`` is a committed link to the repository
  root, so the collection's code imports as ``ansible_collections.dgx_spark.cluster...`` and
  its filters template exactly as Ansible loads them.
* ``vllm_sdist``: ``tools/vllm_sdist.py`` loaded from its path.
* ``fetch_vllm_sdist``: fetch (or find cached) a published vLLM source archive. Where it
  cannot be fetched the test is skipped, unless the ``CI`` variable is set: there it fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
from support.tools import load_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO_ROOT / "collections"
_LINK = COLLECTIONS / "ansible_collections" / "dgx_spark" / "cluster"

if not (_LINK / "galaxy.yml").is_file():
    raise RuntimeError(
        f"{_LINK} must be a link to the repository root "
        "(mkdir -p collections/ansible_collections/dgx_spark && "
        "ln -s ../../.. collections/ansible_collections/dgx_spark/cluster)"
    )
# The sim inventory's vaulted sudo password (inventories/sim/group_vars/sparks/vault.yml): every
# ansible run against it, here or in a child process, needs the sim's vault password.
os.environ.setdefault(
    "ANSIBLE_VAULT_PASSWORD_FILE", str(REPO_ROOT / "inventories" / "sim" / "vault-password")
)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
# Ansible's own collection loader over the same directory, so that a Templar in a test finds the
# collection's filters (dgx_spark.cluster.model_profile in spark_defaults' defaults) as a run does.
_AnsibleCollectionFinder(paths=[str(COLLECTIONS)])._install()
# Shared test helpers: tests/unit/support.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "network: fetches published vLLM source archives (cached under .cache/vllm-sdist); "
        "skipped when offline unless CI is set",
    )


@pytest.fixture(scope="session")
def vllm_sdist():
    return load_tool("vllm_sdist")


@pytest.fixture(scope="session")
def fetch_vllm_sdist(vllm_sdist):
    """``fetch(version) -> Path`` of the verified archive in the shared cache."""

    def fetch(version: str) -> Path:
        try:
            return vllm_sdist.fetch_sdist(version)
        except (vllm_sdist.SdistError, OSError) as exc:
            reason = f"vllm-{version}.tar.gz cannot be fetched: {exc}"
            if os.environ.get("CI"):
                pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
            pytest.skip(reason)

    return fetch
