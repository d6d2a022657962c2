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


class _Stop(Exception):
    pass


def _spec_of_main(module, monkeypatch) -> dict:
    """The argument spec a module's main() gives AnsibleModule."""
    seen = {}

    def capture(argument_spec, **_kwargs):
        seen.update(argument_spec)
        raise _Stop

    monkeypatch.setattr(module, "AnsibleModule", capture)
    with pytest.raises(_Stop):
        module.main()
    return seen


def test_the_endpoint_options_are_one_spec_the_fragment_documents(monkeypatch):
    """vllm_endpoint, vllm_endpoint_info and the vllm_start_wait action take the endpoint's
    options from vllm_client.ENDPOINT_OPTIONS (the same objects, so one default each), and the
    vllm_endpoint fragment documents exactly those options with those types and defaults."""
    from ansible_collections.dgx_spark.cluster.plugins.action import vllm_start_wait
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_client import (
        ENDPOINT_OPTIONS,
    )
    from ansible_collections.dgx_spark.cluster.plugins.modules import (
        vllm_endpoint,
        vllm_endpoint_info,
    )

    specs = {
        "vllm_endpoint": _spec_of_main(vllm_endpoint, monkeypatch),
        "vllm_endpoint_info": _spec_of_main(vllm_endpoint_info, monkeypatch),
        "vllm_start_wait": vllm_start_wait.ARGUMENT_SPEC,
    }
    for user, spec in specs.items():
        for name, option in ENDPOINT_OPTIONS.items():
            if (user, name) == ("vllm_endpoint_info", "request_timeout"):
                # The info module keeps its earlier name of the option as an alias.
                assert spec[name] == {**option, "aliases": ["timeout"]}
            else:
                assert spec[name] is option, (user, name)

    # Its DOCUMENTATION and its ADDRESS part (the url and key, which vllm_soak takes alone).
    fragment = {}
    source = ast.parse((ROOT / "plugins/doc_fragments/vllm_endpoint.py").read_text())
    for node in ast.walk(source):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in (
            "DOCUMENTATION",
            "ADDRESS",
        ):
            fragment |= yaml.safe_load(node.value.value)["options"]
    assert set(fragment) == set(ENDPOINT_OPTIONS)
    assert (
        "dgx_spark.cluster.vllm_endpoint.address"
        in documentation(ROOT / "plugins/modules/vllm_soak.py")["extends_documentation_fragment"]
    )
    for name, option in ENDPOINT_OPTIONS.items():
        assert fragment[name]["type"] == option["type"], name
        assert fragment[name].get("default") == option.get("default"), name
    # A module that describes one of them again in its own words keeps the type and default.
    for user in specs:
        own = documentation(ROOT / f"plugins/modules/{user}.py")["options"]
        for name in set(own) & set(ENDPOINT_OPTIONS):
            assert own[name]["type"] == ENDPOINT_OPTIONS[name]["type"], (user, name)
            assert own[name].get("default") == ENDPOINT_OPTIONS[name].get("default"), (user, name)
