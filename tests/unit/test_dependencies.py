"""Every collection the playbooks and roles call is one galaxy.yml declares (or ansible.builtin)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FQCN = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*\b")
OWN = {"ansible.builtin", "dgx_spark.cluster"}


def used_collections() -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    files = [*ROOT.glob("*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("roles/*/*/*.yml")]
    for path in files:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for match in FQCN.finditer(line):
                name = f"{match.group(1)}.{match.group(2)}"
                # Only namespaces that are collections (not Jinja attribute chains).
                if match.group(1) in {"ansible", "community", "dgx_spark"}:
                    used.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return used


def test_every_used_collection_is_declared():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    declared = set(galaxy.get("dependencies") or {}) | OWN
    undeclared = {name: files for name, files in used_collections().items() if name not in declared}
    assert not undeclared, f"used but not in galaxy.yml's dependencies: {undeclared}"


def test_the_inventory_check_needs_no_community_general():
    assert "community.general" not in (ROOT / "playbooks/check_inventory.yml").read_text()
