"""plugins/doc_fragments: each fragment is shared by two modules or more, and a module that uses
the code a fragment documents takes its options from the fragment instead of writing them again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]
FRAGMENTS = sorted((ROOT / "plugins/doc_fragments").glob("*.py"))
MODULES = sorted((ROOT / "plugins/modules").glob("*.py"))
# A fragment and the module_utils whose users it documents.
USED_WITH = {"image_run": "plugins.module_utils.image_run"}


def documentation(path: Path) -> dict:
    """The DOCUMENTATION of a module, or of a fragment's ModuleDocFragment, as YAML."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError(f"{path.name} has no DOCUMENTATION")


def extenders(fragment: str) -> list[str]:
    name = f"dgx_spark.cluster.{fragment}"
    return [
        m.stem
        for m in MODULES
        if name in (documentation(m).get("extends_documentation_fragment") or [])
    ]


def test_fragments_are_found():
    assert {"image_run", "vllm_endpoint"} <= {f.stem for f in FRAGMENTS}


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_each_fragment_is_shared(fragment):
    assert len(extenders(fragment.stem)) >= 2, f"{fragment.stem}: {extenders(fragment.stem)}"


@pytest.mark.parametrize("fragment", sorted(USED_WITH))
def test_a_module_that_uses_the_code_takes_the_fragments_options(fragment):
    options = set(documentation(ROOT / f"plugins/doc_fragments/{fragment}.py")["options"])
    users = [m for m in MODULES if USED_WITH[fragment] in m.read_text()]
    assert len(users) >= 2
    for module in users:
        doc = documentation(module)
        assert f"dgx_spark.cluster.{fragment}" in doc.get("extends_documentation_fragment", [])
        assert not options & set(doc["options"]), f"{module.stem} documents them again"
