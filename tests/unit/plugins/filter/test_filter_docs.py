"""Every filter of plugins/filter/*.py has its documentation sidecar, plugins/filter/<name>.yml.

ansible-doc reads a filter's documentation from that file; without it the filter is missing
from ``ansible-doc -t filter``. The sidecar must name the filter and document the filter's
input as ``_input`` and every further parameter of the Python function as an option.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

FILTER_DIR = Path(__file__).resolve().parents[4] / "plugins" / "filter"
PACKAGE = "ansible_collections.dgx_spark.cluster.plugins.filter"
# *args / **kwargs have no name a playbook could pass; the sidecar documents them its own way.
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _filters():
    found = []
    for source in sorted(FILTER_DIR.glob("*.py")):
        if source.name == "__init__.py":
            continue
        module = importlib.import_module(f"{PACKAGE}.{source.stem}")
        for name, func in sorted(module.FilterModule().filters().items()):
            found.append(pytest.param(name, func, id=name))
    return found


FILTERS = _filters()


def test_filters_are_found():
    assert FILTERS, f"no filter plugins found under {FILTER_DIR}"


@pytest.mark.parametrize(("name", "func"), FILTERS)
def test_filter_has_documentation_sidecar(name, func):
    sidecar = FILTER_DIR / f"{name}.yml"
    assert sidecar.is_file(), f"{name} has no documentation sidecar {sidecar.name}"
    doc = yaml.safe_load(sidecar.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), f"{sidecar.name} is not a YAML mapping"
    for section in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        assert doc.get(section), f"{sidecar.name} has no {section}"
    documentation = doc["DOCUMENTATION"]
    assert documentation.get("name") == name
    options = documentation.get("options") or {}
    params = [
        p.name for p in inspect.signature(func).parameters.values() if p.kind not in _VARIADIC
    ]
    expected = ["_input", *params[1:]]
    missing = [option for option in expected if option not in options]
    assert not missing, f"{sidecar.name} does not document {missing}"
