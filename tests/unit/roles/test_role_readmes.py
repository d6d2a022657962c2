"""The roles whose README lists their variables list every one of them, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTED = ("ray_cluster", "vllm_serve")


@pytest.mark.parametrize("role", DOCUMENTED)
def test_readme_lists_every_variable(role):
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())
    options = set(specs["argument_specs"]["main"]["options"])
    readme = (ROOT / f"roles/{role}/README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", readme, flags=re.MULTILINE))
    assert listed == options, {"missing": options - listed, "unknown": listed - options}
