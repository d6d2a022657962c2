"""tools/callback/module_zip_cache.py: the kept directory's name, what is pruned, and a real
ansible-playbook run that takes its module archive from the kept directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import load_tool

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "tools" / "callback" / "module_zip_cache.py"


@pytest.fixture(scope="module")
def cache():
    return load_tool("callback/module_zip_cache")


VERSIONS = {"ansible-core": "2.19.14", "ansible": "12.3.0"}
FILES = [("modules/a.py", 10, 1), ("module_utils/b.py", 20, 2)]


def test_the_same_inputs_in_any_order_give_the_same_name(cache):
    assert cache.cache_key(VERSIONS, FILES) == cache.cache_key(
        dict(reversed(VERSIONS.items())), list(reversed(FILES))
    )


@pytest.mark.parametrize(
    "versions, files",
    [
        ({**VERSIONS, "ansible-core": "2.19.15"}, FILES),
        ({**VERSIONS, "ansible": "12.4.0"}, FILES),
        (VERSIONS, [("modules/a.py", 11, 1), FILES[1]]),
        (VERSIONS, [("modules/a.py", 10, 3), FILES[1]]),
        (VERSIONS, [*FILES, ("modules/c.py", 1, 1)]),
        (VERSIONS, FILES[:1]),
    ],
    ids=["core", "package", "size", "mtime", "file-added", "file-removed"],
)
def test_any_change_of_what_builds_the_archives_gives_another_name(cache, versions, files):
    assert cache.cache_key(versions, files) != cache.cache_key(VERSIONS, FILES)


def test_plugin_files_skip_bytecode_and_name_paths_under_plugins(cache, tmp_path):
    (tmp_path / "modules" / "__pycache__").mkdir(parents=True)
    (tmp_path / "modules" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "modules" / "a.py").write_text("abc")
    [(path, size, mtime_ns)] = cache.plugin_files(tmp_path)
    assert (path, size) == ("modules/a.py", 3)
    assert mtime_ns == (tmp_path / "modules" / "a.py").stat().st_mtime_ns


def test_only_other_directories_unused_for_a_day_are_stale(cache, tmp_path):
    now = 1_000_000.0
    for name, age in (("current", 90_000), ("old", 90_000), ("recent", 3_600)):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (now - age, now - age))
    assert cache.stale_directories(tmp_path, "current", now) == [tmp_path / "old"]
    assert cache.stale_directories(tmp_path / "absent", "current", now) == []


PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.stat:
        path: /
"""


def _run(tmp_path: Path, cfg: str) -> str:
    (tmp_path / "ansible.cfg").write_text(cfg)
    (tmp_path / "play.yml").write_text(PLAY)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_DEBUG": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "play.yml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_second_run_takes_its_archive_from_the_kept_directory(tmp_path):
    cfg = f"[defaults]\ncallback_plugins = {PLUGIN.parent}\ninterpreter_python = {sys.executable}\n"
    _run(tmp_path, cfg)
    second = _run(tmp_path, cfg)
    assert "ANSIBALLZ: using cached module" in second
    assert "ansible.modules.stat-" in second.split("ANSIBALLZ: using cached module", 1)[1][:400]


def test_without_the_callback_a_run_builds_its_archive_again(tmp_path):
    cfg = f"[defaults]\ninterpreter_python = {sys.executable}\n"
    _run(tmp_path, cfg)
    assert "ANSIBALLZ: using cached module" not in _run(tmp_path, cfg)
