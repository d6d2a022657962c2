"""Tests for tools/vllm_sdist.py, offline: a local HTTP server plays the package index."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

VERSION = "9.9.9"
NAME = f"vllm-{VERSION}.tar.gz"
REGISTRY = '_VLLM_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM")}\n'


# --------------------------------------------------------------------------- pure parts


def test_parse_pip_config_and_precedence(vllm_sdist):
    config = vllm_sdist.parse_pip_config(
        "global.index-url='https://g.invalid/simple'\n"
        "global.cert='/some/ca.pem'\n"
        "install.index-url='https://i.invalid/simple'\n"
        "global.extra-index-url='file:///a file:///b'\n"
        "noise line\n"
    )
    assert config["global.cert"] == "/some/ca.pem"
    assert config["global.extra-index-url"] == "file:///a file:///b"
    assert vllm_sdist._from_config(config, "index-url") == "https://i.invalid/simple"
    config[":env:.index-url"] = "https://e.invalid/simple"
    assert vllm_sdist._from_config(config, "index-url") == "https://e.invalid/simple"
    assert vllm_sdist._from_config({}, "index-url") is None


def test_index_url_sources(vllm_sdist, monkeypatch):
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    config = {"global.index-url": "https://g.invalid/simple"}
    assert vllm_sdist.index_url(config) == "https://g.invalid/simple/"
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple/")
    assert vllm_sdist.index_url(config) == "https://env.invalid/simple/"


def test_index_url_defaults_to_pips_own(vllm_sdist, monkeypatch):
    index = pytest.importorskip("pip._internal.models.index")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert vllm_sdist.index_url({}) == index.PyPI.simple_url.rstrip("/") + "/"


def test_ssl_context_with_missing_ca_bundle(vllm_sdist, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "nope.pem"))
    with pytest.raises(vllm_sdist.SdistError, match="CA bundle"):
        vllm_sdist.ssl_context({})
    monkeypatch.delenv("PIP_CERT")
    with pytest.raises(vllm_sdist.SdistError, match="CA bundle"):
        vllm_sdist.ssl_context({"global.cert": str(tmp_path / "nope.pem")})
    assert vllm_sdist.ssl_context({}) is not None


def test_default_cache_dir(vllm_sdist, monkeypatch, tmp_path):
    monkeypatch.setenv("DGX_SPARK_CACHE", str(tmp_path))
    assert vllm_sdist.default_cache_dir() == tmp_path / "vllm-sdist"
    monkeypatch.delenv("DGX_SPARK_CACHE")
    assert vllm_sdist.default_cache_dir() == vllm_sdist.REPO_ROOT / ".cache" / "vllm-sdist"


def test_parse_index_json(vllm_sdist):
    body = json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "name": "vllm",
            "files": [
                {
                    "filename": NAME,
                    "url": "../../files/ab/vllm-9.9.9.tar.gz#sha256=ignored",
                    "hashes": {"sha256": "AB" * 32},
                },
                {"filename": "vllm-9.9.9-py3-none-any.whl", "url": "x.whl", "hashes": {}},
            ],
        }
    ).encode()
    page = "https://index.invalid/simple/vllm/"
    files = vllm_sdist.parse_index(body, "application/vnd.pypi.simple.v1+json", page)
    assert files[NAME]["url"] == "https://index.invalid/files/ab/vllm-9.9.9.tar.gz"
    assert vllm_sdist.pick_sdist(files, VERSION) == (
        NAME,
        "https://index.invalid/files/ab/vllm-9.9.9.tar.gz",
        "ab" * 32,
    )
    with pytest.raises(vllm_sdist.SdistError, match="no sha256"):
        vllm_sdist.pick_sdist({NAME: {"url": "u", "hashes": {"md5": "x"}}}, VERSION)
    with pytest.raises(vllm_sdist.SdistError, match="not on the index.*vllm-9.9.9.tar.gz"):
        vllm_sdist.pick_sdist(files, "9.10.0")


def test_parse_index_html(vllm_sdist):
    body = (
        b"<html><body><h1>Links for vllm</h1>"
        b'<a href="/p/vllm-9.9.9.tar.gz#sha256=' + b"cd" * 32 + b'">vllm-9.9.9.tar.gz</a><br/>'
        b'<a href="https://other.invalid/vllm-1.0.tar.gz">vllm-1.0.tar.gz</a>'
        b"</body></html>"
    )
    files = vllm_sdist.parse_index(body, "text/html", "https://index.invalid/simple/vllm/")
    assert vllm_sdist.pick_sdist(files, VERSION) == (
        NAME,
        "https://index.invalid/p/vllm-9.9.9.tar.gz",
        "cd" * 32,
    )
    with pytest.raises(vllm_sdist.SdistError, match="no sha256"):
        vllm_sdist.pick_sdist(files, "1.0")


def test_parse_index_bad_json(vllm_sdist):
    with pytest.raises(vllm_sdist.SdistError, match="not a PEP 691"):
        vllm_sdist.parse_index(b'{"nofiles": []}', "application/json", "https://x.invalid/")


@pytest.mark.parametrize("version", ["", "../1.0", "1.0/x", "1..0", " 1.0", "1.0\n"])
def test_bad_versions(vllm_sdist, version):
    with pytest.raises(vllm_sdist.SdistError, match="not a version"):
        vllm_sdist.sdist_name(version)


@pytest.mark.parametrize(
    ("name", "rel"),
    [
        ("vllm-1.0/vllm/__init__.py", "vllm/__init__.py"),
        ("./vllm-1.0/./vllm/x.py", "vllm/x.py"),
        ("vllm-1.0//vllm/x.py", "vllm/x.py"),
        ("vllm-1.0", None),
        ("vllm-1.0/", None),
        ("/vllm-1.0/vllm/x.py", None),
        ("vllm-1.0/../x.py", None),
        ("vllm-1.0/vllm/../../x.py", None),
        ("../vllm/x.py", None),
        ("vllm-1.0\\..\\x.py", None),
        ("C:/vllm/x.py", None),
        ("", None),
    ],
)
def test_member_relpath(vllm_sdist, name, rel):
    assert vllm_sdist.member_relpath(name) == rel


@pytest.mark.parametrize(
    ("name", "rel"),
    [
        ("vllm-1.0/vllm/__init__.py", "vllm/__init__.py"),
        ("vllm-1.0/vllm/py.typed", "vllm/py.typed"),
        ("vllm-1.0/vllm/__pycache__/x.pyc", None),
        ("vllm-1.0/csrc/x.cu", None),
        ("vllm-1.0/tests/test_x.py", None),
        ("vllm-1.0/vllm.egg-info/PKG-INFO", None),
        ("vllm-1.0/docs/vllm/x.md", None),
    ],
)
def test_package_relpath(vllm_sdist, name, rel):
    assert vllm_sdist.package_relpath(name) == rel


# --------------------------------------------------------------------------- archives


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def make_archive(version: str = VERSION) -> bytes:
    top = f"vllm-{version}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, f"{top}/", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, f"{top}/setup.py", b"raise SystemExit\n")
        _add(tar, f"{top}/csrc/kernel.cu", b"// cuda\n")
        _add(tar, f"{top}/tests/test_x.py", b"")
        _add(tar, f"{top}/vllm/", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, f"{top}/vllm/__init__.py", b"__version__ = '9.9.9'\n")
        _add(tar, f"{top}/vllm/py.typed", b"")
        _add(tar, f"{top}/vllm/entrypoints/cli.py", b"print()\n", mode=0o755)
        _add(tar, f"{top}/vllm/model_executor/models/registry.py", REGISTRY.encode())
        _add(tar, f"{top}/vllm/__pycache__/x.cpython-311.pyc", b"\0")
        _add(tar, f"{top}/vllm/link", type=tarfile.SYMTYPE, linkname="/outside/target")
        _add(tar, f"{top}/vllm/hard", type=tarfile.LNKTYPE, linkname=f"{top}/setup.py")
        _add(tar, f"{top}/vllm/fifo", type=tarfile.FIFOTYPE)
        _add(tar, f"{top}/vllm/../../escape.py", b"evil\n")
        _add(tar, "/abs/vllm/escape.py", b"evil\n")
    return buf.getvalue()


@pytest.fixture
def archive(tmp_path) -> Path:
    path = tmp_path / "src" / NAME
    path.parent.mkdir()
    path.write_bytes(make_archive())
    return path


def test_read_member(vllm_sdist, archive):
    assert vllm_sdist.read_member(archive, "vllm/model_executor/models/registry.py") == REGISTRY
    with pytest.raises(vllm_sdist.SdistError, match="no member"):
        vllm_sdist.read_member(archive, "vllm/nope.py")
    with pytest.raises(vllm_sdist.SdistError, match="no such archive"):
        vllm_sdist.read_member(archive.with_name("missing.tar.gz"), "vllm/__init__.py")


def test_read_member_broken_archive(vllm_sdist, tmp_path):
    broken = tmp_path / NAME
    broken.write_bytes(make_archive()[:200])
    with pytest.raises(vllm_sdist.SdistError, match="unreadable archive"):
        vllm_sdist.read_member(broken, "vllm/nope.py")


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir()}


def test_extract_package_only_the_package_and_safely(vllm_sdist, archive, tmp_path):
    dest = tmp_path / "out" / "site"
    target = vllm_sdist.extract_package(archive, dest)
    assert target == dest / "vllm"
    assert _tree(dest) == {
        "vllm/__init__.py",
        "vllm/py.typed",
        "vllm/entrypoints/cli.py",
        "vllm/model_executor/models/registry.py",
    }
    assert os.access(dest / "vllm/entrypoints/cli.py", os.X_OK)
    assert not os.access(dest / "vllm/__init__.py", os.X_OK)
    assert not list(tmp_path.rglob("escape.py"))
    with pytest.raises(vllm_sdist.SdistError, match="already exists"):
        vllm_sdist.extract_package(archive, dest)
    (dest / "vllm" / "stale.py").write_text("")
    vllm_sdist.extract_package(archive, dest, replace=True)
    assert "vllm/stale.py" not in _tree(dest)
    assert not [p for p in dest.iterdir() if p.name != "vllm"]  # no staging left


def test_extract_package_without_package(vllm_sdist, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, "vllm-1.0/setup.py", b"")
    path = tmp_path / "vllm-1.0.tar.gz"
    path.write_bytes(buf.getvalue())
    with pytest.raises(vllm_sdist.SdistError, match="no vllm/__init__.py"):
        vllm_sdist.extract_package(path, tmp_path / "dest")
    assert list((tmp_path / "dest").iterdir()) == []


# --------------------------------------------------------------------------- fetching


class FakeIndex:
    """A PEP 691 / PEP 503 index on 127.0.0.1 serving one archive."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.sha256 = hashlib.sha256(payload).hexdigest()
        self.html = False
        self.down = False
        self.requests: list[tuple[str, str]] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                index.requests.append((self.path, self.headers.get("Accept", "")))
                if index.down:
                    return self.send_error(503)
                if self.path == "/simple/vllm/":
                    return self._page()
                if self.path == f"/files/{NAME}":
                    return self._send(index.payload, "application/octet-stream")
                return self.send_error(404)

            def _page(self):
                if index.html:
                    body = (
                        f'<a href="../../files/{NAME}#sha256={index.sha256}">{NAME}</a>'
                    ).encode()
                    return self._send(body, "text/html")
                accept = self.headers.get("Accept", "")
                assert "application/vnd.pypi.simple.v1+json" in accept
                files = [
                    {
                        "filename": NAME,
                        "url": f"../../files/{NAME}",
                        "hashes": {"sha256": index.sha256},
                    }
                ]
                body = json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()
                return self._send(body, "application/vnd.pypi.simple.v1+json")

            def _send(self, body: bytes, ctype: str):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def downloads(self) -> int:
        return sum(1 for path, _accept in self.requests if path.startswith("/files/"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(vllm_sdist, monkeypatch):
    fake = FakeIndex(make_archive())
    monkeypatch.setenv("PIP_INDEX_URL", fake.url)
    monkeypatch.delenv("PIP_CERT", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(vllm_sdist, "_pip_config", dict)
    yield fake
    fake.close()


def test_fetch_downloads_verifies_and_caches(vllm_sdist, index, tmp_path):
    cache = tmp_path / "cache"
    path = vllm_sdist.fetch_sdist(VERSION, cache)
    assert path == cache / NAME
    assert path.read_bytes() == index.payload
    assert (cache / f"{NAME}.sha256").read_text().split()[0] == index.sha256
    assert path.stat().st_mode & 0o777 == 0o644
    assert index.downloads() == 1
    assert sorted(p.name for p in cache.iterdir()) == [NAME, f"{NAME}.sha256"]

    index.down = True  # a verified cached archive needs no network at all
    before = len(index.requests)
    assert vllm_sdist.fetch_sdist(VERSION, cache) == path
    assert len(index.requests) == before


def test_fetch_uses_the_cache_dir_from_the_environment(vllm_sdist, index, tmp_path, monkeypatch):
    monkeypatch.setenv("DGX_SPARK_CACHE", str(tmp_path / "shared"))
    path = vllm_sdist.fetch_sdist(VERSION)
    assert path == tmp_path / "shared" / "vllm-sdist" / NAME


def test_fetch_replaces_a_corrupted_cache(vllm_sdist, index, tmp_path):
    path = vllm_sdist.fetch_sdist(VERSION, tmp_path)
    path.write_bytes(b"garbage")
    assert vllm_sdist.fetch_sdist(VERSION, tmp_path).read_bytes() == index.payload
    assert index.downloads() == 2


def test_fetch_adopts_a_matching_file_without_sidecar(vllm_sdist, index, tmp_path):
    (tmp_path / NAME).write_bytes(index.payload)
    assert vllm_sdist.fetch_sdist(VERSION, tmp_path) == tmp_path / NAME
    assert index.downloads() == 0
    assert (tmp_path / f"{NAME}.sha256").is_file()


def test_fetch_hash_mismatch_leaves_nothing(vllm_sdist, index, tmp_path):
    index.payload = index.payload + b"tampered"  # the index still lists the old sha256
    with pytest.raises(vllm_sdist.SdistError, match="sha256 mismatch"):
        vllm_sdist.fetch_sdist(VERSION, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fetch_html_index(vllm_sdist, index, tmp_path):
    index.html = True
    assert vllm_sdist.fetch_sdist(VERSION, tmp_path).read_bytes() == index.payload


def test_fetch_errors(vllm_sdist, index, tmp_path):
    with pytest.raises(vllm_sdist.SdistError, match="vllm-9.9.8.tar.gz is not on the index"):
        vllm_sdist.fetch_sdist("9.9.8", tmp_path)
    index.down = True
    with pytest.raises(vllm_sdist.SdistError, match="HTTP 503"):
        vllm_sdist.fetch_sdist(VERSION, tmp_path)


def test_fetch_unreachable(vllm_sdist, index, tmp_path, monkeypatch):
    index.close()
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    with pytest.raises(vllm_sdist.SdistError, match="cannot connect"):
        vllm_sdist.fetch_sdist(VERSION, tmp_path)


def test_cli(vllm_sdist, index, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert vllm_sdist.main(["fetch", VERSION, "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / NAME)

    dest = tmp_path / "dest"
    assert vllm_sdist.main(["extract", VERSION, str(dest), "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert (dest / "vllm" / "__init__.py").is_file()

    assert vllm_sdist.main(["extract", VERSION, str(dest), "--cache-dir", str(cache)]) == 1
    assert "already exists" in capsys.readouterr().err

    assert vllm_sdist.main(["fetch", "9.9.8", "--cache-dir", str(cache)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vllm_sdist: error: ") and "not on the index" in err
