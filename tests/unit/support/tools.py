"""Importing the checkout's tools/ scripts by path in unit tests (tools/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def load_tool(name: str):
    """Import ``tools/<name>.py`` by path (tools/ is not a package); ``name`` may go through a
    folder (``callback/module_zip_cache``)."""
    path = REPO_ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"dgx_spark_tools_{name.replace('/', '_')}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
