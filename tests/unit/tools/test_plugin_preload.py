"""tools/callback/plugin_preload.py: which plugin modules it names, and that it imports each
one it can (in the process that forks the workers) and passes over one that fails."""

from __future__ import annotations

import sys

import pytest
from support.tools import load_tool


@pytest.fixture(scope="module")
def preload():
    return load_tool("callback/plugin_preload")


def test_it_names_the_filter_lookup_and_action_plugins_as_the_loader_does(preload, tmp_path):
    for path in ("filter/b.py", "filter/a.py", "filter/_helper.py", "filter/a.yml",
                 "lookup/c.py", "action/d.py", "modules/e.py", "module_utils/f.py"):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert preload.plugin_modules(tmp_path) == [
        f"{preload.PACKAGE}.filter.a",
        f"{preload.PACKAGE}.filter.b",
        f"{preload.PACKAGE}.lookup.c",
        f"{preload.PACKAGE}.action.d",
    ]


def test_the_collections_own_plugins_are_found(preload):
    names = preload.plugin_modules(preload.PLUGINS)
    assert f"{preload.PACKAGE}.filter.model_profile" in names
    assert f"{preload.PACKAGE}.action.vllm_start_wait" in names


def test_each_importable_one_is_imported_and_a_broken_one_passed_over(
    preload, tmp_path, monkeypatch
):
    package = tmp_path / "preloadtest" / "plugins"
    for kind in ("filter", "lookup", "action"):
        (package / kind).mkdir(parents=True)
        (package / kind / "__init__.py").write_text("")
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "filter" / "good.py").write_text("LOADED = True\n")
    (package / "lookup" / "broken.py").write_text("raise ImportError('no such thing')\n")
    (package / "action" / "also_good.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preload, "PLUGINS", package)
    monkeypatch.setattr(preload, "PACKAGE", "preloadtest.plugins")
    preload.CallbackModule()
    assert sys.modules["preloadtest.plugins.filter.good"].LOADED
    assert sys.modules["preloadtest.plugins.action.also_good"].LOADED
    assert "preloadtest.plugins.lookup.broken" not in sys.modules
