"""sim/'s modules, loaded by path as tests/sim/conftest.py loads simctl.py: simctl.py puts sim/
on sys.path and imports sim_common and sim_images by name. Each test gets fresh copies, and
sys.path and sys.modules are left as they were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[3] / "sim"
NEIGHBOURS = ("sim_common", "sim_images")


@pytest.fixture(autouse=True)
def _no_phase_log(monkeypatch):
    """make test exports the phase log of the run: the stand-in builds here must not write
    their steps ("built in 0s") into it. A test that reads the log sets its own."""
    monkeypatch.delenv("DGX_SPARK_PHASES", raising=False)


@pytest.fixture()
def simctl(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in NEIGHBOURS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("simctl_under_test", SIM / "simctl.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    yield module
    for name in NEIGHBOURS:
        sys.modules.pop(name, None)


@pytest.fixture()
def sim_images(simctl):
    """The sim_images that simctl imported (one copy: a monkeypatch reaches simctl's calls)."""
    return sys.modules["sim_images"]


@pytest.fixture()
def sim_common(simctl):
    return simctl.sim_common
