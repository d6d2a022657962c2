"""sim/node/dgxsim_pyc.py: the node's Python looks up the bytecode of what it imports from a
zip (as every Ansible module arrives) by the source's digest, and falls back to compiling it.
Each import runs in its own interpreter, as a task's module does on a node."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parents[3] / "sim" / "node"
SOURCES = {
    "pkg/__init__.py": "from pkg.util import answer\n",
    "pkg/util.py": "def answer():\n    return 42\n\ndef fail():\n    raise RuntimeError('x')\n",
}


@pytest.fixture()
def pyc():
    spec = importlib.util.spec_from_file_location("dgxsim_pyc_under_test", NODE / "dgxsim_pyc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def payload(tmp_path: Path, name: str = "payload.zip") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        for member, text in SOURCES.items():
            z.writestr(member, text)
    return path


def run(cache: Path, zip_path: Path, code: str, install: bool = True) -> str:
    """``code`` in a fresh interpreter that imports from ``zip_path``."""
    setup = f"import sys; sys.path.insert(0, {str(NODE)!r})\n"
    if install:
        setup += f"import dgxsim_pyc; dgxsim_pyc.install({str(cache)!r})\n"
    setup += f"sys.path.insert(0, {str(zip_path)!r})\n"
    proc = subprocess.run(
        [sys.executable, "-I", "-B", "-c", setup + code], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def test_the_first_import_fills_the_cache_and_the_next_one_reads_it(pyc, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    zip_path = payload(tmp_path)
    assert run(cache, zip_path, "import pkg; print(pkg.answer())") == "42"
    entries = sorted(p.name for p in cache.iterdir())
    wanted = sorted(Path(pyc.entry(str(cache), s.encode())).name for s in SOURCES.values())
    assert entries == wanted

    # The next interpreter takes the cached code, not the zip's source: a cache entry that
    # says otherwise wins.
    util = Path(pyc.entry(str(cache), SOURCES["pkg/util.py"].encode()))
    util.write_bytes(marshal.dumps(compile("def answer():\n    return 7\n", "x", "exec")))
    assert run(cache, zip_path, "import pkg; print(pkg.answer())") == "7"
    assert run(cache, zip_path, "import pkg; print(pkg.answer())", install=False) == "42"


def test_cached_code_names_the_file_it_was_imported_from_now(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = payload(tmp_path, "first.zip"), payload(tmp_path, "second.zip")
    show = (
        "import traceback, pkg.util\n"
        "try:\n    pkg.util.fail()\n"
        "except RuntimeError as e:\n    print(traceback.extract_tb(e.__traceback__)[-1].filename)"
    )
    assert run(cache, first, show) == str(first / "pkg" / "util.py")
    assert run(cache, second, show) == str(second / "pkg" / "util.py")


@pytest.mark.parametrize("damage", [b"", b"\x00torn", marshal.dumps("not code")])
def test_a_damaged_entry_is_compiled_again_and_replaced(pyc, tmp_path, damage):
    cache = tmp_path / "cache"
    cache.mkdir()
    util = Path(pyc.entry(str(cache), SOURCES["pkg/util.py"].encode()))
    util.write_bytes(damage)
    assert run(cache, payload(tmp_path), "import pkg; print(pkg.answer())") == "42"
    assert isinstance(marshal.loads(util.read_bytes()), type(compile("", "", "exec")))


def test_a_cache_it_cannot_write_leaves_the_import_as_it_was(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    assert run(missing, payload(tmp_path), "import pkg; print(pkg.answer())") == "42"
    assert not missing.exists()


def test_installing_twice_wraps_zipimport_once(pyc, tmp_path, monkeypatch):
    import zipimport

    original = zipimport._compile_source
    monkeypatch.setattr(zipimport, "_compile_source", original)
    pyc.install(str(tmp_path))
    pyc.install(str(tmp_path))
    assert zipimport._compile_source.uncached is original
