"""Every role's README lists its variables, every one of them and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in ROOT.glob("roles/*") if p.is_dir())


def listed_variables(readme: str) -> set[str]:
    """The names in the table rows under the README's `## Variables`, up to the next heading."""
    match = re.search(r"^## Variables\n(.*?)(?=^#|\Z)", readme, flags=re.MULTILINE | re.DOTALL)
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", match.group(1) if match else "", re.MULTILINE))


def test_roles_are_found():
    assert ROLES


@pytest.mark.parametrize("role", ROLES)
def test_readme_lists_every_variable(role):
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())
    options = set(specs["argument_specs"]["main"]["options"])
    readme = (ROOT / f"roles/{role}/README.md").read_text()
    listed = listed_variables(readme)
    assert listed == options, {"missing": options - listed, "unknown": listed - options}


def test_only_the_variables_section_counts():
    readme = "| `r_fact` | x |\n## Variables\n| `r_a` | `1` | a |\n## More\n| `r_b` | x |\n"
    assert listed_variables(readme) == {"r_a"}
