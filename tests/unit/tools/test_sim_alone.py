"""tools/sim_alone.py: the shuffled order from a seed, the table, what it runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("sim_alone", ROOT / "tools" / "sim_alone.py")
sim_alone = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim_alone)

NAMES = [f"test_{n:02d}.py" for n in range(12)]


def test_the_same_seed_gives_the_same_order_whatever_order_it_was_given_in():
    one = sim_alone.order(NAMES, 46)
    assert one == sim_alone.order(list(reversed(NAMES)), 46)
    assert sorted(one) == NAMES
    assert one != NAMES  # 12 names: the chance that a shuffle leaves them sorted is 1 in 12!


def test_other_seeds_give_other_orders():
    orders = {tuple(sim_alone.order(NAMES, seed)) for seed in range(10)}
    assert len(orders) == 10


def test_the_modules_are_the_folders_test_files(tmp_path):
    for name in ("test_b.py", "test_a.py", "conftest.py", "fake_hub.py", "test_c.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "monitoring").mkdir()
    assert sim_alone.modules(tmp_path) == ["test_a.py", "test_b.py"]


@pytest.mark.parametrize(
    ("rc", "word"), [(0, "pass"), (1, "fail"), (5, "none"), (2, "error"), (4, "error")]
)
def test_an_exit_status_in_a_word(rc, word):
    assert sim_alone.outcome(rc) == word


def test_the_table_lists_each_module_in_the_order_run_with_the_seed_and_totals():
    rows = [("test_rerun.py", "pass", 192.04), ("test_upgrade.py", "fail", 241.0),
            ("test_pair.py", "none", 1.26)]  # fmt: skip
    assert sim_alone.table(rows, 46).splitlines() == [
        "seed 46",
        "module           result   seconds",
        "test_rerun.py    pass       192.0",
        "test_upgrade.py  fail       241.0",
        "test_pair.py     none         1.3",
        "total            1 pass, 1 fail, 1 none  (434.3 s)",
    ]


def test_without_a_seed_one_is_drawn_and_kept():
    args = sim_alone.arguments([])
    assert isinstance(args.seed, int) and args.marks == "not drill"
    assert sim_alone.arguments(["--seed", "3", "-m", "", "--", "-x"]).pytest_args == ["-x"]


def test_each_module_runs_in_its_own_pytest_process_with_the_marks(monkeypatch, tmp_path):
    seen = []

    def fake_run(cmd, **kw):
        seen.append((cmd, kw["cwd"]))
        return SimpleNamespace(returncode=1 if "test_b.py" in cmd[-3] else 0)

    monkeypatch.setattr(sim_alone, "ROOT", tmp_path)
    (tmp_path / "tests" / "sim").mkdir(parents=True)
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / "tests" / "sim" / name).write_text("")
    monkeypatch.setattr(sim_alone.subprocess, "run", fake_run)
    assert sim_alone.main(["--seed", "1"]) == 1
    assert sorted(cmd[4] for cmd, _cwd in seen) == ["tests/sim/test_a.py", "tests/sim/test_b.py"]
    for cmd, cwd in seen:
        assert cmd[:4] == [sys.executable, "-m", "pytest", "-q"] and cwd == tmp_path
        assert cmd[-2:] == ["-m", "not drill"]
    assert sorted(p.name for p in (tmp_path / ".cache" / "sim-alone").iterdir()) == [
        "test_a.log", "test_b.log",
    ]  # fmt: skip


def test_a_dry_run_prints_the_order_and_runs_nothing():
    out = subprocess.run(
        [sys.executable, "tools/sim_alone.py", "--seed", "5", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    names = sim_alone.order(sim_alone.modules(ROOT / "tests" / "sim"), 5)
    assert out.stdout == f"seed 5: {len(names)} modules: {' '.join(names)}\n"
